"""Dense products as BLAS sgemm calls: the train step's products on CPU with `--products blas`.

XLA's CPU dot ran the train step's dense products on the bench configs' shapes
at about half torch's rate, in every operand layout and `dot_general` form tried
(`bench/train_step.py --products` prints the table): the layouts that made 16-row
decode faster (`jgpt.model.output_major`) change little at hundreds of rows, while
numpy's OpenBLAS and torch's MKL run these products at the same rate per core
(docs/training.md, Speed). So on CPU the train step
computes each projection's three products (forward `x @ W`, input gradient
`g @ W^T`, weight gradient `x^T @ g`) with the single-precision GEMM of the
OpenBLAS numpy ships, through an XLA FFI kernel (`blas_matmul.cc`) that splits a
product's rows over XLA's own intra-op thread pool, one single-threaded sgemm per
thread, so no second thread pool competes with XLA's for the cores. BLAS takes
either operand transposed as stored, so no layout is converted: the weights stay
`[I, O]` and the optimizer, the artifact and the HF parity see them as always. A
training plan with `products="blas"` (`jgpt.kernels.plan`) hands `float32_matmul` to
every dense product of the forward pass (`jgpt.model.operations.dense`).

The kernel is compiled on first use with the system's C++ compiler (`$CXX`, else
`g++`) and cached per user, loaded only once verified (`jgpt.kernels.kernel_cache`, which
every kernel loads through). Where it cannot be built or loaded (no compiler, a numpy without
its bundled OpenBLAS, a backend other than CPU) `available()` is False and a run that asks
for it is refused; the pure-JAX products stay the reference (parity tested to 1e-5 relative).
"""

from __future__ import annotations

import ctypes
import functools
import subprocess
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.kernels import kernel_cache

F32 = jnp.float32
SOURCE = Path(__file__).with_name("blas_matmul.cc")
TARGET = "jgpt_blas_product"
# The ILP64 CBLAS entry and the per-thread thread count of numpy's bundled OpenBLAS (numpy.libs).
SGEMM, SET_THREADS_LOCAL = "scipy_cblas_sgemm64_", "openblas_set_num_threads_local"


def float32_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [N, I] @ w [I, O] float32 by the kernel, differentiable (BLAS products are full float32 whatever
    precision the operation asks): the plan's `KernelCalls.product` for `products="blas"`."""
    return matmul(x.astype(F32), w.astype(F32))


def available(backend: str | None = None) -> bool:
    """Whether `backend` (default: JAX's default backend) is a CPU and the kernel builds and loads here."""
    return (backend or jax.default_backend()) == "cpu" and _kernel() is not None


@jax.custom_vjp
def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [N, I] @ w [I, O] float32 by the BLAS kernel, differentiable with BLAS backward products."""
    return product(x, w)


def _matmul_forward(x, w):
    return product(x, w), (x, w)


def _matmul_backward(residuals, g):
    x, w = residuals
    return product(g, w, transpose_b=True), product(x, g, transpose_a=True)


matmul.defvjp(_matmul_forward, _matmul_backward)


def product(a: jax.Array, b: jax.Array, transpose_a: bool = False, transpose_b: bool = False) -> jax.Array:
    """op(a) @ op(b) for float32 matrices, op transposing where asked, with no transposed copy made."""
    if _kernel() is None:
        raise RuntimeError("the BLAS kernel is not available here: check blas_matmul.available() first")
    rows = a.shape[1] if transpose_a else a.shape[0]
    columns = b.shape[0] if transpose_b else b.shape[1]
    result = jax.ShapeDtypeStruct((rows, columns), F32)
    return jax.ffi.ffi_call(TARGET, result)(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The compiled kernel, bound to numpy's OpenBLAS and registered with XLA; None where that fails."""
    library = bound_to_openblas(SOURCE, "the BLAS products kernel")
    if library is None:
        return None
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.jgpt_blas_product), platform="cpu")
    return library


def registered(source: Path, target: str, handler: str, supported: str) -> ctypes.CDLL | None:
    """The kernel `source` compiled and loaded, its `handler` registered with XLA as `target`; None where its
    `supported` function says this CPU cannot run it, or it cannot be built (silently: a plan resolved where
    it is unavailable says "xla" for it). Used by `blas_matvec` and `fused_decode`."""
    try:
        library = kernel_cache.load(source)
    except (OSError, subprocess.CalledProcessError):
        return None
    if not getattr(library, supported)():
        return None
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, handler)), platform="cpu")
    return library


def bound_to_openblas(source: Path, what: str) -> ctypes.CDLL | None:
    """The kernel `source` loaded and bound to numpy's OpenBLAS (its sgemm and per-thread thread count, through
    `jgpt_bind_blas`, which openblas.h declares); None, with a warning naming `what`, where that fails (also used
    by `blas_attention`)."""
    blas = numpy_openblas((SGEMM, SET_THREADS_LOCAL))
    if blas is None:
        return None
    try:
        library = kernel_cache.load(source)
    except (OSError, subprocess.CalledProcessError) as error:
        warnings.warn(f"jgpt: {what} is unavailable: {error}", stacklevel=3)
        return None
    address = lambda symbol: ctypes.cast(getattr(blas, symbol), ctypes.c_void_p)
    library.jgpt_bind_blas(address(SGEMM), address(SET_THREADS_LOCAL))
    return library


def numpy_openblas(symbols: tuple[str, ...]) -> ctypes.CDLL | None:
    """The OpenBLAS numpy's wheel bundles (already loaded by numpy), or None if this numpy has another or its
    library lacks one of `symbols` (also used by `blas_attention`)."""
    for path in sorted((Path(np.__file__).parent.parent / "numpy.libs").glob("libscipy_openblas*.so*")):
        library = ctypes.CDLL(str(path))
        if all(hasattr(library, symbol) for symbol in symbols):
            return library
    return None
