// The few-row kernel for CPUs without fast bf16 (AVX2 + FMA): a decoding step's float32 products at the memory's
// bandwidth, y (M, N) = x (M, K) · Wᵀ (+ bias) with W (N, K) float32 (pack, linear), and its attention over the
// valid part of a KV buffer (attend). The same operators as rows_kernel.cpp (one library is built per CPU kind).
//
// A decoding step multiplies a handful of rows by every weight once: the product is bound by reading W, and MKL's and
// oneDNN's float32 kernels read it well below the bandwidth a plain stream gets. Here W is packed once (pack) so
// that each block of 8 output columns is one contiguous stream of K × 8 floats; each thread walks whole tiles of 3
// blocks, keeping one accumulator per row and block in registers (4 rows × 3 blocks: 12 of the 16 ymm registers),
// so W is read once for up to 4 rows. More rows walk the tile in chunks of kChunk columns: each group of 4 rows
// runs over the chunk in turn (the partial sums stored in y between chunks), so the chunk comes from memory once and
// the later groups read it from L1 while the next chunk streams in. Sums are float32 over k in order, one fused
// multiply-add per term, the bias added last: the chunks change no result. The packed weight may be float16 instead
// (pack's float32 layout, each value rounded to half): each 8 columns are widened to float32 as they load (F16C), so
// the step reads half the bytes and computes the same float32 sums over the rounded weights.
// Needs AVX2, FMA and F16C; built ahead of time by mrtpo.model.rows_kernel. Also the vocabulary side: the replay's
// chain and the decoding step's draw (vocab_chain.h, shared by both kernels).
// ATen's core tensor and the operators used (not <ATen/ATen.h>: every operator's header, most of a build's time)
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "vocab_chain.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kBlock = 8;  // output columns per packed block: one ymm of float32 accumulators
constexpr int kTile = 3;       // blocks per tile
constexpr int kRows = 4;       // rows per register tile
constexpr int64_t kChunk = 64;  // columns of W per chunk where more than kRows rows share a tile (6 KiB: in L1)

// W (N, K) → (N/8, K, 8): block b, column k holds W[8b + j, k] at [b, k, j]; float32 or float16 (as given).
at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kHalf) && w.device().is_cpu(),
              "rows_kernel.pack: a (N, K) float32 or float16 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % kBlock == 0, "rows_kernel.pack: N a multiple of 8");
  return w.contiguous().view({N / kBlock, kBlock, K}).permute({0, 2, 1}).contiguous();
}

// y[m, n0 + 8v + j] = Σ_k x[m, k] · W[n0 + 8v + j, k] (+ bias) for M ≤ 4 rows and NV ≤ 3 blocks; w: the tile's
// first block. The 12 accumulators are named variables, not an array: with an array the compiler keeps a copy of
// it on the stack, stored on every k (4 rows × 3 blocks + 3 weights + 1 broadcast fill the 16 ymm registers).
#define MRTPO_ROW(m)                                                                   \
  if constexpr (M > m) {                                                               \
    const __m256 a = _mm256_broadcast_ss(x + m * K + k);                               \
    c##m##0 = _mm256_fmadd_ps(a, w0, c##m##0);                                         \
    if constexpr (NV > 1) c##m##1 = _mm256_fmadd_ps(a, w1, c##m##1);                   \
    if constexpr (NV > 2) c##m##2 = _mm256_fmadd_ps(a, w2, c##m##2);                   \
  }
