"""jgpt's own kernels, and the plan that says which of them a run uses.

The reference computation is `jgpt.model.transformer` and `jgpt.model.operations`, which import nothing from here.
A kernel replaces one of their steps only where a `Kernels` plan (`jgpt.kernels.plan`), chosen once
where a run is configured, hands its callable to the forward pass (`Kernels.calls()`). Each kernel is
an XLA FFI handler in C++ (`*.cc`, with the headers `*.h` they include), compiled on first use and
loaded through `kernel_cache`, and a Python wrapper of the same name:

* `blas_matmul`: a dense projection's products by numpy's OpenBLAS sgemm (training, `--products blas`).
* `blas_attention`: causal self-attention by blocks of query rows, never storing the [T, T] weights
  (training, `--attention causal_blas`).
* `blas_matvec`: one row times an output-major matrix by an AVX-512 loop (a batch-1 decode step's products).
* `fused_decode`: every decoder block of a batch-1 decode step in one call (AVX-512).
"""
