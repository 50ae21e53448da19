"""The forward pass: a pure function of weights, architecture and token ids, in the walkthrough's steps.

    forward = embed -> block x layers -> head
    block   = attention_sublayer -> feed_forward_sublayer   (each added to the residual stream)

Each step is a top-level function that runs under a `jax.named_scope` of its name
("embed", "block", "attention", "feed_forward", "head"), so the lowered program and a
profile name every operation by the step it belongs to. The blocks run as a
`lax.scan` over the layer axis of the stacked weights, or as straight-line code over
per-layer arrays (`layer_weights`; `jgpt.model.layer_strategy` chooses). The K/V buffers
ride along, and each layer writes into them. `forward` is jit-compatible with the
architecture as a static argument:

    step = jax.jit(forward, static_argnames=("architecture", "observe", "unroll", "kernels"),
                   donate_argnames=("cache",))

Donating the cache lets XLA write the new keys and values into it in place; without
donation every call copies the whole buffer first.

This module and `jgpt.model.operations` are the whole reference computation. `kernels` (a
`KernelCalls`, default `REFERENCE`: none) is where a kernel plan (`jgpt.kernels.plan.Kernels`,
chosen once where a run is configured) plugs its callables in; neither module imports a kernel.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jgpt.foundation.errors import ApiError
from jgpt.model import pytree as struct
from jgpt.model.architecture import Architecture
from jgpt.model.kv_state import KVBuffers
from jgpt.model.layer_strategy import LayerView, LayerWeights
from jgpt.model.operations import (
    REFERENCE,
    KernelCalls,
    attention,
    embedding,
    feed_forward,
    learned_positions,
    normalization,
    output_projection,
    query_key_value,
    residual_addition,
    write_slots,
)
from jgpt.model.weights import ModelWeights


@struct.dataclass
class Observation:
    """One operation's output tensor in one forward pass; `layer` is None outside the blocks."""

    operation: str = struct.field(pytree_node=False)  # ontology concept, e.g. "Normalization"
    stage: str = struct.field(pytree_node=False)  # which instance, e.g. "ln1"
    layer: int | None = struct.field(pytree_node=False)
    value: jax.Array  # [B, T, ...]


@struct.dataclass
class Observations:
    positions: jax.Array  # [B, T] absolute positions of the observed tokens
    records: tuple[Observation, ...]


@struct.dataclass
class ForwardOutput:
    logits: jax.Array  # [B, T, V] float32
    cache: KVBuffers
    observations: Observations | None


# Per-block stages in execution order: stage -> ontology operation. Queries and keys
# are observed after position encoding, which for rotary positions acts on them.
BLOCK_STAGES = {
    "ln1": "Normalization",
    "query": "PositionEncoding",
    "key": "PositionEncoding",
    "attention_weights": "Attention",
    "attention": "Attention",
    "residual1": "ResidualAddition",
    "ln2": "Normalization",
    "feed_forward": "FeedForward",
    "residual2": "ResidualAddition",
}


class TokenPositions(NamedTuple):
    """Where the tokens of one pass sit: what every block reads besides its weights and the stream."""

    positions: jax.Array  # [B, T] absolute positions of the queries
    key_positions: jax.Array  # [B or 1, S] absolute positions of the keys attended over