#define MRTPO_STORE(m, v)                                                              \
  if constexpr (M > m && NV > v) {                                                     \
    float* out = y + m * N + n0 + v * kBlock;                                          \
    _mm256_storeu_ps(out, last && bias ? _mm256_add_ps(c##m##v, _mm256_loadu_ps(bias + n0 + v * kBlock)) : c##m##v); \
  }
#define MRTPO_LOAD(m, v)                                                               \
  if constexpr (M > m && NV > v) c##m##v = _mm256_loadu_ps(y + m * N + n0 + v * kBlock);

// 8 packed weights as float32: a float32 weight as it is, a float16 one widened (exactly).
inline __m256 load_w(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load_w(const at::Half* w) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}

// Columns [k0, k1) of the tile's sums: started at 0 where k0 = 0, else from the partial sums in y; the bias added
// where k1 = K (`last`). W: the packed weight's type (float or at::Half).
template <int M, int NV, typename W>
inline void tile(const float* x, int64_t K, const W* w, const float* bias, float* y, int64_t N, int64_t n0,
                 int64_t k0, int64_t k1, bool chunked) {
  static_assert(M <= kRows && NV <= kTile);
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00, c21 = c00,
         c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  const bool last = k1 == K;
  if (k0 > 0) {
    MRTPO_LOAD(0, 0) MRTPO_LOAD(0, 1) MRTPO_LOAD(0, 2) MRTPO_LOAD(1, 0) MRTPO_LOAD(1, 1) MRTPO_LOAD(1, 2)
    MRTPO_LOAD(2, 0) MRTPO_LOAD(2, 1) MRTPO_LOAD(2, 2) MRTPO_LOAD(3, 0) MRTPO_LOAD(3, 1) MRTPO_LOAD(3, 2)
  }
  const int64_t stride = K * kBlock;  // between blocks
  const W* w1p = w + stride;
  const W* w2p = w + 2 * stride;
  for (int64_t k = k0; k < k1; ++k) {
    if (chunked && (k & 1) == 0) {  // the next chunk's lines, one per block every other column: in L1 when it starts
      _mm_prefetch(reinterpret_cast<const char*>(w + (k + kChunk) * kBlock), _MM_HINT_T0);
      if constexpr (NV > 1) _mm_prefetch(reinterpret_cast<const char*>(w1p + (k + kChunk) * kBlock), _MM_HINT_T0);
      if constexpr (NV > 2) _mm_prefetch(reinterpret_cast<const char*>(w2p + (k + kChunk) * kBlock), _MM_HINT_T0);
    }
    const __m256 w0 = load_w(w + k * kBlock);
    const __m256 w1 = NV > 1 ? load_w(w1p + k * kBlock) : w0;
    const __m256 w2 = NV > 2 ? load_w(w2p + k * kBlock) : w0;
    MRTPO_ROW(0) MRTPO_ROW(1) MRTPO_ROW(2) MRTPO_ROW(3)
  }
  MRTPO_STORE(0, 0) MRTPO_STORE(0, 1) MRTPO_STORE(0, 2) MRTPO_STORE(1, 0) MRTPO_STORE(1, 1) MRTPO_STORE(1, 2)
  MRTPO_STORE(2, 0) MRTPO_STORE(2, 1) MRTPO_STORE(2, 2) MRTPO_STORE(3, 0) MRTPO_STORE(3, 1) MRTPO_STORE(3, 2)
}
#undef MRTPO_ROW
#undef MRTPO_STORE
#undef MRTPO_LOAD

template <int NV, typename W>
void rows(const float* x, int64_t M, int64_t K, const W* w, const float* bias, float* y, int64_t N, int64_t n0) {
  const bool chunked = M > kRows;
  const int64_t chunk = chunked ? kChunk : K;
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t k1 = std::min(K, k0 + chunk);
    for (int64_t m0 = 0; m0 < M; m0 += kRows) {
      const float* xm = x + m0 * K;
      float* ym = y + m0 * N;
      const int64_t r = std::min<int64_t>(M - m0, kRows);
      if (r == 1) tile<1, NV, W>(xm, K, w, bias, ym, N, n0, k0, k1, chunked);
      else if (r == 2) tile<2, NV, W>(xm, K, w, bias, ym, N, n0, k0, k1, chunked);
      else if (r == 3) tile<3, NV, W>(xm, K, w, bias, ym, N, n0, k0, k1, chunked);
      else tile<4, NV, W>(xm, K, w, bias, ym, N, n0, k0, k1, chunked);
    }
  }
}

template <typename W>
void linear_rows(const float* xp, int64_t M, int64_t K, const W* wp, const float* bp, float* yp, int64_t N) {
  const int64_t blocks = N / kBlock, tiles = (blocks + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t * kTile, n0 = b * kBlock;
      const W* wt = wp + b * K * kBlock;
      switch (std::min<int64_t>(blocks - b, kTile)) {
        case 1: rows<1>(xp, M, K, wt, bp, yp, N, n0); break;
        case 2: rows<2>(xp, M, K, wt, bp, yp, N, n0); break;
        default: rows<kTile>(xp, M, K, wt, bp, yp, N, n0); break;
      }
    }
  });
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && packed.dim() == 3 && packed.size(2) == kBlock &&
                  (packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kHalf) &&
                  packed.is_contiguous() && x_in.device().is_cpu(),
              "rows_kernel.linear: float32 CPU rows and a weight packed by rows_kernel.pack (float32 or float16)");
  const int64_t K = x_in.size(-1), N = packed.size(0) * kBlock;
  TORCH_CHECK(packed.size(1) == K, "rows_kernel.linear: x has ", K, " columns, the weight ", packed.size(1));
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options());
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    TORCH_CHECK(bias_in->numel() == N, "rows_kernel.linear: a bias of ", N, " values");
    bias = bias_in->to(at::kFloat).contiguous();
  }
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (packed.scalar_type() == at::kHalf)
    linear_rows(xp, M, K, packed.data_ptr<at::Half>(), bp, yp, N);
  else
    linear_rows(xp, M, K, packed.data_ptr<float>(), bp, yp, N);
  return y;
}

