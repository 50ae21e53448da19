"""The model operations, one small pure function each.

Embedding, PositionEncoding, Normalization, Attention, ResidualAddition, FeedForward
and OutputProjection are the spec's operation identities; `model.forward` composes
them. Token activations stay two-dimensional, `[N, C]` with N = B*T, around dense
projections (one large matmul per projection is what XLA on CPU runs fastest);
attention alone reshapes to heads, and keys and values are head-major `[B, K, T, D]`
like the cache they are written into.

Precision: `dtype` is the compute dtype of the dense products' operands. Products
accumulate in float32 and the residual stream, normalization statistics, attention
(its scores, softmax and value mix: `jgpt.model.bf16_matmul.attention_dtype`) and logits
stay float32, so bfloat16 changes operand rounding only. Operands are formed by
`jgpt.model.bf16_matmul.operand`: real bf16 where the backend has bf16 matrix units,
bf16-rounded float32 on a CPU (the same products, at float32 speed).

Kernels: every function here is the reference computation. The dense products and the attention
take a `KernelCalls` (default `REFERENCE`, nothing replaced), whose callables a kernel plan
(`jgpt.kernels.plan.Kernels`) fills; this module imports no kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import Architecture, LlamaArchitecture
from jgpt.model.bf16_matmul import attention_dtype, operand
from jgpt.model.output_major import OutputMajor

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KernelCalls:
    """The kernels a plan plugs into these operations (`jgpt.kernels.plan.Kernels.calls()`), each replacing one
    reference step written here; None keeps the reference. Hashable: `jgpt.model.transformer.forward` takes it as a
    jit-static argument, so what a program computes is fixed when it is traced.

    Each callable computes the same function as the step it replaces, rounding differently (the sums run in
    another order); tests/test_kernel_plan.py holds every one against the reference.
    """

    # x [N, I] @ w [I, O] -> [N, O] float32 for a stored projection, differentiable (`dense`).
    product: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    # x [1, I] float32 @ matrix [O, I]^T -> [1, O] float32 for an output-major projection (`dense`).
    one_row: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    # Attention over a pass's own tokens (no cache) by blocks of this many query rows, each skipping the keys
    # wholly after its last token instead of computing and masking them (`attention`). The caller promises
    # what a train step's forward guarantees: within each row positions increase.
    causal_rows: int | None = None
    # Those blocks by a kernel: (q [B, T, H, D], k, v [B, T, K, D], rows) -> [B, T, H, D] float32, never
    # storing the [T, T] weights; needs `causal_rows`.
    causal_attention: Callable[[jax.Array, jax.Array, jax.Array, int], jax.Array] | None = None
    # Every block of one decode step in one call: (stream [N, C], positions [B, T], keys, values, per-layer
    # weights or None, architecture) -> (stream, keys, values), or None where the kernel's static rule does not
    # take this pass (`jgpt.model.transformer.forward` then runs the blocks).
    decode_blocks: Callable[..., tuple[jax.Array, jax.Array, jax.Array] | None] | None = None

    def __post_init__(self) -> None:
        rows = self.causal_rows
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
            raise ApiError("causal_rows", f"must be a positive integer, got {rows!r}")
        if self.causal_attention is not None and rows is None:
            raise ApiError("causal_attention", "computes blocks of causal_rows query rows: give causal_rows")


# The pure-JAX reference: no kernel replaces any step.
REFERENCE = KernelCalls()


def _matmul_precision(operand_dtype) -> jax.lax.Precision | None:
    """Full float32 products for float32 operands (GPUs and TPUs otherwise round them)."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(operand_dtype) == F32 else None


def dense(
    x: jax.Array, w: jax.Array | OutputMajor, b: jax.Array | None, dtype, kernels: KernelCalls = REFERENCE
) -> jax.Array:
    """[N, I] @ [I, O] (+ [O]) -> [N, O] float32, with operands in `dtype`; `w` stored [I, O] or OutputMajor.
    A stored matrix by `kernels.product`, one float32 row of an output-major one by `kernels.one_row`, where given."""
    x, w = operand(x, dtype), operand(w, dtype)
    precision = _matmul_precision(x.dtype)
    if isinstance(w, OutputMajor):
        one_row = x.shape[0] == 1 and x.dtype == w.dtype == F32 and w.ndim == 2
        y = kernels.one_row(x, w.matrix) if one_row and kernels.one_row else w.product(x, precision)
    elif kernels.product is not None:
        y = kernels.product(x, w)
    else:
        y = jnp.dot(x, w, precision=precision, preferred_element_type=F32)
    return y if b is None else y + b


