// One f32 matrix product C = op(A) @ op(B) for XLA on CPU, computed by a BLAS sgemm (the OpenBLAS numpy
// ships) over XLA's own intra-op thread pool: the product's rows are split into one part per pool thread,
// each part one single-threaded sgemm, so no second thread pool competes with XLA's for the cores.
#include <algorithm>
#include <cstdint>

#include "openblas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jgpt::kNoTranspose, jgpt::kRowMajor, jgpt::kTranspose, jgpt::set_threads_local, jgpt::sgemm;
// Rows below which a part's sgemm costs less than handing it to another thread.
constexpr int64_t kMinRowsPerPart = 32;

ffi::Future Product(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                    ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b) {
  const int64_t a0 = a.dimensions()[0], a1 = a.dimensions()[1], b0 = b.dimensions()[0], b1 = b.dimensions()[1];
  const int64_t m = transpose_a ? a1 : a0, k = transpose_a ? a0 : a1, n = transpose_b ? b0 : b1;
  const float* a_data = a.typed_data();
  const float* b_data = b.typed_data();
  float* c_data = c->typed_data();
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), m / kMinRowsPerPart));
  const int64_t rows = (m + parts - 1) / parts;
  ffi::CountDownPromise done(parts);
  for (int64_t part = 0; part < parts; ++part) {
    pool.Schedule([=]() mutable {
      const int64_t first = part * rows, count = std::min(rows, m - first);
      // Rows of op(A) are columns of a transposed A.
      const float* a_part = a_data + (transpose_a ? first : first * a1);
      set_threads_local(1);
      sgemm(kRowMajor, transpose_a ? kTranspose : kNoTranspose, transpose_b ? kTranspose : kNoTranspose, count, n,
            k, 1.0f, a_part, a1, b_data, b1, 0.0f, c_data + first * n, n);
      done.CountDown();
    });
  }
  return ffi::Future(done);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jgpt_blas_product, Product,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
