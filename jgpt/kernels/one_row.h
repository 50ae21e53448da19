// One row times rows of an output-major matrix, the inner loop of jgpt's batch-1 kernels (blas_matvec.cc and
// fused_decode.cc): y[o] = <w row o, x> for o in [first, end), four rows at a time, prefetching the next four. The
// last `inputs % 16` inputs of a row are read by a masked load, which never touches the masked-out bytes. Only
// CPUs with AVX-512F may call it. Included by each kernel's single source file (a quoted include is found next to
// it); `jgpt.kernels.kernel_cache.build_of` hashes this header into every kernel's cache key.
#ifndef JGPT_ONE_ROW_H_
#define JGPT_ONE_ROW_H_

#include <immintrin.h>

#include <cstdint>

namespace jgpt {

constexpr int64_t kLane = 16;  // floats per AVX-512 register

__attribute__((target("avx512f"))) inline float Sum(__m512 v) { return _mm512_reduce_add_ps(v); }

// The mask of the last n % 16 lanes of n.
inline __mmask16 Tail(int64_t n) { return static_cast<__mmask16>((1u << (n % kLane)) - 1u); }

__attribute__((target("avx512f"))) inline float Dot(const float* a, const float* b, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLane <= n; i += kLane) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
  if (i < n) s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(Tail(n), a + i), _mm512_maskz_loadu_ps(Tail(n), b + i), s);
  return Sum(s);
}

__attribute__((target("avx512f"))) inline void Rows(const float* x, const float* w, float* y, int64_t inputs,
                                                     int64_t first, int64_t end) {
  const int64_t whole = inputs / kLane * kLane;
  const __mmask16 tail = Tail(inputs);
  int64_t o = first;
  for (; o + 4 <= end; o += 4) {
    const float* w0 = w + o * inputs;
    const float *w1 = w0 + inputs, *w2 = w1 + inputs, *w3 = w2 + inputs;
    // The next four rows lie right after these (4 * inputs floats); each step prefetches four of their lines, so
    // the loop has asked for all of them by its end. A prefetch past the matrix is dropped, never a fault.
    const char* next = reinterpret_cast<const char*>(w3 + inputs);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < whole; i += kLane) {
      const char* line = next + 16 * i;  // 4 * i floats of the next rows, in bytes
      _mm_prefetch(line, _MM_HINT_T0);
      _mm_prefetch(line + 64, _MM_HINT_T0);
      _mm_prefetch(line + 128, _MM_HINT_T0);
      _mm_prefetch(line + 192, _MM_HINT_T0);
      const __m512 xv = _mm512_loadu_ps(x + i);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i), xv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i), xv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i), xv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i), xv, a3);
    }
    if (tail) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + i);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w0 + i), xv, a0);
      a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w1 + i), xv, a1);
      a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w2 + i), xv, a2);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w3 + i), xv, a3);
    }
    y[o] = Sum(a0), y[o + 1] = Sum(a1), y[o + 2] = Sum(a2), y[o + 3] = Sum(a3);
  }
  for (; o < end; ++o) y[o] = Dot(w + o * inputs, x, inputs);
}

}  // namespace jgpt

#endif  // JGPT_ONE_ROW_H_
