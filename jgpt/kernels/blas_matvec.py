"""One row times an output-major matrix by an own multi-threaded loop: the products of a batch-1 decode step on CPU.

A batch-1 decode step reads every weight once for two flops per 4-byte weight, so
its products run at the read bandwidth, which one core does not reach alone. This
kernel (`blas_matvec.cc`, an XLA FFI kernel) read a GPT-2-small step's products
faster than XLA's dot, and took 5-11% off whole batch-1 decode steps
(`bench/decode.py --kernel`; docs/inference.md, Speed). It splits the output rows
of an `OutputMajor` matrix `[O, I]` into one contiguous block per thread of XLA's
own intra-op pool (so no second pool competes for the cores) and runs each block as
an AVX-512 loop over four rows at a time, prefetching the next four. OpenBLAS's
sgemv in the same blocks was no faster than XLA, so no BLAS is called despite the
module's name, which it shares with `jgpt.kernels.blas_matmul`; it is built, cached and loaded
as every kernel is (`jgpt.kernels.kernel_cache`).

`available()` is False where the kernel cannot run: a backend other than CPU, a CPU
without AVX-512F (checked at run time), no compiler or a failed build; the kernel plan
(`jgpt.kernels.plan.Kernels.auto()`) then says `one_row="xla"` and XLA's dot runs. XLA's product stays the reference (parity to 1e-5 relative,
tests/test_blas_matvec.py).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_matmul

F32 = jnp.float32
SOURCE = Path(__file__).with_name("blas_matvec.cc")
TARGET = "jgpt_matvec"


def available(backend: str | None = None) -> bool:
    """Whether `backend` (default: JAX's default backend) is a CPU with AVX-512F and the kernel builds and loads."""
    return (backend or jax.default_backend()) == "cpu" and _kernel() is not None


@jax.custom_vjp
def matvec(x: jax.Array, matrix: jax.Array) -> jax.Array:
    """x [1, I] @ matrix[O, I]^T -> [1, O] float32 by the kernel (check `available()` first); differentiable, with
    XLA's products backward."""
    return _product(x, matrix)


def _product(x: jax.Array, matrix: jax.Array) -> jax.Array:
    if x.ndim != 2 or x.shape[0] != 1 or matrix.ndim != 2 or x.shape[1] != matrix.shape[1]:
        raise ApiError("matvec", f"takes x [1, I] and a matrix [O, I], got {x.shape} and {matrix.shape}")
    if x.dtype != F32 or matrix.dtype != F32:
        raise ApiError("matvec", f"takes float32 operands, got {x.dtype} and {matrix.dtype}")
    if _kernel() is None:
        raise RuntimeError("the matrix-vector kernel is not available here: check blas_matvec.available() first")
    result = jax.ShapeDtypeStruct((1, matrix.shape[0]), F32)
    # Under vmap each element is its own one-row product, called in turn.
    return jax.ffi.ffi_call(TARGET, result, vmap_method="sequential")(x, matrix)


def _matvec_forward(x, matrix):
    return _product(x, matrix), (x, matrix)


def _matvec_backward(residuals, g):
    x, matrix = residuals
    return g @ matrix, jax.lax.dot_general(g, x, (((0,), (0,)), ((), ())))


matvec.defvjp(_matvec_forward, _matvec_backward)


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The compiled kernel registered with XLA; None where this CPU lacks AVX-512F or it cannot be built."""
    return blas_matmul.registered(SOURCE, TARGET, "jgpt_matvec", "jgpt_matvec_supported")
