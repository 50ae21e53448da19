// Every decoder block of a batch-1 decode step in one XLA FFI call, on CPU: the GPT baseline (LayerNorm, GELU,
// biases) and the Llama alternative (RMSNorm, rotary positions, SwiGLU, grouped key/value heads).
//
// A batch-1 step reads every weight once for two flops per 4-byte weight, so its time is the read bandwidth plus
// whatever stops the reads. Run as XLA operations, a GPT-2-small step is some 70 products and 370 small fusions,
// reductions and scatters, each dispatched in turn, each product waiting for the one before. Here one call runs all
// the blocks as a team: the calling thread leads and XLA's intra-op pool lends the helpers. The leader does the
// small serial work between stages (normalizations, rotations, cache writes, SwiGLU's product) and publishes each
// parallel stage (a layer's query/key/value products, its attention heads, its output projection, its
// feed-forward products); every member grabs runs of 64-row chunks of it from one atomic ticket, a share of what
// is left at a time (long streams first, single chunks last, so the team ends a stage together). Keys and values
// of the new token are written into the cache, which the call receives and returns as one aliased buffer.
//
// Deadlock-free by construction: the leader can finish every chunk alone, so a helper the pool starts late (or
// never) costs speed, not progress; helpers hold the team by a shared pointer and leave when the leader marks it
// finished. Only `jgpt_fused_decode_supported()` CPUs may run it (AVX-512F: the code between the target pragmas
// and jgpt/one_row.h); loading the library anywhere is safe.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "one_row.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jgpt::Dot, jgpt::kLane, jgpt::Rows, jgpt::Sum, jgpt::Tail;

// A layer's block tensors, in the order the Python side passes those present (jgpt/fused_decode.py,
// LAYER_TENSORS; the `present` attribute has bit t set for each): biases and the gate are absent in Llama.
enum Tensor {
  kLn1Scale, kLn1Bias, kQuery, kQueryBias, kKey, kKeyBias, kValue, kValueBias, kOutput, kOutputBias,
  kLn2Scale, kLn2Bias, kGate, kUp, kUpBias, kDown, kDownBias, kTensors
};
enum Activation : int64_t { kGeluErf = 0, kGeluTanh = 1, kSwiglu = 2 };
enum Normalization : int64_t { kLayerNorm = 0, kRmsNorm = 1 };

constexpr int64_t kChunkRows = 64;  // a product's chunk: 64 rows of 768 inputs are 192 KiB of weights
constexpr uint64_t kFinished = ~uint64_t{0};

// What one parallel stage does, one chunk at a time. A product stage runs up to three matrices, y = W x + b,
// back to back; its epilogue stores y, applies GELU to it, or adds it into y (the residual stream).
enum class Epilogue { kStore, kGelu, kAdd };
struct Product {
  const float* w;  // [rows, inputs], output-major
  const float* b;  // [rows], or null: no bias
  float* y;        // [rows]
  int64_t rows;
};
struct Stage {
  bool attention = false;
  // A product stage.
  Product products[3];
  int64_t count = 0, first_chunk[4] = {};
  const float* x = nullptr;
  int64_t inputs = 0;
  Epilogue epilogue = Epilogue::kStore;
  Activation activation = kGeluErf;
  // An attention stage: one chunk per query head, over this layer's keys and values [kv_heads, slots, head_dim]
  // (query head h reads key/value head h / group), the new position's already written.
  const float* q = nullptr;
  const float *keys = nullptr, *values = nullptr;
  float *mixed = nullptr, *scores = nullptr;
  int64_t slots = 0, head_dim = 0, position = 0, group = 1;
  int64_t chunks = 0;
};

// The ticket packs the stage's number (bits 40-63), its chunk count (20-39) and its next chunk (0-19), so a
// thread grabs a chunk of the stage it saw, or none, in one compare-and-swap.
uint64_t Ticket(uint64_t stage, uint64_t chunks, uint64_t next) { return stage << 40 | chunks << 20 | next; }

