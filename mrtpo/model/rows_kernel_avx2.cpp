// The few-row kernel for CPUs without fast bf16 (AVX2 + FMA): a decoding step's float32 products at the memory's
// bandwidth, y (M, N) = x (M, K) · Wᵀ (+ bias) with W (N, K) float32 (pack, linear), and its attention over the
// valid part of a KV buffer (attend). The same operators as rows_kernel.cpp (one library is built per CPU kind).
//
// A decoding step multiplies a handful of rows by every weight once: the product is bound by reading W, and MKL's and
// oneDNN's float32 kernels read it well below the bandwidth a plain stream gets. Here W is packed once (pack) so
// that each block of 8 output columns is one contiguous stream of K × 8 floats; each thread walks whole tiles of 3
// blocks, keeping one accumulator per row and block in registers (4 rows × 3 blocks: 12 of the 16 ymm registers),
// so W is read once for up to 4 rows; more rows read the tile again, then in L2, per 4. Sums are float32 over k in
// order, one fused multiply-add per term, the bias added last.
// Needs AVX2 and FMA; built ahead of time by mrtpo.model.rows_kernel. Also the replay's vocabulary chain
// (vocab_chain.h, shared by both kernels).
#include <ATen/ATen.h>
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

// W (N, K) → (N/8, K, 8): block b, column k holds W[8b + j, k] at [b, k, j].
at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(),
              "rows_kernel.pack: a (N, K) float32 CPU tensor");
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
    _mm256_storeu_ps(out, bias ? _mm256_add_ps(c##m##v, _mm256_loadu_ps(bias + n0 + v * kBlock)) : c##m##v); \
  }

template <int M, int NV>
inline void tile(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N, int64_t n0) {
  static_assert(M <= kRows && NV <= kTile);
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00, c21 = c00,
         c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  const int64_t stride = K * kBlock;  // between blocks
  const float* w1p = w + stride;
  const float* w2p = w + 2 * stride;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kBlock);
    const __m256 w1 = NV > 1 ? _mm256_loadu_ps(w1p + k * kBlock) : w0;
    const __m256 w2 = NV > 2 ? _mm256_loadu_ps(w2p + k * kBlock) : w0;
    MRTPO_ROW(0) MRTPO_ROW(1) MRTPO_ROW(2) MRTPO_ROW(3)
  }
  MRTPO_STORE(0, 0) MRTPO_STORE(0, 1) MRTPO_STORE(0, 2) MRTPO_STORE(1, 0) MRTPO_STORE(1, 1) MRTPO_STORE(1, 2)
  MRTPO_STORE(2, 0) MRTPO_STORE(2, 1) MRTPO_STORE(2, 2) MRTPO_STORE(3, 0) MRTPO_STORE(3, 1) MRTPO_STORE(3, 2)
}
#undef MRTPO_ROW
#undef MRTPO_STORE

template <int NV>
void rows(const float* x, int64_t M, int64_t K, const float* w, const float* bias, float* y, int64_t N, int64_t n0) {
  for (int64_t m0 = 0; m0 < M; m0 += kRows) {
    const float* xm = x + m0 * K;
    float* ym = y + m0 * N;
    const int64_t r = std::min<int64_t>(M - m0, kRows);
    if (r == 1) tile<1, NV>(xm, K, w, bias, ym, N, n0);
    else if (r == 2) tile<2, NV>(xm, K, w, bias, ym, N, n0);
    else if (r == 3) tile<3, NV>(xm, K, w, bias, ym, N, n0);
    else tile<4, NV>(xm, K, w, bias, ym, N, n0);
  }
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.dim() == 3 &&
                  packed.size(2) == kBlock && packed.is_contiguous() && x_in.device().is_cpu(),
              "rows_kernel.linear: float32 CPU rows and a weight packed by rows_kernel.pack");
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
  const float* wp = packed.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t blocks = N / kBlock, tiles = (blocks + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t * kTile, n0 = b * kBlock;
      const float* wt = wp + b * K * kBlock;
      switch (std::min<int64_t>(blocks - b, kTile)) {
        case 1: rows<1>(xp, M, K, wt, bp, yp, N, n0); break;
        case 2: rows<2>(xp, M, K, wt, bp, yp, N, n0); break;
        default: rows<kTile>(xp, M, K, wt, bp, yp, N, n0); break;
      }
    }
  });
  return y;
}

using mrtpo_avx2::exp_ps;  // (vocab_chain.h: e^x within about an ulp, exactly 0 below −87, −∞ included)
using mrtpo_avx2::hsum;

