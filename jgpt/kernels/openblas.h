// The OpenBLAS entry points jgpt's BLAS kernels call (blas_matmul.cc, blas_attention.cc): those of the OpenBLAS
// numpy's wheel bundles, bound when a kernel's library is loaded by `jgpt_bind_blas`, which the Python side calls
// with the addresses it finds there (jgpt.blas_matmul.numpy_openblas). Each kernel is its own shared library built
// from one source that includes this header once, so the one definition of `jgpt_bind_blas` below is its library's.
#ifndef JGPT_OPENBLAS_H_
#define JGPT_OPENBLAS_H_

#include <cstdint>

namespace jgpt {

using Sgemm = void (*)(int order, int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
using SetThreadsLocal = int (*)(int);

constexpr int kRowMajor = 101, kNoTranspose = 111, kTranspose = 112;

inline Sgemm sgemm = nullptr;
inline SetThreadsLocal set_threads_local = nullptr;

}  // namespace jgpt

extern "C" void jgpt_bind_blas(void* sgemm_function, void* set_threads_local_function) {
  jgpt::sgemm = reinterpret_cast<jgpt::Sgemm>(sgemm_function);
  jgpt::set_threads_local = reinterpret_cast<jgpt::SetThreadsLocal>(set_threads_local_function);
}

#endif  // JGPT_OPENBLAS_H_