// One step's operands and scratch, as the leader reads them.
struct Step {
  int64_t layers, heads, kv_heads, S, D, C, F, position;
  float epsilon;
  Activation activation;
  Normalization normalization;
  const float* rotation;  // [2, D / 2]: cos and sin of the position's angles; null without rotary positions
  std::vector<const float*> tensors;  // the present tensors of each layer in turn
  int64_t per_layer;                  // how many are present
  int64_t slot[kTensors];             // each tensor's index among a layer's present ones, or -1
  float *stream, *keys, *values;
  std::vector<float> scratch;  // normalized input, q/k/v, mixed heads, feed-forward gate and hidden, scores
  // A layer's tensor, or null where absent.
  const float* tensor(int64_t layer, Tensor name) const {
    return slot[name] < 0 ? nullptr : tensors[layer * per_layer + slot[name]];
  }
};

struct Team {
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> done{0};
  int64_t threads = 1;  // a grab takes 1 / threads of the chunks left, at least one
  Stage stage;
};

#pragma GCC push_options
#pragma GCC target("avx512f")

// exp(x) for x <= 0 (x below -87 gives about 1e-38 or 0): 2^n times a degree-7 Taylor polynomial of the remainder
// r = x - n ln 2, |r| <= ln 2 / 2, about 1e-7 relative.
__m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// GELU of 16 values: x (1 + erf(x / sqrt 2)) / 2, erf by Abramowitz and Stegun 7.1.26 (absolute error below
// 1.5e-7), or GPT-2's x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2 with tanh u = sign(u) (1 - e) / (1 + e),
// e = exp(-2 |u|).
__m512 Gelu(__m512 x, Activation activation) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  __m512 odd;  // erf(x / sqrt 2) or tanh(u), an odd function of x: computed at |.|, then given x's sign
  if (activation == kGeluTanh) {
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), _mm512_mul_ps(x, x), x));
    const __m512 e = ExpNonPositive(_mm512_mul_ps(_mm512_set1_ps(-2.0f), _mm512_abs_ps(u)));
    odd = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  } else {
    const __m512 z = _mm512_abs_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), z, one));
    __m512 p = _mm512_set1_ps(1.061405429f);
    for (const float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f})
      p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
    p = _mm512_mul_ps(p, t);
    odd = _mm512_fnmadd_ps(p, ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z))), one);
  }
  odd = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(odd), sign));
  return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, odd));
}

void ProductChunk(const Stage& s, int64_t chunk) {
  int64_t m = 0;
  while (chunk >= s.first_chunk[m + 1]) ++m;
  const Product& p = s.products[m];
  const int64_t first = (chunk - s.first_chunk[m]) * kChunkRows, n = std::min(kChunkRows, p.rows - first);
  float partial[kChunkRows];
  Rows(s.x, p.w + first * s.inputs, partial, s.inputs, 0, n);
  for (int64_t i = 0; i < n; i += kLane) {
    const __mmask16 lanes = n - i >= kLane ? static_cast<__mmask16>(0xffff) : Tail(n - i);
    __m512 y = _mm512_maskz_loadu_ps(lanes, partial + i);
    if (p.b) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(lanes, p.b + first + i));
    float* out = p.y + first + i;
    if (s.epilogue == Epilogue::kGelu) y = Gelu(y, s.activation);
    if (s.epilogue == Epilogue::kAdd) y = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out), y);
    _mm512_mask_storeu_ps(out, lanes, y);
  }
}

// One query head: softmax attention over the slots up to the position (every slot, past the cache).
void AttentionChunk(const Stage& s, int64_t head) {
  const int64_t D = s.head_dim, S = s.slots;
  const float* keys = s.keys + head / s.group * S * D;
  const float* values = s.values + head / s.group * S * D;
  const int64_t visible = std::min(s.position, S - 1) + 1;
  const float* q = s.q + head * D;
  float* scores = s.scores + head * S;
  const float scale = std::sqrt(static_cast<float>(D));
  float top = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) top = std::max(top, scores[j] = Dot(keys + j * D, q, D) / scale);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < visible; j += kLane) {
    const __mmask16 lanes = visible - j >= kLane ? static_cast<__mmask16>(0xffff) : Tail(visible - j);
    const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, scores + j), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + j, lanes, e);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(lanes, e));
  }
  const float inverse = 1.0f / Sum(total);
  float* out = s.mixed + head * D;
  for (int64_t d = 0; d < D; d += kLane) {
    const __mmask16 lanes = D - d >= kLane ? static_cast<__mmask16>(0xffff) : Tail(D - d);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < visible; ++j)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[j] * inverse), _mm512_maskz_loadu_ps(lanes, values + j * D + d), acc);
    _mm512_mask_storeu_ps(out + d, lanes, acc);
  }
}