// One (row, kv head): its r queries over the `valid` cached keys and the own one (d a multiple of 8):
//   out = Σ_t e^{s_t − m} v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t,  m = max_t s_t, all in float32.
void attend_task(const float* q, const float* kp, const float* vp, const float* knp, const float* vnp, float* out,
                 int64_t valid, int64_t d, int64_t r, float scale, float* s) {
  const int64_t L = valid + 1, dv = d / kBlock;
  for (int64_t t = 0; t < L; ++t) {  // s (r, L): the scores
    const float* key = t < valid ? kp + t * d : knp;
    for (int64_t j = 0; j < r; ++j) {
      const float* qj = q + j * d;
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qj), _mm256_loadu_ps(key));
      for (int64_t c = 1; c < dv; ++c)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qj + c * kBlock), _mm256_loadu_ps(key + c * kBlock), acc);
      s[j * L + t] = hsum(acc) * scale;
    }
  }
  for (int64_t j = 0; j < r; ++j) {  // the weights in place, the output scaled by 1 / their sum
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
    __m256 o[256 / kBlock];  // Σ_u e_u v_u, each value row read once in order
    for (int64_t c = 0; c < dv; ++c) o[c] = _mm256_setzero_ps();
    for (int64_t u = 0; u < L; ++u) {
      const float* val = u < valid ? vp + u * d : vnp;
      const __m256 w = _mm256_set1_ps(sj[u]);
      for (int64_t c = 0; c < dv; ++c) o[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(val + c * kBlock), o[c]);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t c = 0; c < dv; ++c) _mm256_storeu_ps(out + j * d + c * kBlock, _mm256_mul_ps(o[c], inv));
  }
}

// A decoding step's attention, one query per row and query head, the r query heads of each kv head together, over
// the `valid` cached keys K[..., :valid, :] and the step's own key k_new. q (n, kv, r, d); K, V (n, kv, T, d);
// k_new, v_new (n, kv, d); float32, d a multiple of 8 up to 256; `pos` the number of valid positions (a float32
// scalar, as the step's rotary angle takes it).
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& K, const at::Tensor& V, const at::Tensor& k_in,
                  const at::Tensor& v_in, const at::Tensor& pos, double scale) {
  TORCH_CHECK(q_in.dim() == 4 && K.dim() == 4 && V.sizes() == K.sizes() && q_in.scalar_type() == at::kFloat &&
                  K.scalar_type() == at::kFloat && V.scalar_type() == at::kFloat &&
                  k_in.scalar_type() == at::kFloat && v_in.scalar_type() == at::kFloat && K.is_contiguous() &&
                  V.is_contiguous(), "rows_kernel.attend: float32 q (n, kv, r, d) and contiguous K, V (n, kv, T, d)");
  const at::Tensor q = q_in.contiguous(), kn = k_in.contiguous(), vn = v_in.contiguous();
  const int64_t n = q.size(0), kv = q.size(1), r = q.size(2), d = q.size(3), T = K.size(2);
  const int64_t valid = static_cast<int64_t>(pos.item<float>());
  TORCH_CHECK(K.size(0) == n && K.size(1) == kv && K.size(3) == d && d % kBlock == 0 && d <= 256 && r <= 16 &&
                  kn.numel() == n * kv * d && vn.numel() == n * kv * d && 0 <= valid && valid <= T,
              "rows_kernel.attend: shapes");
  at::Tensor out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *Kp = K.data_ptr<float>(), *Vp = V.data_ptr<float>();
  const float *knp = kn.data_ptr<float>(), *vnp = vn.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, n * kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(r * (valid + 1)));  // scores, then weights: (r, valid + 1)
    for (int64_t t = begin; t < end; ++t)
      attend_task(qp + t * r * d, Kp + t * T * d, Vp + t * T * d, knp + t * d, vnp + t * d, op + t * r * d, valid, d,
                  r, sc, s.data());
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
  m.def("attend(Tensor q, Tensor K, Tensor V, Tensor k_new, Tensor v_new, Tensor pos, float scale) -> Tensor");
  m.def("attend_pass(Tensor q, Tensor keys, Tensor values, Tensor? seen, int past, float scale) -> Tensor");
  m.def("vocab_chain(Tensor z, Tensor y, bool exact, Tensor? bias=None) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mrtpo_rows, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
  m.impl("attend", &attend);
  m.impl("attend_pass", &attend_pass);
  m.impl("vocab_chain", &mrtpo_avx2::vocab_chain);
}
