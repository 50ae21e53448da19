// One row times an output-major matrix for XLA on CPU: y[1, O] = x[1, I] W^T with W [O, I] (row o holds output
// o's input weights), the product of a batch-1 decode step. It reads each weight once for two flops, so its speed
// is the read bandwidth, which one core does not reach alone: the output rows are split into one contiguous block
// per thread of XLA's own intra-op pool, and each block is an AVX-512 loop over four rows at a time that
// prefetches the next four. Only `jgpt_matvec_supported()` CPUs may run it (the loop is compiled for AVX-512F
// alone, the rest of the library for the baseline, so loading it anywhere is safe).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "one_row.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Outputs below which a block's reads cost less than handing it to another thread (64 rows of 768: 192 KiB).
constexpr int64_t kMinOutputsPerPart = 64;
// Per block a part's first output is rounded to a whole register, so no two parts write the same 64-byte line of y.
using jgpt::kLane;

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
      if (first < end) jgpt::Rows(x_data, w_data, y_data, inputs, first, end);
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
