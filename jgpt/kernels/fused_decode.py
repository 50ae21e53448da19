"""Every decoder block of a batch-1 decode step in one kernel call, on CPU.

A batch-1 step reads each weight once for two flops per 4-byte weight: its floor is the
read bandwidth. Run as XLA operations, a GPT-2-small step is some 70 products (by
`jgpt.kernels.blas_matvec`'s loop), each waiting for the one before, and about 370 small fusions,
reductions, copies and cache scatters, dispatched one after another: its median stood
about a millisecond above its products chained alone. `fused_decode.cc` runs all the blocks in one XLA FFI call instead: the calling thread
leads and threads of XLA's intra-op pool help, sharing each stage (query/key/value
products, attention heads, output projection, feed-forward products) chunk by chunk,
with the normalizations, rotations, activations, the attention over the cache and the
writes of the new key and value into it done inside. The cache goes in and comes out as
the same (aliased) buffers. GPT-2-small's blocks read at about the speed of one long read
of a 1 GiB matrix by the same loop, and the shipped chat model's step takes about half the
time XLA's blocks take (`bench/decode.py --kernel`; docs/inference.md, Speed).

A kernel plan with `decode="fused"` (`jgpt.kernels.plan.Kernels.auto()` on a CPU with
AVX-512F where the kernel builds, `available()`) hands `blocks_where_admitted` to
`model.forward`, which runs it on a pass with a cache. It takes the pass where `admits(...)`,
a rule of shapes and dtypes fixed when the step is traced: one token of one row, float32
throughout, the GPT baseline (learned positions, LayerNorm, GELU, biases) or Llama (rotary
positions, scaled or not, RMSNorm, SwiGLU, grouped key/value heads, query/key/value biases or
none), per-layer output-major weights holding at least `SMALLEST_BYTES`. Its attention reads
every cached position up to the token's: a model whose sliding window hides some is never
admitted (`takes_model`), and runs XLA's blocks. Everywhere else the XLA blocks run, and they stay the reference:
the kernel's logits and cache match them within 1e-5 (tests/test_fused_decode.py).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.kernels import blas_matmul
from jgpt.model.architecture import Architecture, LlamaArchitecture
from jgpt.model.layer_strategy import LayerWeights
from jgpt.model.operations import rotary_angles
from jgpt.model.output_major import OutputMajor
from jgpt.model.weights import weight_shapes

F32 = jnp.float32
SOURCE = Path(__file__).with_name("fused_decode.cc")
TARGET = "jgpt_fused_decode"
# A layer's tensors in the order the kernel reads those present (its `Tensor` enum); projections output-major.
LAYER_TENSORS = (
    "ln1_scale", "ln1_bias", "query", "query_bias", "key", "key_bias", "value", "value_bias",
    "attention_output", "attention_output_bias", "ln2_scale", "ln2_bias", "ff_gate", "ff_up", "ff_up_bias",
    "ff_down", "ff_down_bias",
)  # fmt: skip
PROJECTIONS = ("query", "key", "value", "attention_output", "ff_gate", "ff_up", "ff_down")
# Block weights below which XLA's blocks run a step faster: waking the pool's threads costs more than the kernel
# saves (the shipped chat-draft, 0.26 MB of blocks, ran slower fused; chat, 4.2 MB, about twice as fast).
SMALLEST_BYTES = 1 << 20
# The kernel's codes.
ACTIVATIONS = {"gelu": 0, "gelu_tanh": 1, "swiglu": 2}
NORMALIZATIONS = {"layernorm": 0, "rmsnorm": 1}


def admits(architecture: Architecture, rows: int, cache_dtype, layers: Sequence[LayerWeights] | None) -> bool:
    """Whether this kernel takes a pass (its static rule, read at trace time): one token of one row (`rows` =
    B * T) over a float32 cache, a float32 architecture without a sliding window, and per-layer float32 output-major weights of the
    architecture's tensors holding at least SMALLEST_BYTES (below that XLA's blocks run faster)."""
    a = architecture
    if rows != 1 or layers is None or a.precision != "float32" or jnp.dtype(cache_dtype) != F32 or _windowed(a):
        return False
    expected = layer_shapes(a)
    for w in layers:
        if set(w) != set(expected):
            return False
        projections = [w[name] for name in PROJECTIONS if name in expected]
        if not all(isinstance(p, OutputMajor) and p.dtype == F32 for p in projections):
            return False
    held = sum(math.prod(w[name].shape) * w[name].dtype.itemsize for w in layers for name in expected)
    return held >= SMALLEST_BYTES


def takes_model(architecture: Architecture) -> bool:
    """Whether `admits` can take any pass of this architecture's output-major weights: float32, no sliding window
    that hides a cached position (the kernel attends to all of them), and blocks holding at least SMALLEST_BYTES.
    What a plan is narrowed by when an execution is bound."""
    a = architecture
    if _windowed(a):
        return False
    held = a.layers * sum(math.prod(shape) * 4 for shape in layer_shapes(a).values())
    return a.precision == "float32" and held >= SMALLEST_BYTES


def _windowed(architecture: Architecture) -> bool:
    """Whether a sliding window hides some cached positions from a query (the kernel attends to all of them)."""
    return isinstance(architecture, LlamaArchitecture) and architecture.attention_window is not None


def blocks_where_admitted(
    x: jax.Array,
    positions: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    layers: Sequence[LayerWeights] | None,
    architecture: Architecture,
) -> tuple[jax.Array, jax.Array, jax.Array] | None:
    """`blocks(...)` for a pass of x [N, C] at positions [B, T] where `admits(...)` it, else None: the plan's
    `KernelCalls.decode_blocks`."""
    if not admits(architecture, x.shape[0], keys.dtype, layers):
        return None
    return blocks(x, positions.reshape(()), keys, values, layers, architecture)


def layer_shapes(architecture: Architecture) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each block tensor one layer holds for the kernel: `weight_shapes`' without the layer axis,
    the projections output-major ([outputs, inputs])."""
    return {name: shape[1:][::-1] if name in PROJECTIONS else shape[1:]
            for name, shape in weight_shapes(architecture).items() if name in LAYER_TENSORS}  # fmt: skip