def forward(
    weights: ModelWeights,
    architecture: Architecture,
    token_ids: jax.Array,
    *,
    positions: jax.Array | None = None,
    cache: KVBuffers | None = None,
    observe: bool = False,
    unroll: int | bool = 1,
    layer_weights: LayerView | None = None,
    logits_at: jax.Array | None = None,
    kernels: KernelCalls = REFERENCE,
) -> ForwardOutput:
    """Logits for token_ids [B, T] at absolute positions [B, T] (default 0..T-1 in every row).

    With `cache` (buffers [layers, B, kv_heads, S, head_dim], slot = absolute position) the new
    keys and values are written into their slots and every query attends causally to
    slots <= its position; the returned cache holds the write. Without one the block
    attends among the given tokens only and returns their keys and values (S = T).
    `layer_weights` (`LayerStrategy.layer_weights(weights)`) runs the blocks over its per-layer
    arrays instead of scanning the stacked block tensors of `weights` (with `unroll`); same result.
    Any projection of `weights` may be held as an OutputMajor (`LayerStrategy.held_weights`).
    `logits_at` [B] (one index into T per row) projects only those tokens to the vocabulary:
    logits [B, 1, V], what a prefill selects from, for 1/T of the head's products.
    `kernels` replaces the steps it gives callables for (the products, the attention, a decode step's
    blocks: `KernelCalls`); each replaced step computes the same function, rounding differently.
    """
    a = architecture
    chex.assert_rank(token_ids, 2)
    chex.assert_type(token_ids, jnp.int32)
    B, T = token_ids.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    chex.assert_shape(positions, (B, T))
    chex.assert_type(positions, jnp.int32)
    if observe and logits_at is not None:
        raise ApiError("logits_at", "observing a pass records every position's logits")
    if cache is not None:
        chex.assert_equal_shape([cache.keys, cache.values])
        chex.assert_shape(cache.keys, (a.layers, B, a.kv_heads, None, a.head_dim))

    x, position_vectors = embed(weights, a, token_ids, positions)
    # With a cache every slot is visible up to its own position; without one, the
    # given tokens are the keys, at their own positions.
    key_positions = positions if cache is None else jnp.arange(cache.keys.shape[3])[None, :]
    tokens = TokenPositions(positions, key_positions)
    run = functools.partial(block, architecture=a, tokens=tokens, observe=observe, kernels=kernels)
    carry = (x.reshape(B * T, a.width), cache)
    layers = None if layer_weights is None else layer_weights.layers
    fused = None
    if kernels.decode_blocks is not None and cache is not None and not observe:
        fused = kernels.decode_blocks(carry[0], positions, cache.keys, cache.values, layers, a)
    if fused is not None:  # the kernel took this pass: every block in one call
        h, keys, values = fused
        cache, new, stages = KVBuffers(keys=keys, values=values), None, None
    elif layer_weights is None:
        (h, cache), (new, stages) = _scanned(run, carry, weights.block(), a.layers, unroll)
    else:
        (h, cache), (new, stages) = _straight_line(run, carry, layer_weights.layers)
    if new is not None:
        cache = KVBuffers(keys=new[0], values=new[1])
    h, logits = head(weights, a, h if logits_at is None else _rows_at(h.reshape(B, T, a.width), logits_at), kernels)
    logits = logits.reshape(B, -1, a.vocabulary)
    chex.assert_type(logits, jnp.float32)
    observations = None
    if observe:
        observations = _observations(a, positions, x, position_vectors, stages, h.reshape(B, T, a.width), logits)
    return ForwardOutput(logits=logits, cache=cache, observations=observations)


