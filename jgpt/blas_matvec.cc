// One row times an output-major matrix for XLA on CPU: y[1, O] = x[1, I] W^T with W [O, I] (row o holds output
// o's input weights), the product of a batch-1 decode step. It reads each weight once for two flops, so its speed
// is the read bandwidth, which one core does not reach alone: the output rows are split into one contiguous block
// per thread of XLA's own intra-op pool, and each block is an AVX-512 loop over four rows at a time that
// prefetches the next four. Only `jgpt_matvec_supported()` CPUs may run it (the loop is compiled for AVX-512F
// alone, the rest of the library for the baseline, so loading it anywhere is safe).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Outputs below which a block's reads cost less than handing it to another thread (64 rows of 768: 192 KiB).
constexpr int64_t kMinOutputsPerPart = 64;
// Floats per AVX-512 register, and per block a part's first output is rounded to, so no two parts write the same
// 64-byte line of y.
constexpr int64_t kLane = 16;

__attribute__((target("avx512f"))) float Sum(__m512 v) { return _mm512_reduce_add_ps(v); }

// y[o] = <W row o, x> for o in [first, end). The last `inputs % 16` inputs of a row are read by a masked load,
// which never touches the masked-out bytes.
__attribute__((target("avx512f"))) void Part(const float* x, const float* w, float* y, int64_t inputs,
                                              int64_t first, int64_t end) {
  const int64_t whole = inputs / kLane * kLane;
  const __mmask16 tail = static_cast<__mmask16>((1u << (inputs - whole)) - 1u);
  int64_t o = first;
  for (; o + 4 <= end; o += 4) {
    const float* w0 = w + o * inputs;
    const float* w1 = w0 + inputs;
    const float* w2 = w1 + inputs;
    const float* w3 = w2 + inputs;
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
  for (; o < end; ++o) {
    const float* row = w + o * inputs;
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < whole; i += kLane) a = _mm512_fmadd_ps(_mm512_loadu_ps(row + i), _mm512_loadu_ps(x + i), a);
    if (tail) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, row + i), _mm512_maskz_loadu_ps(tail, x + i), a);
    y[o] = Sum(a);
  }
}

// The Python side (jgpt/blas_matvec.py) passes x [1, I] and W [O, I] float32 only.
ffi::Future Product(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  const int64_t inputs = x.dimensions()[1], outputs = w.dimensions()[0];
  const float* x_data = x.typed_data();
  const float* w_data = w.typed_data();
  float* y_data = y->typed_data();
  const int64_t parts =
      std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), outputs / kMinOutputsPerPart));
  const int64_t per_part = ((outputs + parts - 1) / parts + kLane - 1) / kLane * kLane;
  ffi::CountDownPromise done(parts);
  for (int64_t part = 0; part < parts; ++part) {
    pool.Schedule([=]() mutable {
      const int64_t first = std::min(outputs, part * per_part), end = std::min(outputs, first + per_part);
      if (first < end) Part(x_data, w_data, y_data, inputs, first, end);
      done.CountDown();
    });
  }
  return ffi::Future(done);
}

}  // namespace

extern "C" int jgpt_matvec_supported() { return __builtin_cpu_supports("avx512f"); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(jgpt_matvec, Product,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