using mrtpo_avx2::exp_ps;  // (vocab_chain.h: e^x within about an ulp, exactly 0 below −87, −∞ included)
using mrtpo_avx2::hsum;

// hsum of four vectors at once, → [hsum(a), hsum(b), hsum(c), hsum(d)]: the same additions in the same order as
// hsum (each lane: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))), so a score is the same to the bit.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m128 x0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 x1 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  __m128 x2 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  __m128 x3 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
  _MM_TRANSPOSE4_PS(x0, x1, x2, x3);  // x_i: lane i of each
  return _mm_add_ps(_mm_add_ps(x0, x2), _mm_add_ps(x1, x3));
}

// Scores of QJ ≤ 3 queries (q, rows of d) against TK ≤ 4 keys (k, rows of d): s[j * L + t] = scale · q_j·k_t, each
// dot product over d in order (a multiply, then one fused multiply-add per block of 8) and summed as hsum does. The
// 12 accumulators, 3 queries and a key fill the 16 ymm registers; each key is loaded once for the QJ queries.
template <int QJ, int TK>
inline void score_tile(const float* q, const float* k, int64_t d, float* s, int64_t L, float scale) {
  __m256 acc[QJ][4];
  for (int64_t c = 0; c < d; c += kBlock) {
    __m256 qv[QJ];
    for (int j = 0; j < QJ; ++j) qv[j] = _mm256_loadu_ps(q + j * d + c);
    for (int t = 0; t < TK; ++t) {
      const __m256 kv = _mm256_loadu_ps(k + t * d + c);
      for (int j = 0; j < QJ; ++j)
        acc[j][t] = c == 0 ? _mm256_mul_ps(qv[j], kv) : _mm256_fmadd_ps(qv[j], kv, acc[j][t]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  for (int j = 0; j < QJ; ++j) {
    const __m256 z = _mm256_setzero_ps();
    const __m128 v = _mm_mul_ps(hsum4(acc[j][0], TK > 1 ? acc[j][1] : z, TK > 2 ? acc[j][2] : z,
                                      TK > 3 ? acc[j][3] : z), sc);
    alignas(16) float out[4];
    _mm_store_ps(out, v);
    for (int t = 0; t < TK; ++t) s[j * L + t] = out[t];
  }
}

// Scores of QJ queries against `count` keys stored one after another.
template <int QJ>
void score_keys(const float* q, const float* k, int64_t count, int64_t d, float* s, int64_t L, float scale) {
  int64_t t = 0;
  for (; t + 4 <= count; t += 4) score_tile<QJ, 4>(q, k + t * d, d, s + t, L, scale);
  switch (count - t) {
    case 3: score_tile<QJ, 3>(q, k + t * d, d, s + t, L, scale); break;
    case 2: score_tile<QJ, 2>(q, k + t * d, d, s + t, L, scale); break;
    case 1: score_tile<QJ, 1>(q, k + t * d, d, s + t, L, scale); break;
    default: break;
  }
}

// o[j][c] += Σ_u w[j * L + u] · v_u[c0 + c] for QJ ≤ 3 queries and CB ≤ 4 blocks of 8 columns from c0, over `count`
// values stored one after another from position u0: one fused multiply-add per term, u in order (12 accumulators,
// 3 weights; the values read from L1 as operands).
template <int QJ, int CB>
inline void value_tile(const float* w, int64_t L, int64_t u0, const float* v, int64_t count, int64_t d, int64_t c0,
                       __m256* o) {
  __m256 acc[QJ][4];
  for (int j = 0; j < QJ; ++j)
    for (int c = 0; c < CB; ++c) acc[j][c] = o[j * 32 + c];
  for (int64_t u = 0; u < count; ++u) {
    const float* val = v + u * d + c0;
    for (int j = 0; j < QJ; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j * L + u0 + u]);
      for (int c = 0; c < CB; ++c) acc[j][c] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(val + c * kBlock), acc[j][c]);
    }
  }
  for (int j = 0; j < QJ; ++j)
    for (int c = 0; c < CB; ++c) o[j * 32 + c] = acc[j][c];
}

