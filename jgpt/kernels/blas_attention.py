"""Causal self-attention by BLAS blocks: the train step's attention on CPU with `--attention causal_blas`.

XLA on CPU runs attention's batched products ([B * H] matrices of [T, D] x [D, T] and [T, T] x [T, D])
slower than numpy's OpenBLAS runs the same batches, and it writes the [B, H, T, T] scores, weights and their
gradients to memory between the mask, the softmax and its backward, where torch's causal flash attention
keeps them in cache (`bench/train_step.py`; docs/training.md, Speed). This kernel (`blas_attention.cc`, an
XLA FFI handler compiled and loaded through `jgpt.kernels.kernel_cache`) computes one block of query rows at
a time: the block's scores against the keys up to its last token only (the later key blocks are skipped, as
in `causal_blocks`), its softmax in a per-thread buffer, and its value mix, each product a single-threaded
sgemm, the (batch row, key/value head) pairs split over XLA's intra-op pool. The [T, T] weights are never
stored: the backward pass recomputes each block's from the log-sum-exp per query the forward pass keeps.

It rounds differently from `jgpt.model.operations.attention` (scaled products, blockwise softmax), so it is
opt-in; `tests/test_blas_attention.py` holds outputs and gradients within 1e-5 relative of it.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_matmul

F32 = jnp.float32
SOURCE = Path(__file__).with_name("blas_attention.cc")
FORWARD, BACKWARD = "jgpt_causal_attention_forward", "jgpt_causal_attention_backward"


def available(backend: str | None = None) -> bool:
    """Whether `backend` (default: JAX's default backend) is a CPU and the kernel builds and loads here."""
    return (backend or jax.default_backend()) == "cpu" and _kernel() is not None


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, rows: int) -> jax.Array:
    """softmax(q k^T / sqrt(D), key j visible to query i iff j <= i) v, float32.

    q: [B, T, H, D]; k, v: [B, T, K, D] with H a multiple of K (query head h reads key/value head h // (H/K));
    `rows` query rows per block. Returns [B, T, H, D]. Differentiable in q, k and v.
    """
    return _forward(q, k, v, rows)[0]


def _forward(q, k, v, rows):
    B, T, H, D = q.shape
    if k.shape != v.shape or k.ndim != 4 or k.shape[:2] != (B, T) or k.shape[3] != D or H % k.shape[2]:
        raise ApiError("causal_attention", f"queries {q.shape} and keys/values {k.shape}, {v.shape} do not fit")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ApiError("causal_attention", f"rows must be a positive integer, got {rows!r}")
    if _kernel() is None:
        raise RuntimeError("the attention kernel is not available here: check blas_attention.available() first")
    results = (jax.ShapeDtypeStruct(q.shape, F32), jax.ShapeDtypeStruct((B, H, T), F32))
    return jax.ffi.ffi_call(FORWARD, results)(*(x.astype(F32) for x in (q, k, v)), rows=np.int64(rows))


def _causal_attention_forward(q, k, v, rows):
    out, lse = _forward(q, k, v, rows)
    return out, (q, k, v, out, lse)


def _causal_attention_backward(rows, residuals, out_gradient):
    q, k, v, out, lse = residuals
    results = tuple(jax.ShapeDtypeStruct(x.shape, F32) for x in (q, k, v))
    gradients = jax.ffi.ffi_call(BACKWARD, results)(q, k, v, out, lse, out_gradient.astype(F32), rows=np.int64(rows))
    return tuple(g.astype(x.dtype) for g, x in zip(gradients, (q, k, v), strict=True))


causal_attention.defvjp(_causal_attention_forward, _causal_attention_backward)


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The compiled kernel, bound to numpy's OpenBLAS and registered with XLA; None where that fails."""
    library = blas_matmul.bound_to_openblas(SOURCE, "the BLAS attention kernel")
    if library is None:
        return None
    for target in (FORWARD, BACKWARD):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
    return library