def embedding(token_embedding: jax.Array, token_ids: jax.Array, position_vectors: jax.Array | None) -> jax.Array:
    """Token vectors plus the declared positional vectors, if any: [B, T] -> [B, T, C]."""
    x = jnp.take(token_embedding, token_ids, axis=0)
    return x if position_vectors is None else x + position_vectors


def learned_positions(position_embedding: jax.Array, positions: jax.Array) -> jax.Array:
    """PositionEncoding of the GPT baseline: one learned vector per absolute position. [B, T] -> [B, T, C]."""
    return jnp.take(position_embedding, positions, axis=0)


def rotary_positions(x: jax.Array, positions: jax.Array, architecture: LlamaArchitecture) -> jax.Array:
    """PositionEncoding of Llama: rotate channel pairs (i, i + D/2) by position * inverse_frequency[i].

    x: [B, T, heads, D]; positions: [B, T] absolute. The half-split pairing is the
    convention of Llama checkpoints in Hugging Face format.
    """
    angles = rotary_angles(positions, x.shape[-1], architecture)  # [B, T, D/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, :, None, :]
    x = x.astype(F32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def rotary_angles(positions: jax.Array, d: int, architecture: LlamaArchitecture) -> jax.Array:
    """The angles [..., D/2] rotary positions turn channel pair i by at each position: position * inverse_frequency[i],
    the frequencies theta^(-2i/D), scaled where the architecture declares `rope_scaling`."""
    return positions.astype(F32)[..., None] * rotary_inverse_frequencies(d, architecture)


def rotary_inverse_frequencies(d: int, architecture: LlamaArchitecture) -> jax.Array:
    """[D/2] theta^(-2i/D), or with `rope_scaling` Llama 3.1's scaled ones: a frequency of wavelength above
    original_context / low_freq_factor divided by factor, one below original_context / high_freq_factor kept, and
    between them (1 - s) * f / factor + s * f with s = (original_context / wavelength - low) / (high - low)."""
    inverse_frequency = architecture.rope_theta ** -(jnp.arange(0, d, 2, dtype=F32) / d)  # [D/2]
    scaling = architecture.rope_scaling
    if scaling is None:
        return inverse_frequency
    wavelength = 2 * math.pi / inverse_frequency
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    smooth = (scaling.original_context / wavelength - low) / (high - low)
    interpolated = (1 - smooth) * inverse_frequency / scaling.factor + smooth * inverse_frequency
    long = wavelength > scaling.original_context / low
    short = wavelength < scaling.original_context / high
    return jnp.where(long, inverse_frequency / scaling.factor, jnp.where(short, inverse_frequency, interpolated))


def normalization(x: jax.Array, scale: jax.Array, bias: jax.Array | None, architecture: Architecture) -> jax.Array:
    """LayerNorm (mean and variance, scale and bias) or RMSNorm (root mean square, scale), in float32."""
    x = x.astype(F32)
    if architecture.normalization == "layernorm":
        x = x - jnp.mean(x, axis=-1, keepdims=True)
    x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + architecture.epsilon)
    x = x * scale
    return x if bias is None else x + bias


def residual_addition(residual: jax.Array, branch: jax.Array) -> jax.Array:
    return residual + branch


def feed_forward(
    x: jax.Array, w: dict[str, jax.Array], architecture: Architecture, dtype, kernels: KernelCalls = REFERENCE
) -> jax.Array:
    """[N, C] -> [N, C]: GELU MLP (GPT) or SwiGLU (Llama)."""
    up = dense(x, w["ff_up"], w.get("ff_up_bias"), dtype, kernels)  # [N, F]
    if architecture.activation == "swiglu":
        hidden = jax.nn.silu(dense(x, w["ff_gate"], None, dtype, kernels)) * up
    else:
        hidden = jax.nn.gelu(up, approximate=architecture.activation == "gelu_tanh")
    return dense(hidden, w["ff_down"], w.get("ff_down_bias"), dtype, kernels)