template <int QJ>
void value_keys(const float* w, int64_t L, int64_t u0, const float* v, int64_t count, int64_t d, __m256* o) {
  const int64_t dv = d / kBlock;
  for (int64_t c = 0; c < dv; c += 4) {
    switch (std::min<int64_t>(dv - c, 4)) {
      case 4: value_tile<QJ, 4>(w, L, u0, v, count, d, c * kBlock, o + c); break;
      case 3: value_tile<QJ, 3>(w, L, u0, v, count, d, c * kBlock, o + c); break;
      case 2: value_tile<QJ, 2>(w, L, u0, v, count, d, c * kBlock, o + c); break;
      default: value_tile<QJ, 1>(w, L, u0, v, count, d, c * kBlock, o + c); break;
    }
  }
}

// Where one (row, kv head)'s keys and values are: positions [0, shared) at kpre / vpre (the rows' common prefix, read
// from the first row's buffer), [shared, valid) at kp / vp (its own), then the step's own key and value.
struct Keys {
  const float *kpre, *vpre, *kp, *vp, *knp, *vnp;
  int64_t shared, valid;
};

// QJ ≤ 3 queries (rows of d at q) over one (row, kv head)'s keys as `k` places them, L = valid + 1 in all: their scores
// into s (QJ, L), then the weights e^{s_t − m} in place, then out_j = Σ_t e_jt v_t / Σ_t e_jt.
template <int QJ>
void attend_queries(const float* q, const Keys& k, int64_t d, float scale, float* s, float* out) {
  const int64_t L = k.valid + 1;
  score_keys<QJ>(q, k.kpre, k.shared, d, s, L, scale);
  score_keys<QJ>(q, k.kp + k.shared * d, k.valid - k.shared, d, s + k.shared, L, scale);
  score_keys<QJ>(q, k.knp, 1, d, s + k.valid, L, scale);
  float inv[3];
  for (int j = 0; j < QJ; ++j) {  // the weights in place, the output scaled by 1 / their sum
    float* sj = s + j * L;
    float m = -INFINITY;
    for (int64_t t = 0; t < L; ++t) m = std::max(m, sj[t]);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 total = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + kBlock <= L; t += kBlock) {
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sj + t), mv));
      total = _mm256_add_ps(total, e);
      _mm256_storeu_ps(sj + t, e);
    }
    float sum = hsum(total);
    for (; t < L; ++t) {  // the tail (fewer than 8 keys): the same polynomial, one lane at a time
      const float e = _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(sj[t] - m)));
      sum += e;
      sj[t] = e;
    }
    inv[j] = 1.0f / sum;
  }
  __m256 o[3 * 32];  // Σ_u e_u v_u per query (rows of 32 blocks: d ≤ 256), u in order over the three parts
  const int64_t dv = d / kBlock;
  for (int j = 0; j < QJ; ++j)
    for (int64_t c = 0; c < dv; ++c) o[j * 32 + c] = _mm256_setzero_ps();
  value_keys<QJ>(s, L, 0, k.vpre, k.shared, d, o);
  value_keys<QJ>(s, L, k.shared, k.vp + k.shared * d, k.valid - k.shared, d, o);
  value_keys<QJ>(s, L, k.valid, k.vnp, 1, d, o);
  for (int j = 0; j < QJ; ++j) {
    const __m256 iv = _mm256_set1_ps(inv[j]);
    for (int64_t c = 0; c < dv; ++c) _mm256_storeu_ps(out + j * d + c * kBlock, _mm256_mul_ps(o[j * 32 + c], iv));
  }
}

// One (row, kv head): its r queries, 3 at a time, over the `valid` cached keys and the own one (d a multiple of 8):
//   out = Σ_t e^{s_t − m} v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t,  m = max_t s_t, all in float32.
void attend_task(const float* q, const Keys& k, float* out, int64_t d, int64_t r, float scale, float* s) {
  for (int64_t j = 0; j < r; j += 3) {
    switch (std::min<int64_t>(r - j, 3)) {
      case 3: attend_queries<3>(q + j * d, k, d, scale, s, out + j * d); break;
      case 2: attend_queries<2>(q + j * d, k, d, scale, s, out + j * d); break;
      default: attend_queries<1>(q + j * d, k, d, scale, s, out + j * d); break;
    }
  }
}