void RunChunk(const Stage& s, int64_t chunk) {
  if (s.attention)
    AttentionChunk(s, chunk);
  else
    ProductChunk(s, chunk);
}

// Grab and run runs of chunks of the stage `ticket` names until it has none left. A grab takes a share of what is
// left (guided scheduling): long runs of consecutive rows while much is left, which the loop's prefetch streams
// through, and single chunks at the end, so the threads finish a stage together.
void Work(Team& team, uint64_t ticket) {
  for (;;) {
    const int64_t next = ticket & 0xfffff, chunks = ticket >> 20 & 0xfffff;
    if (next >= chunks) return;
    const int64_t take = std::max<int64_t>(1, (chunks - next) / team.threads);
    if (team.ticket.compare_exchange_weak(ticket, ticket + take, std::memory_order_acq_rel)) {
      for (int64_t chunk = next; chunk < next + take; ++chunk) RunChunk(team.stage, chunk);
      team.done.fetch_add(take, std::memory_order_release);
      ticket += take;
    }  // else `ticket` now holds the current one: another thread's grab, or the next stage (or kFinished)
  }
}

void Help(const std::shared_ptr<Team>& team) {
  for (int idle = 0;;) {
    const uint64_t ticket = team->ticket.load(std::memory_order_acquire);
    if (ticket == kFinished) return;
    if ((ticket & 0xfffff) < (ticket >> 20 & 0xfffff)) {
      Work(*team, ticket);
      idle = 0;
    } else if (++idle < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // the leader is doing serial work, or another program needs the core
    }
  }
}

// Publish `stage` as the team's stage number `number`, run chunks of it here too, and return once every chunk is
// done (by any thread).
void Run(Team& team, const Stage& stage, uint64_t number) {
  team.stage = stage;
  team.done.store(0, std::memory_order_relaxed);
  const uint64_t ticket = Ticket(number, stage.chunks, 0);
  team.ticket.store(ticket, std::memory_order_release);
  Work(team, ticket);
  while (team.done.load(std::memory_order_acquire) < stage.chunks) _mm_pause();
}

// LayerNorm ((x - mean) / sqrt(variance + epsilon) * scale + bias) or RMSNorm (x / sqrt(mean square + epsilon) *
// scale) of x [C] into y; bias may be null.
void Normalize(const float* x, const float* scale, const float* bias, float* y, int64_t C, float epsilon,
               Normalization normalization) {
  auto lanes = [C](int64_t i) { return C - i >= kLane ? static_cast<__mmask16>(0xffff) : Tail(C - i); };
  __m512 mean = _mm512_setzero_ps();
  if (normalization == kLayerNorm) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t i = 0; i < C; i += kLane) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(lanes(i), x + i));
    mean = _mm512_set1_ps(Sum(s) / C);
  }
  __m512 s = _mm512_setzero_ps();
  for (int64_t i = 0; i < C; i += kLane) {
    const __m512 c = _mm512_maskz_sub_ps(lanes(i), _mm512_maskz_loadu_ps(lanes(i), x + i), mean);
    s = _mm512_fmadd_ps(c, c, s);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / std::sqrt(Sum(s) / C + epsilon));
  for (int64_t i = 0; i < C; i += kLane) {
    const __m512 c = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes(i), x + i), mean), inverse);
    __m512 out = _mm512_mul_ps(c, _mm512_maskz_loadu_ps(lanes(i), scale + i));
    if (bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(lanes(i), bias + i));
    _mm512_mask_storeu_ps(y + i, lanes(i), out);
  }
}