def query_key_value(
    x: jax.Array,
    w: dict[str, jax.Array],
    positions: jax.Array,
    architecture: Architecture,
    dtype,
    kernels: KernelCalls = REFERENCE,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Project [N, C] to queries [B, T, H, D] and head-major keys and values [B, K, T, D] (float32: attention's
    operands, rounded only where a bf16 KV state stores them).

    Rotary positions, where declared, rotate the queries and keys here.
    """
    a = architecture
    B, T = positions.shape
    H, K, D = a.heads, a.kv_heads, a.head_dim
    q = dense(x, w["query"], w.get("query_bias"), dtype, kernels).reshape(B, T, H, D)
    k = dense(x, w["key"], w.get("key_bias"), dtype, kernels).reshape(B, T, K, D)
    v = dense(x, w["value"], w.get("value_bias"), dtype, kernels).reshape(B, T, K, D)
    if isinstance(a, LlamaArchitecture):  # the alternative whose position is "rope"
        q = rotary_positions(q, positions, a)
        k = rotary_positions(k, positions, a)
    head_major = lambda t: t.transpose(0, 2, 1, 3)
    return q, head_major(k), head_major(v)


def write_slots(buffer: jax.Array, layer: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
    """buffer[layer, b, :, slots[b, t]] = new[b, :, t]; slots past the buffer are dropped.

    buffer: [L, B, K, S, D]; new: [B, K, T, D]; slots: [B, T]. A scatter into the whole
    stacked buffer, which XLA performs in place when the buffer is donated.
    """
    B, K, T, _ = new.shape
    rows = jnp.arange(B)[:, None, None]  # [B, 1, 1]
    heads = jnp.arange(K)[None, :, None]  # [1, K, 1]
    return buffer.at[layer, rows, heads, slots[:, None, :]].set(new.astype(buffer.dtype), mode="drop")


def attention(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    query_positions: jax.Array,
    key_positions: jax.Array,
    w: dict[str, jax.Array],
    architecture: Architecture,
    dtype,
    kernels: KernelCalls = REFERENCE,
) -> tuple[jax.Array, jax.Array]:
    """Causal softmax attention: a query at position p mixes the values of keys at positions <= p (under a
    sliding window W, of positions p - W + 1 .. p: `visible_keys`).

    q: [B, T, H, D]; keys, values: [B, K, S, D] (head-major); query_positions: [B, T];
    key_positions: [B or 1, S]. Keys at later positions (including unwritten cache
    slots) are invisible. Returns (output [B*T, C], weights [B, T, H, S]).

    Over the pass's own tokens (S == T) with `kernels.causal_rows`, by blocks of query rows
    (`_causal_block_attention`), their products and softmax by `kernels.causal_attention` where given.
    """
    a = architecture
    B, T, H, D = q.shape
    K, S = a.kv_heads, keys.shape[2]
    assert K is not None, "LlamaArchitecture.__post_init__ sets kv_heads"
    G = H // K
    over = attention_dtype(dtype)
    keys, values = operand(keys, over), operand(values, over)
    precision = _matmul_precision(over)
    rows = kernels.causal_rows
    if rows is not None and S == T and (kernels.causal_attention is not None or rows < T):
        mixed, weights = _causal_block_attention(
            operand(q, over), keys, values, query_positions, key_positions, rows, over, a
        )
        if kernels.causal_attention is not None:
            if isinstance(a, LlamaArchitecture) and a.attention_window is not None:
                raise ApiError(
                    "kernels.causal_attention",
                    f"attends to every earlier key, and sliding_window={a.sliding_window} hides the older ones: "
                    "run this model's attention as 'full' or 'causal_blocks'",
                )  # the weights above are for observers only: unobserved, XLA
            head_minor = lambda t: t.transpose(0, 2, 1, 3)  # drops their computation. [B, K, T, D] -> [B, T, K, D]
            mixed = kernels.causal_attention(operand(q, over), head_minor(keys), head_minor(values), rows)
        out = dense(mixed.reshape(B * T, H * D), w["attention_output"], w.get("attention_output_bias"), dtype, kernels)
        return out, weights
    # Each key/value head's group of query heads, as one matrix of G*T rows: [B, K, G*T, D].
    q = operand(q, over).reshape(B, T, K, G, D).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, D)
    over_heads = (((3,), (3,)), ((0, 1), (0, 1)))
    # The cache is the first operand, contracted over its last axis: the product XLA on CPU runs on the
    # buffer as stored. (As the second operand it copies every layer's keys to [B, K, D, S] first.)
    scores = jax.lax.dot_general(keys, q, over_heads, precision=precision, preferred_element_type=F32)
    scores = scores.reshape(B, K, S, G, T).transpose(0, 1, 3, 4, 2) / jnp.sqrt(jnp.asarray(D, F32))  # [B, K, G, T, S]
    visible = visible_keys(query_positions, key_positions, a)  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(F32).min)
    weights = jax.nn.softmax(scores, axis=-1)  # [B, K, G, T, S]
    over_slots = (((3,), (2,)), ((0, 1), (0, 1)))
    mixed = jax.lax.dot_general(
        operand(weights.reshape(B, K, G * T, S), over),
        values,
        over_slots,
        precision=precision,
        preferred_element_type=F32,
    )  # [B, K, G*T, D]
    mixed = mixed.reshape(B, K, G, T, D).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, D]
    out = dense(mixed.reshape(B * T, H * D), w["attention_output"], w.get("attention_output_bias"), dtype, kernels)
    return out, weights.reshape(B, H, T, S).transpose(0, 2, 1, 3)


def visible_keys(query_positions: jax.Array, key_positions: jax.Array, architecture: Architecture) -> jax.Array:
    """[B, T, S] whether the query at each position sees the key at each: causally, keys at positions <= its own,
    and under a sliding window W only the latest W of them (positions > its own - W)."""
    earlier = key_positions[:, None, :]
    visible = earlier <= query_positions[:, :, None]
    window = architecture.attention_window if isinstance(architecture, LlamaArchitecture) else None
    return visible if window is None else visible & (earlier > query_positions[:, :, None] - window)


def _causal_block_attention(q, keys, values, query_positions, key_positions, rows: int, over, architecture):
    """`attention`'s scores, softmax and value mix one block of `rows` queries at a time, each over the keys
    up to its block's last token only: (mixed [B, T, K, G, D], weights [B, T, H, S] with zeros past the block).

    q: [B, T, H, D]; keys, values: [B, K, T, D]. The positional mask still applies inside each block's keys.
    """
    B, T, H, D = q.shape
    K = keys.shape[1]
    G = H // K
    precision = _matmul_precision(over)
    q = q.reshape(B, T, K, G, D).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
    visible = visible_keys(query_positions, key_positions, architecture)  # [B, T, T]
    scale = jnp.sqrt(jnp.asarray(D, F32))
    mixed, weights = [], []
    for start in range(0, T, rows):
        end = min(start + rows, T)  # this block's queries see keys [0, end) at most
        block_q = q[:, :, :, start:end].reshape(B, K, G * (end - start), D)
        scores = jax.lax.dot_general(
            keys[:, :, :end], block_q, (((3,), (3,)), ((0, 1), (0, 1))), precision=precision, preferred_element_type=F32
        )  # [B, K, end, G * rows]
        scores = scores.reshape(B, K, end, G, end - start).transpose(0, 1, 3, 4, 2) / scale  # [B, K, G, rows, end]
        scores = jnp.where(visible[:, None, None, start:end, :end], scores, jnp.finfo(F32).min)
        block_weights = jax.nn.softmax(scores, axis=-1)
        block_mixed = jax.lax.dot_general(
            operand(block_weights.reshape(B, K, G * (end - start), end), over),
            values[:, :, :end],
            (((3,), (2,)), ((0, 1), (0, 1))),
            precision=precision,
            preferred_element_type=F32,
        )  # [B, K, G * rows, D]
        mixed.append(block_mixed.reshape(B, K, G, end - start, D))
        weights.append(jnp.pad(block_weights, ((0, 0),) * 4 + ((0, T - end),)))
    mixed_all = jnp.concatenate(mixed, axis=3).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, D]
    weights_all = jnp.concatenate(weights, axis=3).reshape(B, H, T, T).transpose(0, 2, 1, 3)
    return mixed_all, weights_all


def output_projection(
    x: jax.Array, lm_head: jax.Array | OutputMajor, lm_bias: jax.Array | None, dtype, kernels: KernelCalls = REFERENCE
) -> jax.Array:
    """Final hidden vectors [N, C] -> vocabulary scores [N, V], accumulated in float32."""
    return dense(x, lm_head, lm_bias, dtype, kernels)