// A decoding step's attention, one query per row and query head, the r query heads of each kv head together, over
// the `valid` cached keys K[..., :valid, :] and the step's own key k_new. q (n, kv, r, d); K, V (n, kv, T, d);
// k_new, v_new (n, kv, d); float32, d a multiple of 8 up to 256; `pos` the number of valid positions (a float32
// scalar, as the step's rotary angle takes it). `shared` (an int64 scalar, absent: 0): the first positions every
// row holds alike (a group's prompt), read from the first row's buffer for all rows; the (row, kv head) pairs run
// head by head, so a head's common keys are read from memory once and from cache for the other rows.
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& K, const at::Tensor& V, const at::Tensor& k_in,
                  const at::Tensor& v_in, const at::Tensor& pos, double scale,
                  const std::optional<at::Tensor>& shared_in) {
  TORCH_CHECK(q_in.dim() == 4 && K.dim() == 4 && V.sizes() == K.sizes() && q_in.scalar_type() == at::kFloat &&
                  K.scalar_type() == at::kFloat && V.scalar_type() == at::kFloat &&
                  k_in.scalar_type() == at::kFloat && v_in.scalar_type() == at::kFloat && K.is_contiguous() &&
                  V.is_contiguous(), "rows_kernel.attend: float32 q (n, kv, r, d) and contiguous K, V (n, kv, T, d)");
  // q and the new keys and values are read where they are (the step's views into its q/k/v product: rows apart by
  // more than their size) where a head's r queries, and each row of d, lie one after another; else copied so
  const at::Tensor q = q_in.stride(3) == 1 && q_in.stride(2) == q_in.size(3) ? q_in : q_in.contiguous();
  const int64_t n = q.size(0), kv = q.size(1), r = q.size(2), d = q.size(3), T = K.size(2);
  TORCH_CHECK(k_in.numel() == n * kv * d && v_in.numel() == n * kv * d, "rows_kernel.attend: shapes");
  auto heads_of_d = [&](const at::Tensor& t) {  // (n, kv, d), each row of d contiguous
    return t.dim() == 3 && t.size(0) == n && t.size(1) == kv && t.stride(2) == 1 ? t
                                                                                  : t.contiguous().view({n, kv, d});
  };
  const at::Tensor kn = heads_of_d(k_in), vn = heads_of_d(v_in);
  const int64_t valid = static_cast<int64_t>(pos.item<float>());
  const int64_t shared = shared_in.has_value() && shared_in->defined() ? shared_in->item<int64_t>() : 0;
  TORCH_CHECK(K.size(0) == n && K.size(1) == kv && K.size(3) == d && d % kBlock == 0 && d <= 256 && r <= 16 &&
                  0 <= valid && valid <= T,
              "rows_kernel.attend: shapes");
  TORCH_CHECK(0 <= shared && shared <= valid, "rows_kernel.attend: shared (", shared, ") outside 0 … pos (", valid,
              ")");
  at::Tensor out = at::empty({n, kv, r, d}, q.options());  // contiguous
  const float *qp = q.data_ptr<float>(), *Kp = K.data_ptr<float>(), *Vp = V.data_ptr<float>();
  const float *knp = kn.data_ptr<float>(), *vnp = vn.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, n * kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(3 * (valid + 1)));  // scores, then weights: (3, valid + 1)
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / n, row = u % n, t = row * kv + h;  // head by head: task t = (row, head)
      const Keys k{Kp + h * T * d,
                   Vp + h * T * d,
                   Kp + t * T * d,
                   Vp + t * T * d,
                   knp + row * kn.stride(0) + h * kn.stride(1),
                   vnp + row * vn.stride(0) + h * vn.stride(1),
                   shared,
                   valid};
      attend_task(qp + row * q.stride(0) + h * q.stride(1), k, op + t * r * d, d, r, sc, s.data());
    }
  });
  return out;
}

// The replay's pass attention is bf16-only (rows_kernel.cpp); float32 passes run SDPA's kernels.
at::Tensor attend_pass(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                       int64_t, double) {
  TORCH_CHECK(false, "rows_kernel.attend_pass: not in the float32 (AVX2) kernel; float32 passes run SDPA");
}

}  // namespace

TORCH_LIBRARY(mrtpo_rows, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias=None) -> Tensor");
  m.def("attend(Tensor q, Tensor K, Tensor V, Tensor k_new, Tensor v_new, Tensor pos, float scale, "
        "Tensor? shared=None) -> Tensor");
  m.def("attend_pass(Tensor q, Tensor keys, Tensor values, Tensor? seen, int past, float scale) -> Tensor");
  m.def("vocab_chain(Tensor z, Tensor y, bool exact, Tensor? bias=None) -> (Tensor, Tensor, Tensor)");
  m.def("draw(Tensor z, Tensor u, float temperature) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mrtpo_rows, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
  m.impl("attend", &attend);
  m.impl("attend_pass", &attend_pass);
  m.impl("vocab_chain", &mrtpo_avx2::vocab_chain);
  m.impl("draw", &mrtpo_avx2::draw);
}
