// Causal self-attention of a pass's own tokens for XLA on CPU, forward and backward, one block of query rows
// at a time: each block's scores [rows, end] stay in a per-thread buffer (end = the block's last token + 1,
// so the key blocks after it are never computed), the products are single-threaded sgemm calls of the
// OpenBLAS numpy ships, and the (batch row, key/value head) pairs are split over XLA's intra-op pool. The
// [T, T] attention weights are never written to memory; the backward pass recomputes each block's from the
// log-sum-exp the forward pass keeps (the flash-attention scheme, with BLAS products as its inner steps).
//
// Layouts: queries and outputs [B, T, H, D], keys and values [B, T, K, D] (H = G * K query heads, query head
// h reads key/value head h / G), log-sum-exps [B, H, T]. Key j is visible to query i exactly when j <= i.
#pragma GCC optimize("O3")
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "openblas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jgpt::kNoTranspose, jgpt::kRowMajor, jgpt::kTranspose, jgpt::set_threads_local, jgpt::sgemm;

// exp(x) for x <= 0 to about 1e-7 relative (x < -87 gives 0): 2^n * a degree-7 Taylor polynomial of the
// remainder, in plain arithmetic the compiler vectorizes (libm's expf does not vectorize here).
#define JGPT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

inline float exp_nonpositive(float x) {
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504f + shifter;
  const float n = t - shifter;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 split in two for an exact n * ln2_hi
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int32_t scale_bits = (bits - 0x4B400000 + 127) << 23;  // 0x4B400000: the shifter's own bits
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}

// row[0, visible) <- softmax(row[0, visible)), row[visible, width) <- 0; returns the log-sum-exp.
JGPT_VECTOR_CLONES float softmax_row(float* row, int64_t visible, int64_t width) {
  float top = row[0];
  for (int64_t j = 1; j < visible; ++j) top = std::max(top, row[j]);
  float total = 0.0f;
  for (int64_t j = 0; j < visible; ++j) {
    row[j] = exp_nonpositive(row[j] - top);
    total += row[j];
  }
  const float inverse = 1.0f / total;
  for (int64_t j = 0; j < visible; ++j) row[j] *= inverse;
  std::fill(row + visible, row + width, 0.0f);
  return top + std::log(total);
}

// row[0, visible) <- exp(row - lse), row[visible, width) <- 0: a forward row's weights, recomputed.
JGPT_VECTOR_CLONES void weights_row(float* row, float lse, int64_t visible, int64_t width) {
  for (int64_t j = 0; j < visible; ++j) row[j] = exp_nonpositive(row[j] - lse);
  std::fill(row + visible, row + width, 0.0f);
}

// gradient[j] <- weights[j] * (gradient[j] - dot): the scores' gradient from the weights' (softmax backward).
JGPT_VECTOR_CLONES void scores_gradient_row(const float* weights, float* gradient, float dot, int64_t width) {
  for (int64_t j = 0; j < width; ++j) gradient[j] = weights[j] * (gradient[j] - dot);
}

struct Shape {
  int64_t B, T, H, K, D, G;
  int64_t q_stride() const { return H * D; }   // between a query head's consecutive tokens
  int64_t kv_stride() const { return K * D; }  // between a key/value head's consecutive tokens
};

Shape shape_of(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k) {
  const auto qd = q.dimensions(), kd = k.dimensions();
  return Shape{qd[0], qd[1], qd[2], kd[2], qd[3], qd[2] / kd[2]};
}

// Runs work(first, count) over the B * K (batch row, key/value head) pairs, split into one contiguous part
// per pool thread; the future completes when every part has.
template <typename Work>
ffi::Future over_pairs(ffi::ThreadPool& pool, int64_t pairs, Work work) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), pairs));
  const int64_t per_part = (pairs + parts - 1) / parts;
  ffi::CountDownPromise done(parts);
  for (int64_t part = 0; part < parts; ++part) {
    pool.Schedule([=]() mutable {
      set_threads_local(1);
      const int64_t first = part * per_part;
      if (first < pairs) work(first, std::min(per_part, pairs - first));
      done.CountDown();
    });
  }
  return ffi::Future(done);
}

ffi::Future Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                    ffi::Buffer<ffi::F32> v, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                    int64_t rows) {
  const Shape s = shape_of(q, k);
  rows = std::min(rows, s.T);  // the per-thread buffers hold `rows` x T floats: never more rows than tokens
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  const float *q_data = q.typed_data(), *k_data = k.typed_data(), *v_data = v.typed_data();
  float *out_data = out->typed_data(), *lse_data = lse->typed_data();
  return over_pairs(pool, s.B * s.K, [=](int64_t first, int64_t count) {
    std::vector<float> scores(rows * s.T);
    for (int64_t pair = first; pair < first + count; ++pair) {
      const int64_t b = pair / s.K, g = pair % s.K;
      const float* keys = k_data + b * s.T * s.kv_stride() + g * s.D;
      const float* values = v_data + b * s.T * s.kv_stride() + g * s.D;
      for (int64_t h = g * s.G; h < (g + 1) * s.G; ++h) {
        const int64_t head = b * s.T * s.q_stride() + h * s.D;
        float* head_lse = lse_data + (b * s.H + h) * s.T;
        for (int64_t start = 0; start < s.T; start += rows) {
          const int64_t end = std::min(start + rows, s.T), m = end - start;
          sgemm(kRowMajor, kNoTranspose, kTranspose, m, end, s.D, scale, q_data + head + start * s.q_stride(),
                s.q_stride(), keys, s.kv_stride(), 0.0f, scores.data(), end);
          for (int64_t r = 0; r < m; ++r) head_lse[start + r] = softmax_row(scores.data() + r * end, start + r + 1, end);
          sgemm(kRowMajor, kNoTranspose, kNoTranspose, m, s.D, end, 1.0f, scores.data(), end, values, s.kv_stride(),
                0.0f, out_data + head + start * s.q_stride(), s.q_stride());
        }
      }
    }
  });
}

