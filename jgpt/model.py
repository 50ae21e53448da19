"""The forward pass: a pure function of weights, architecture and token ids.

`forward` embeds the tokens, scans one decoder block over the layer axis of the
stacked weights (carrying the K/V buffers, which each layer writes into), normalizes,
and projects to logits. It is jit-compatible with the architecture as a static
argument:

    step = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"), donate_argnames=("cache",))

Donating the cache lets XLA write the new keys and values into it in place; without
donation every call copies the whole buffer first.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jgpt.architecture import Architecture
from jgpt.operations import (
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
from jgpt.weights import ModelWeights


@struct.dataclass
class KVBuffers:
    """Keys and values by layer, row, head and slot (slot = absolute position): [layers, B, kv_heads, S, head_dim].

    Head-major, so that every head's keys and values are one [S, head_dim] matrix that
    attention's products read as stored. With the heads inside the channels
    ([layers, B, S, kv_width]) XLA on CPU copied every layer's keys and values into
    that order at every decode step.
    """

    keys: jax.Array
    values: jax.Array

    @classmethod
    def empty(cls, architecture: Architecture, batch: int, slots: int) -> KVBuffers:
        """Zeroed buffers in the architecture's compute dtype, for `slots` positions per row."""
        a = architecture
        shape = (a.layers, batch, a.kv_heads, slots, a.head_dim)
        dtype = jnp.dtype(a.precision)
        # Two distinct buffers, so that a jitted step may donate both.
        return cls(keys=jnp.zeros(shape, dtype), values=jnp.zeros(shape, dtype))


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


def forward(
    weights: ModelWeights,
    architecture: Architecture,
    token_ids: jax.Array,
    *,
    positions: jax.Array | None = None,
    cache: KVBuffers | None = None,
    observe: bool = False,
    unroll: int | bool = 1,
    layer_weights: tuple[dict[str, jax.Array], ...] | None = None,
) -> ForwardOutput:
    """Logits for token_ids [B, T] at absolute positions [B, T] (default 0..T-1 in every row).

    With `cache` (buffers [layers, B, kv_heads, S, head_dim], slot = absolute position) the new
    keys and values are written into their slots and every query attends causally to
    slots <= its position; the returned cache holds the write. Without one the block
    attends among the given tokens only and returns their keys and values (S = T).
    `layer_weights` (from `split_layers(weights)`) runs the blocks over those per-layer
    arrays instead of scanning the stacked block tensors of `weights`; same result.
    """
    a = architecture
    chex.assert_rank(token_ids, 2)
    chex.assert_type(token_ids, jnp.int32)
    B, T = token_ids.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    chex.assert_shape(positions, (B, T))
    chex.assert_type(positions, jnp.int32)
    dtype = jnp.dtype(a.precision)
    if cache is not None:
        chex.assert_equal_shape([cache.keys, cache.values])
        chex.assert_shape(cache.keys, (a.layers, B, a.kv_heads, None, a.head_dim))

    position_vectors = learned_positions(weights.position_embedding, positions) if a.position == "learned" else None
    x = embedding(weights.token_embedding, token_ids, position_vectors)  # [B, T, C]
    # With a cache every slot is visible up to its own position; without one, the
    # given tokens are the keys, at their own positions.
    key_positions = positions if cache is None else jnp.arange(cache.keys.shape[3])[None, :]

    def block(carry, layer):
        h, buffers = carry
        w, index = layer
        h1 = normalization(h, w["ln1_scale"], w.get("ln1_bias"), a)
        q, k, v = query_key_value(h1, w, positions, a, dtype)
        if buffers is None:
            keys, values, new = k, v, (k, v)
        else:
            buffers = KVBuffers(write_slots(buffers.keys, index, k, positions), write_slots(buffers.values, index, v, positions))
            keys, values, new = buffers.keys[index], buffers.values[index], None
        mixed, attention_weights = attention(q, keys, values, positions, key_positions, w, a, dtype)
        h2 = residual_addition(h, mixed)
        h3 = normalization(h2, w["ln2_scale"], w.get("ln2_bias"), a)
        ff = feed_forward(h3, w, a, dtype)
        out = residual_addition(h2, ff)
        stages = None
        if observe:
            by_stage = dict(ln1=h1, attention=mixed, residual1=h2, ln2=h3, feed_forward=ff, residual2=out)
            stages = {name: t.reshape(B, T, -1) for name, t in by_stage.items()}
            stages |= {"query": q, "key": k.transpose(0, 2, 1, 3), "attention_weights": attention_weights}
        return (out, buffers), (new, stages)

    if layer_weights is None:
        layers = (weights.block(), jnp.arange(a.layers))
        (h, cache), (new, stages) = jax.lax.scan(block, (x.reshape(B * T, a.width), cache), layers, unroll=unroll)
    else:
        # The blocks as straight-line code over separately stored layers: no step slices a layer out of a
        # stacked tensor, which on XLA CPU copies that layer's weights at every decode step.
        carry, outputs = (x.reshape(B * T, a.width), cache), []
        for index, w in enumerate(layer_weights):
            carry, output = block(carry, (w, index))
            outputs.append(output)
        (h, cache), (new, stages) = carry, jax.tree.map(lambda *per_layer: jnp.stack(per_layer), *outputs)
    if new is not None:
        cache = KVBuffers(keys=new[0], values=new[1])
    h = normalization(h, weights.ln_final_scale, weights.ln_final_bias, a)
    logits = output_projection(h, weights.lm_head, weights.lm_bias, dtype).reshape(B, T, a.vocabulary)
    chex.assert_type(logits, jnp.float32)

    observations = None
    if observe:
        records = [Observation("Embedding", "embedding", None, x)]
        if position_vectors is not None:
            records.insert(0, Observation("PositionEncoding", "position_embedding", None, position_vectors))
        for layer in range(a.layers):
            for name, op in BLOCK_STAGES.items():
                op = "Attention" if name in ("query", "key") and a.position != "rope" else op
                records.append(Observation(op, name, layer, stages[name][layer]))
        records += [
            Observation("Normalization", "ln_final", None, h.reshape(B, T, a.width)),
            Observation("OutputProjection", "logits", None, logits),
        ]
        observations = Observations(positions=positions, records=tuple(records))
    return ForwardOutput(logits=logits, cache=cache, observations=observations)


def split_layers(weights: ModelWeights) -> tuple[dict[str, jax.Array], ...]:
    """The block tensors as separate arrays, one dict per layer, for `forward(layer_weights=...)`.

    Call it once, outside jit: it copies the block weights into per-layer buffers.
    """
    block = weights.block()
    layers = next(iter(block.values())).shape[0]
    return tuple({name: tensor[i] for name, tensor in block.items()} for i in range(layers))