// Rotary positions on `heads` heads of D at x: channel pairs (i, i + D/2) turned by the position's angles.
void Rotate(float* x, int64_t heads, int64_t D, const float* rotation) {
  const int64_t half = D / 2;
  const float *cos = rotation, *sin = rotation + half;
  for (int64_t h = 0; h < heads; ++h, x += D)
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos[i] + -b * sin[i];
      x[i + half] = b * cos[i] + a * sin[i];
    }
}

// SwiGLU's product: hidden = silu(gate) * up, silu(g) = g / (1 + exp(-g)), written over `up`.
void Swiglu(const float* gate, float* up, int64_t F) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < F; i += kLane) {
    const __mmask16 lanes = F - i >= kLane ? static_cast<__mmask16>(0xffff) : Tail(F - i);
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + i);
    // sigmoid(g) from e = exp(-|g|): 1 / (1 + e) for g >= 0, e / (1 + e) below.
    const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    const __mmask16 below = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(below, one, e), _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(up + i, lanes, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_maskz_loadu_ps(lanes, up + i)));
  }
}

// A product stage over up to three matrices, in chunks of kChunkRows rows.
Stage Products(std::initializer_list<Product> products, const float* x, int64_t inputs, Epilogue epilogue,
               Activation activation) {
  Stage s;
  for (const Product& p : products) {
    s.products[s.count] = p;
    s.first_chunk[s.count + 1] = s.first_chunk[s.count] + (p.rows + kChunkRows - 1) / kChunkRows;
    ++s.count;
  }
  s.chunks = s.first_chunk[s.count];
  s.x = x, s.inputs = inputs, s.epilogue = epilogue, s.activation = activation;
  return s;
}

// Every block, as the team's leader: the serial work here, each parallel stage shared with the helpers.
void Leader(Team& team, Step& step) {
  const int64_t C = step.C, F = step.F, S = step.S, D = step.D, H = step.heads, K = step.kv_heads, Q = H * D;
  float *normed = step.scratch.data(), *q = normed + C, *k = q + Q, *v = k + K * D, *mixed = v + K * D,
        *gate = mixed + Q, *hidden = gate + F, *scores = hidden + F, *stream = step.stream;
  const Activation activation = step.activation;
  const bool swiglu = activation == kSwiglu;
  uint64_t number = 0;
  for (int64_t l = 0; l < step.layers; ++l) {
    auto w = [&](Tensor name) { return step.tensor(l, name); };
    float *keys = step.keys + l * K * S * D, *values = step.values + l * K * S * D;
    Normalize(stream, w(kLn1Scale), w(kLn1Bias), normed, C, step.epsilon, step.normalization);
    Run(team, Products({{w(kQuery), w(kQueryBias), q, Q}, {w(kKey), w(kKeyBias), k, K * D},
                        {w(kValue), w(kValueBias), v, K * D}}, normed, C, Epilogue::kStore, activation), ++number);
    if (step.rotation) Rotate(q, H, D, step.rotation), Rotate(k, K, D, step.rotation);
    if (step.position < S)  // past the cache the write is dropped, as XLA's scatter drops it
      for (int64_t h = 0; h < K; ++h) {
        std::copy_n(k + h * D, D, keys + (h * S + step.position) * D);
        std::copy_n(v + h * D, D, values + (h * S + step.position) * D);
      }
    Stage attention;
    attention.attention = true;
    attention.q = q, attention.keys = keys, attention.values = values, attention.mixed = mixed;
    attention.scores = scores, attention.slots = S, attention.head_dim = D, attention.position = step.position;
    attention.group = H / K, attention.chunks = H;
    Run(team, attention, ++number);
    Run(team, Products({{w(kOutput), w(kOutputBias), stream, C}}, mixed, Q, Epilogue::kAdd, activation), ++number);
    Normalize(stream, w(kLn2Scale), w(kLn2Bias), normed, C, step.epsilon, step.normalization);
    if (swiglu) {
      Run(team, Products({{w(kGate), nullptr, gate, F}, {w(kUp), w(kUpBias), hidden, F}}, normed, C, Epilogue::kStore,
                         activation), ++number);
      Swiglu(gate, hidden, F);
    } else {
      Run(team, Products({{w(kUp), w(kUpBias), hidden, F}}, normed, C, Epilogue::kGelu, activation), ++number);
    }
    Run(team, Products({{w(kDown), w(kDownBias), stream, C}}, hidden, F, Epilogue::kAdd, activation), ++number);
  }
}