ffi::Future Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                     ffi::Buffer<ffi::F32> out_gradient, ffi::ResultBuffer<ffi::F32> q_gradient,
                     ffi::ResultBuffer<ffi::F32> k_gradient, ffi::ResultBuffer<ffi::F32> v_gradient, int64_t rows) {
  const Shape s = shape_of(q, k);
  rows = std::min(rows, s.T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  const float *q_data = q.typed_data(), *k_data = k.typed_data(), *v_data = v.typed_data();
  const float *out_data = out.typed_data(), *lse_data = lse.typed_data(), *do_data = out_gradient.typed_data();
  float *dq_data = q_gradient->typed_data(), *dk_data = k_gradient->typed_data(), *dv_data = v_gradient->typed_data();
  return over_pairs(pool, s.B * s.K, [=](int64_t first, int64_t count) {
    std::vector<float> weights(rows * s.T), gradient(rows * s.T), dots(rows);
    for (int64_t pair = first; pair < first + count; ++pair) {
      const int64_t b = pair / s.K, g = pair % s.K;
      const int64_t kv_head = b * s.T * s.kv_stride() + g * s.D;
      const float *keys = k_data + kv_head, *values = v_data + kv_head;
      float *dk = dk_data + kv_head, *dv = dv_data + kv_head;
      for (int64_t t = 0; t < s.T; ++t) {
        std::fill(dk + t * s.kv_stride(), dk + t * s.kv_stride() + s.D, 0.0f);
        std::fill(dv + t * s.kv_stride(), dv + t * s.kv_stride() + s.D, 0.0f);
      }
      for (int64_t h = g * s.G; h < (g + 1) * s.G; ++h) {
        const int64_t head = b * s.T * s.q_stride() + h * s.D;
        const float* head_lse = lse_data + (b * s.H + h) * s.T;
        for (int64_t start = 0; start < s.T; start += rows) {
          const int64_t end = std::min(start + rows, s.T), m = end - start, at = head + start * s.q_stride();
          for (int64_t r = 0; r < m; ++r) {
            const float *o = out_data + at + r * s.q_stride(), *d = do_data + at + r * s.q_stride();
            float dot = 0.0f;
            for (int64_t c = 0; c < s.D; ++c) dot += o[c] * d[c];
            dots[r] = dot;
          }
          sgemm(kRowMajor, kNoTranspose, kTranspose, m, end, s.D, scale, q_data + at, s.q_stride(), keys,
                s.kv_stride(), 0.0f, weights.data(), end);
          for (int64_t r = 0; r < m; ++r) weights_row(weights.data() + r * end, head_lse[start + r], start + r + 1, end);
          // values' gradient += weights^T @ output gradient
          sgemm(kRowMajor, kTranspose, kNoTranspose, end, s.D, m, 1.0f, weights.data(), end, do_data + at,
                s.q_stride(), 1.0f, dv, s.kv_stride());
          // weights' gradient = output gradient @ values^T, then the scores' gradient in place
          sgemm(kRowMajor, kNoTranspose, kTranspose, m, end, s.D, 1.0f, do_data + at, s.q_stride(), values,
                s.kv_stride(), 0.0f, gradient.data(), end);
          for (int64_t r = 0; r < m; ++r)
            scores_gradient_row(weights.data() + r * end, gradient.data() + r * end, dots[r], end);
          // queries' gradient = scale * scores' gradient @ keys; keys' gradient += scale * scores' gradient^T @ queries
          sgemm(kRowMajor, kNoTranspose, kNoTranspose, m, s.D, end, scale, gradient.data(), end, keys, s.kv_stride(),
                0.0f, dq_data + at, s.q_stride());
          sgemm(kRowMajor, kTranspose, kNoTranspose, end, s.D, m, scale, gradient.data(), end, q_data + at,
                s.q_stride(), 1.0f, dk, s.kv_stride());
        }
      }
    }
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jgpt_causal_attention_forward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // queries [B, T, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keys [B, T, K, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values [B, T, K, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // outputs [B, T, H, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // log-sum-exps [B, H, T]
                                  .Attr<int64_t>("rows"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jgpt_causal_attention_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // queries
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keys
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values
                                  .Arg<ffi::Buffer<ffi::F32>>()  // outputs
                                  .Arg<ffi::Buffer<ffi::F32>>()  // log-sum-exps
                                  .Arg<ffi::Buffer<ffi::F32>>()  // outputs' gradient
                                  .Ret<ffi::Buffer<ffi::F32>>()  // queries' gradient
                                  .Ret<ffi::Buffer<ffi::F32>>()  // keys' gradient
                                  .Ret<ffi::Buffer<ffi::F32>>()  // values' gradient
                                  .Attr<int64_t>("rows"));