def embed(
    weights: ModelWeights, architecture: Architecture, token_ids: jax.Array, positions: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """The residual stream's start: token vectors [B, T, C] (plus learned position vectors, also returned)."""
    with jax.named_scope("embed"):
        if architecture.position != "learned":
            return embedding(weights.token_embedding, token_ids, None), None
        if weights.position_embedding is None:
            raise ApiError("weights.position_embedding", "learned positions need the position embedding")
        position_vectors = learned_positions(weights.position_embedding, positions)
        return embedding(weights.token_embedding, token_ids, position_vectors), position_vectors


def block(carry, layer, *, architecture: Architecture, tokens: TokenPositions, observe: bool, kernels: KernelCalls):
    """One decoder block, as a scan step: ((stream [N, C], buffers), (weights, index)) -> (carry, outputs).

    The outputs are this layer's new (keys, values) when there is no cache to write them
    into (else None), and its observed stages when `observe` (else None).
    """
    stream, buffers = carry
    w, index = layer
    with jax.named_scope("block"):
        stream, buffers, new, attended = attention_sublayer(stream, buffers, w, index, architecture, tokens, kernels)
        stream, fed = feed_forward_sublayer(stream, w, architecture, kernels)
    return (stream, buffers), (new, _observed_stages(attended | fed, tokens.positions.shape) if observe else None)


def attention_sublayer(
    stream,
    buffers: KVBuffers | None,
    w,
    index,
    architecture: Architecture,
    tokens: TokenPositions,
    kernels: KernelCalls,
):
    """Normalize, attend causally (writing this layer's keys and values into `buffers`, if any) and add.

    Returns (stream, buffers, new keys and values or None, the stages' tensors by stage name).
    """
    a = architecture
    dtype = jnp.dtype(a.precision)
    with jax.named_scope("attention"):
        h1 = normalization(stream, w["ln1_scale"], w.get("ln1_bias"), a)
        q, k, v = query_key_value(h1, w, tokens.positions, a, dtype, kernels)
        if buffers is None:
            keys, values, new = k, v, (k, v)
        else:
            slots = tokens.positions
            buffers = KVBuffers(
                write_slots(buffers.keys, index, k, slots), write_slots(buffers.values, index, v, slots)
            )
            keys, values, new = buffers.keys[index], buffers.values[index], None
        mixed, attention_weights = attention(
            q, keys, values, tokens.positions, tokens.key_positions, w, a, dtype, kernels
        )
        out = residual_addition(stream, mixed)
    stages = {
        "ln1": h1,
        "query": q,
        "key": k,
        "attention_weights": attention_weights,
        "attention": mixed,
        "residual1": out,
    }
    return out, buffers, new, stages


def feed_forward_sublayer(stream, w, architecture: Architecture, kernels: KernelCalls):
    """Normalize, apply the position-wise feed-forward network and add: (stream, the stages' tensors)."""
    a = architecture
    with jax.named_scope("feed_forward"):
        h3 = normalization(stream, w["ln2_scale"], w.get("ln2_bias"), a)
        ff = feed_forward(h3, w, a, jnp.dtype(a.precision), kernels)
        out = residual_addition(stream, ff)
    return out, {"ln2": h3, "feed_forward": ff, "residual2": out}


def head(
    weights: ModelWeights, architecture: Architecture, stream: jax.Array, kernels: KernelCalls
) -> tuple[jax.Array, jax.Array]:
    """The final normalization and the projection to vocabulary scores: (normalized [N, C], logits [N, V] float32)."""
    with jax.named_scope("head"):
        h = normalization(stream, weights.ln_final_scale, weights.ln_final_bias, architecture)
        dtype = jnp.dtype(architecture.precision)
        return h, output_projection(h, weights.lm_head, weights.lm_bias, dtype, kernels)


def _rows_at(stream: jax.Array, index: jax.Array) -> jax.Array:
    """Row b's token `index[b]` of a stream [B, T, C]: [B, C]."""
    return jnp.take_along_axis(stream, index[:, None, None], axis=1)[:, 0]


def _scanned(run, carry, stacked: dict[str, jax.Array], layers: int, unroll: int | bool):
    """The blocks as one scan over the stacked tensors' layer axis."""
    return jax.lax.scan(run, carry, (stacked, jnp.arange(layers)), unroll=unroll)


def _straight_line(run, carry, layer_weights: tuple[LayerWeights, ...]):
    """The blocks one after another over separately stored layers: no step slices a layer out of a stacked
    tensor, which on XLA CPU copies that layer's weights at every call. Outputs stacked as a scan's."""
    outputs = []
    for index, w in enumerate(layer_weights):
        carry, output = run(carry, (w, index))
        outputs.append(output)
    return carry, jax.tree.map(lambda *per_layer: jnp.stack(per_layer), *outputs)


def _observed_stages(tensors: dict[str, jax.Array], shape: tuple[int, ...]) -> dict[str, jax.Array]:
    """A block's stage tensors as observed: [B, T, ...], keys by position rather than head-major."""
    B, T = shape
    heads_inside = ("query", "key", "attention_weights")
    stages = {name: t.reshape(B, T, -1) for name, t in tensors.items() if name not in heads_inside}
    return stages | {"query": tensors["query"], "key": tensors["key"].transpose(0, 2, 1, 3),
                     "attention_weights": tensors["attention_weights"]}  # fmt: skip


def _observations(a: Architecture, positions, x, position_vectors, stages, final, logits) -> Observations:
    records = [Observation("Embedding", "embedding", None, x)]
    if position_vectors is not None:
        records.insert(0, Observation("PositionEncoding", "position_embedding", None, position_vectors))
    for layer in range(a.layers):
        for name, op in BLOCK_STAGES.items():
            op = "Attention" if name in ("query", "key") and a.position != "rope" else op
            records.append(Observation(op, name, layer, stages[name][layer]))
    records += [
        Observation("Normalization", "ln_final", None, final),
        Observation("OutputProjection", "logits", None, logits),
    ]
    return Observations(positions=positions, records=tuple(records))