#pragma GCC pop_options

// x [1, C] the step's embedded token, position [1], keys and values [layers, 1, kv_heads, slots, head_dim]
// (aliased to the results of the same shape), rotation [2, head_dim / 2] (cos and sin of the position's rotary
// angles; [0] without rotary positions), then each layer's present tensors. Result stream [1, C]: after the last
// block, before the final normalization. The Python side checks every shape. The calling thread leads; its helpers
// are tasks of XLA's intra-op pool.
ffi::Error Blocks(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> position,
                   ffi::Buffer<ffi::F32> keys_in, ffi::Buffer<ffi::F32> values_in, ffi::Buffer<ffi::F32> rotation,
                   ffi::RemainingArgs tensors, ffi::ResultBuffer<ffi::F32> stream_out, ffi::ResultBuffer<ffi::F32> keys,
                   ffi::ResultBuffer<ffi::F32> values, float epsilon, int64_t activation, int64_t normalization,
                   int64_t present, int64_t heads) {
  Step step;
  const auto dims = keys->dimensions();
  step.layers = dims[0], step.kv_heads = dims[2], step.S = dims[3], step.D = dims[4];
  step.heads = heads, step.C = x.dimensions()[1];
  step.position = std::max<int32_t>(0, position.typed_data()[0]);
  step.epsilon = epsilon, step.activation = static_cast<Activation>(activation);
  step.normalization = static_cast<Normalization>(normalization);
  step.rotation = rotation.element_count() ? rotation.typed_data() : nullptr;
  step.per_layer = 0;
  for (int t = 0; t < kTensors; ++t) step.slot[t] = present >> t & 1 ? step.per_layer++ : -1;
  for (size_t i = 0; i < tensors.size(); ++i)
    step.tensors.push_back(static_cast<const float*>(tensors.get<ffi::AnyBuffer>(i).value().untyped_data()));
  step.F = tensors.get<ffi::AnyBuffer>(step.slot[kUp]).value().dimensions()[0];
  step.stream = stream_out->typed_data(), step.keys = keys->typed_data(), step.values = values->typed_data();
  const int64_t Q = step.heads * step.D, KD = step.kv_heads * step.D;
  step.scratch.resize(step.C + 2 * Q + 2 * KD + 2 * step.F + step.heads * step.S);
  if (step.keys != keys_in.typed_data()) std::copy_n(keys_in.typed_data(), keys_in.element_count(), step.keys);
  if (step.values != values_in.typed_data())
    std::copy_n(values_in.typed_data(), values_in.element_count(), step.values);
  std::copy_n(x.typed_data(), step.C, step.stream);

  auto team = std::make_shared<Team>();  // helpers the pool starts late still find it, finished
  team->threads = std::max<int64_t>(1, pool.num_threads());
  for (int64_t h = 1; h < team->threads; ++h) pool.Schedule([team]() { Help(team); });
  Leader(*team, step);
  team->ticket.store(kFinished, std::memory_order_release);
  return ffi::Error::Success();
}

}  // namespace

extern "C" int jgpt_fused_decode_supported() { return __builtin_cpu_supports("avx512f"); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(jgpt_fused_decode, Blocks,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [1, C]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // position [1]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keys [L, 1, H, S, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values
                                  .Arg<ffi::Buffer<ffi::F32>>()  // rotation [2, D / 2] or [0]
                                  .RemainingArgs()               // each layer's present tensors
                                  .Ret<ffi::Buffer<ffi::F32>>()  // stream [1, C]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // keys, aliased
                                  .Ret<ffi::Buffer<ffi::F32>>()  // values, aliased
                                  .Attr<float>("epsilon")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("normalization")
                                  .Attr<int64_t>("present")
                                  .Attr<int64_t>("heads"));