def available(backend: str | None = None) -> bool:
    """Whether `backend` (default: JAX's default backend) is a CPU with AVX-512F and the kernel builds and loads."""
    return (backend or jax.default_backend()) == "cpu" and _kernel() is not None


def blocks(
    x: jax.Array,
    position: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    layers: Sequence[LayerWeights] | None,
    architecture: Architecture,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every block for one token: x [1, C] (embedded), position [] int32, keys and values [L, 1, K, S, D] ->
    (stream [1, C] before the final normalization, keys, values with the token's written at slot `position`,
    dropped past S). Where the kernel is not `available()` it raises RuntimeError."""
    a = architecture
    if layers is None:
        raise ValueError("fused decode runs over per-layer weights: check admits(...) first")
    L, K, D, C = a.layers, a.kv_heads, a.head_dim, a.width
    if x.shape != (1, C) or keys.shape[:3] != (L, 1, K) or keys.shape[4] != D or keys.shape != values.shape:
        raise ValueError(f"fused decode takes x [1, {C}] and caches [{L}, 1, {K}, S, {D}], got {x.shape}, {keys.shape}")
    if len(layers) != L:
        raise ValueError(f"fused decode takes {L} layers' weights, got {len(layers)}")
    # The kernel reads every tensor at the sizes the architecture implies: check each before it does.
    expected = layer_shapes(a)
    for index, w in enumerate(layers):
        if set(w) != set(expected):
            raise ValueError(f"layer {index} holds {sorted(w)}, the architecture's blocks {sorted(expected)}")
        for name, shape in expected.items():
            t = w[name]
            if name in PROJECTIONS and not isinstance(t, OutputMajor):
                raise ValueError(f"layer {index}'s {name} must be held output-major (an OutputMajor)")
            if tuple(t.shape) != shape or t.dtype != F32:
                raise ValueError(
                    f"layer {index}'s {name} is {t.dtype} {tuple(t.shape)}, the kernel reads float32 {shape}"
                )
    if _kernel() is None:
        raise RuntimeError("the fused decode kernel is not available here: check fused_decode.available() first")
    present = [name for name in LAYER_TENSORS if name in expected]
    tensors = [_held(w[name]) for w in layers for name in present]
    rotation = jnp.zeros((0,), F32)
    if isinstance(a, LlamaArchitecture):  # the alternative whose position is "rope"
        angles = rotary_angles(position, D, a)  # scaled where the architecture says
        rotation = jnp.stack([jnp.cos(angles), jnp.sin(angles)])
    results = (jax.ShapeDtypeStruct((1, C), F32), jax.ShapeDtypeStruct(keys.shape, F32),
               jax.ShapeDtypeStruct(values.shape, F32))  # fmt: skip
    call = jax.ffi.ffi_call(TARGET, results, input_output_aliases={2: 1, 3: 2})
    stream, keys, values = call(
        x.astype(F32),
        jnp.reshape(position, (1,)).astype(jnp.int32),
        keys,
        values,
        rotation,
        *tensors,
        epsilon=np.float32(a.epsilon),
        activation=np.int64(ACTIVATIONS[a.activation]),
        normalization=np.int64(NORMALIZATIONS[a.normalization]),
        present=np.int64(sum(1 << LAYER_TENSORS.index(name) for name in present)),
        heads=np.int64(a.heads),
    )
    return stream, keys, values


def _held(t) -> jax.Array:
    return t.matrix if isinstance(t, OutputMajor) else t


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The compiled kernel registered with XLA; None where this CPU lacks AVX-512F or it cannot be built."""
    return blas_matmul.registered(SOURCE, TARGET, "jgpt_fused_decode", "jgpt_fused_decode_supported")
