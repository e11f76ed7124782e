// The replay's vocabulary chain in one kernel (mrtpo.replay.vocab): from a chunk's logits under P_all and each
// variant prompt to the JS distances and the sampled tokens' log-probabilities, reading each row of logits a few times
// from cache instead of making the fifteen passes of torch's element-wise chain over memory. AVX2 + FMA float32
// lanes, so both kernel libraries include it (rows_kernel.cpp, rows_kernel_avx2.cpp): every CPU that runs one has
// AVX2. At its end, a decoding step's draw from its logits (draw): the same kind of pass over a row of the vocabulary.
//
// Per token t and variant k, with z_all the P_all logits and z_k the variant's (+ the head's bias b where it has one):
//   log p = z_all − m_p − log Σ e^{z_all − m_p},   log q = z_k − m_q − log Σ e^{z_k − m_q}      (torch's log_softmax)
//   JS(p, q)² = ½ Σ_v p log(p/m) + q log(q/m) = −½ Σ_v max(p, q) · g(a),   m = ½(p + q),  a = |log q − log p|,
//   g(a) = a e^{−a} + (1 + e^{−a}) log((1 + e^{−a}) / 2)    (≤ 0: the term over max(p, q); min(p, q) = max · e^{−a})
// g is a polynomial below a = 1 (its Taylor series to a¹³: −a²/4 + a³/8 − a⁴/32 + …, within 2e−8 relatively) and the
// formula above it, so a term of close distributions (a ≪ 1, where the formula's two parts cancel) keeps its relative
// accuracy. a is taken as |(z_k − z_all) − (lse_q − lse_p)|: below float32 the difference z_k − z_all is what the
// projection made (exact), and the constant comes from the rows' sums in double. A −∞ logit (probability 0) gives
// a = ∞, read as a large finite number: g = −ln 2, the term −max(p, q) ln 2, as mrtpo.core.js.js_distance reads it.
#pragma once

// ATen's core tensor and the operators used (not <ATen/ATen.h>: every operator's header, most of a build's time)
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace mrtpo_avx2 {

// e^x for float32 lanes (x ≤ 0 here): 2^n · p(r), x = n ln 2 + r, |r| ≤ ln 2 / 2, p a degree-6 polynomial (Cephes'
// expf coefficients, as rows_kernel.cpp's); within about an ulp of expf, exactly 0 below −87 (−∞ included).
inline __m256 exp_ps(__m256 x_in) {
  const __m256 live = _mm256_cmp_ps(x_in, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m256 x = _mm256_max_ps(x_in, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n from its exponent bits (n ≥ −126 here: x ≥ −87.3)
  const __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(live, _mm256_mul_ps(p, two_n));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// Adds 8 float32 lanes into 4 + 4 double lanes (a row's sums: 49k–262k terms, summed in double per lane).
inline void add_double(__m256 v, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

inline double hsum_double(__m256d lo, __m256d hi) {
  alignas(32) double s[4];
  _mm256_store_pd(s, _mm256_add_pd(lo, hi));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// log y for y ∈ [½, 1] (Cephes' logf: x = 2y − 1 and −ln 2 below √½, else x = y − 1; log(1 + x) by its polynomial).
inline __m256 log_half_ps(__m256 y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 low = _mm256_cmp_ps(y, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  const __m256 x = _mm256_sub_ps(_mm256_blendv_ps(y, _mm256_add_ps(y, y), low), one);
  const __m256 e = _mm256_and_ps(low, _mm256_set1_ps(-1.0f));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(7.0376836292e-2f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(-1.1514610310e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.1676998740e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(-1.2420140846e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.4249322787e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(-1.6668057665e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(2.0000714765e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(-2.4999993993e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(3.3333331174e-1f));
  p = _mm256_mul_ps(_mm256_mul_ps(p, x), z);
  p = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), p);
  p = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, p);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(x, p));
}

// g(a) (header comment) for a ≥ 0, finite: the series below 1, the formula above.
inline __m256 js_g_ps(__m256 a) {
  // −a²/4 + a³/8 − a⁴/32 + a⁵/192 − a⁶/1152 + a⁷/5760 − a⁸/46080 − a⁹/1935360 + a¹⁰/19353600 + 11a¹¹/58060800
  //   − 11a¹²/696729600 − 97a¹³/7664025600
  __m256 s = _mm256_set1_ps(-97.0f / 7664025600.0f);
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-11.0f / 696729600.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(11.0f / 58060800.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(1.0f / 19353600.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-1.0f / 1935360.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-1.0f / 46080.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(1.0f / 5760.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-1.0f / 1152.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(1.0f / 192.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-1.0f / 32.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(1.0f / 8.0f));
  s = _mm256_fmadd_ps(s, a, _mm256_set1_ps(-1.0f / 4.0f));
  s = _mm256_mul_ps(_mm256_mul_ps(s, a), a);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 near = _mm256_cmp_ps(a, one, _CMP_LT_OQ);
  if (_mm256_movemask_ps(near) == 0xff) return s;  // (most lanes: the distributions differ little per token)
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), a));
  const __m256 ope = _mm256_add_ps(one, e);
  const __m256 log_m = log_half_ps(_mm256_mul_ps(ope, _mm256_set1_ps(0.5f)));  // log((1 + e^{−a}) / 2)
  const __m256 direct = _mm256_fmadd_ps(a, e, _mm256_mul_ps(ope, log_m));
  return _mm256_blendv_ps(direct, s, near);
}

// 8 values from p (float32 or bf16) as float32; past `count` (a row's tail) `fill`.
inline __m256 load8(const float* p, int64_t count, float fill) {
  if (count >= 8) return _mm256_loadu_ps(p);
  alignas(32) float buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = i < count ? p[i] : fill;
  return _mm256_load_ps(buf);
}

inline __m256 load8(const c10::BFloat16* p, int64_t count, float fill) {
  if (count >= 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  alignas(32) float buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = i < count ? static_cast<float>(p[i]) : fill;
  return _mm256_load_ps(buf);
}

// A row's log-softmax constants: its maximum m and log Σ_v e^{x_v − m} (x the row's logits + bias).
struct Lse {
  float max;
  float log_sum;
};

// The rows of logits: P_all's, and each variant's: z_k (+ bias) where kExact, else z_all + the difference (+ bias);
// E the logits' type (the flags are template parameters: no branch in the loops over the vocabulary).
template <typename E, bool kExact, bool kBias>
struct Rows {
  const E* z;       // (1 + k, n, V)
  const float* b;   // (V,) where kBias
  int64_t n, V;

  // logits of row (j, t) at v..v+7 (j = 0: P_all); past V: −∞
  __m256 at(int64_t j, int64_t t, int64_t v) const {
    if (kExact && j > 0) {  // the variant's own logits: P_all's row is not read
      const int64_t left = V - v;
      const __m256 u = load8(z + (j * n + t) * V + v, left, -INFINITY);
      return kBias ? _mm256_add_ps(u, load8(b + v, left, 0.0f)) : u;
    }
    __m256 zp, zq, dz;
    pair(j, t, v, zp, zq, dz);
    return j == 0 ? zp : zq;
  }

  // P_all's logits zp and variant j's zq at v..v+7 (past V: −∞), and their difference dz = zq − zp: below float32
  // the projection's own difference (exact), not a difference of the rounded sums
  void pair(int64_t j, int64_t t, int64_t v, __m256& zp, __m256& zq, __m256& dz) const {
    const int64_t left = V - v;
    const float inf = -INFINITY;
    const __m256 z0 = load8(z + t * V + v, left, inf);
    const __m256 bv = kBias ? load8(b + v, left, 0.0f) : _mm256_setzero_ps();
    zp = kBias ? _mm256_add_ps(z0, bv) : z0;
    if (j == 0) {
      zq = zp;
      dz = _mm256_setzero_ps();
      return;
    }
    const __m256 u = load8(z + (j * n + t) * V + v, left, kExact ? inf : 0.0f);
    if constexpr (kExact) {  // the bias cancels in the difference
      zq = kBias ? _mm256_add_ps(u, bv) : u;
      dz = _mm256_sub_ps(u, z0);
    } else {
      zq = _mm256_add_ps(zp, u);
      dz = u;
    }
  }

  float one(int64_t j, int64_t t, int64_t v) const {
    float x = static_cast<float>(z[t * V + v]);
    if (j > 0) {
      const float u = static_cast<float>(z[(j * n + t) * V + v]);
      x = kExact ? u : x + u;
    }
    return kBias ? x + b[v] : x;
  }
};

// Sums of many float32 lanes: 16 vectors at a time in float32, those partial sums in double.
constexpr int64_t kSpan = 128;

template <typename R>
Lse row_lse(const R& r, int64_t j, int64_t t) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t v = 0; v < r.V; v += 8) mv = _mm256_max_ps(mv, r.at(j, t, v));
  const float m = hmax(mv);
  if (!std::isfinite(m)) return {m, 0.0f};  // every logit −∞ (or one +∞, NaN): the chain's NaN
  const __m256 mm = _mm256_set1_ps(m);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (int64_t v0 = 0; v0 < r.V; v0 += kSpan) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t v = v0; v < std::min(v0 + kSpan, r.V); v += 8)
      acc = _mm256_add_ps(acc, exp_ps(_mm256_sub_ps(r.at(j, t, v), mm)));
    add_double(acc, lo, hi);
  }
  return {m, static_cast<float>(std::log(hsum_double(lo, hi)))};
}

// −2 · JS(p, q)² = Σ_v max(p, q) · g(a) for rows (0, t) and (j, t) of log-softmax constants lp, lq.
template <typename R>
float js_squared(const R& r, int64_t j, int64_t t, Lse lp, Lse lq) {
  const __m256 mp = _mm256_set1_ps(lp.max), sp = _mm256_set1_ps(lp.log_sum);
  const __m256 mq = _mm256_set1_ps(lq.max), sq = _mm256_set1_ps(lq.log_sum);
  // lse_q − lse_p, in double: a = |(z_k − z_all) − c|
  const __m256 c = _mm256_set1_ps(static_cast<float>((static_cast<double>(lq.max) + lq.log_sum) -
                                                     (static_cast<double>(lp.max) + lp.log_sum)));
  const __m256 big = _mm256_set1_ps(1e30f), sign = _mm256_set1_ps(-0.0f);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (int64_t v0 = 0; v0 < r.V; v0 += kSpan) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t v = v0; v < std::min(v0 + kSpan, r.V); v += 8) {
      __m256 zp, zq, dz;
      r.pair(j, t, v, zp, zq, dz);
      const __m256 log_p = _mm256_sub_ps(_mm256_sub_ps(zp, mp), sp);
      const __m256 log_q = _mm256_sub_ps(_mm256_sub_ps(zq, mq), sq);
      // |·| − c, NaN (both −∞) and ∞ as a large finite number (min returns its second operand for a NaN)
      const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(dz, c)), big);
      const __m256 top = exp_ps(_mm256_max_ps(log_p, log_q));  // max(p, q); 0 where both are −∞
      acc = _mm256_fmadd_ps(top, js_g_ps(a), acc);
    }
    add_double(acc, lo, hi);
  }
  return static_cast<float>(hsum_double(lo, hi));
}

// z (1 + k, n, V): P_all's logits, then k variants' (exact) or their differences from P_all's (float32 or bf16);
// y (n, 1) long the sampled tokens; bias (V,) or None → (log p(y_t) (n,), d (k, n) = JS(p_t, q_kt),
// log q_k(y_t) (k, n)), float32: mrtpo.replay.vocab.chain's results without a soft-cap.
template <typename R>
void vocab_chain_rows(const R& r, int64_t k, const int64_t* y, float* lp_y, float* d, float* lq_y) {
  const int64_t n = r.n;
  std::vector<Lse> lse(static_cast<size_t>((1 + k) * n));
  at::parallel_for(0, (1 + k) * n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) lse[i] = row_lse(r, i / n, i % n);
  });
  for (int64_t t = 0; t < n; ++t) lp_y[t] = (r.one(0, t, y[t]) - lse[t].max) - lse[t].log_sum;
  at::parallel_for(0, k * n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = 1 + i / n, t = i % n;
      const Lse lq = lse[j * n + t];
      d[i] = std::sqrt(std::max(0.0f, -0.5f * js_squared(r, j, t, lse[t], lq)));
      lq_y[i] = (r.one(j, t, y[t]) - lq.max) - lq.log_sum;
    }
  });
}

template <typename E, bool kExact>
void vocab_chain_typed(const E* z, const float* b, int64_t k, int64_t n, int64_t V, const int64_t* y, float* lp_y,
                       float* d, float* lq_y) {
  if (b != nullptr)
    vocab_chain_rows(Rows<E, kExact, true>{z, b, n, V}, k, y, lp_y, d, lq_y);
  else
    vocab_chain_rows(Rows<E, kExact, false>{z, b, n, V}, k, y, lp_y, d, lq_y);
}

template <typename E>
void vocab_chain_of(const E* z, const float* b, bool exact, int64_t k, int64_t n, int64_t V, const int64_t* y,
                    float* lp_y, float* d, float* lq_y) {
  if (exact)
    vocab_chain_typed<E, true>(z, b, k, n, V, y, lp_y, d, lq_y);
  else
    vocab_chain_typed<E, false>(z, b, k, n, V, y, lp_y, d, lq_y);
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> vocab_chain(const at::Tensor& z_in, const at::Tensor& y_in,
                                                                  bool exact,
                                                                  const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(z_in.dim() == 3 && z_in.size(0) >= 2 && z_in.device().is_cpu() &&
                  (z_in.scalar_type() == at::kFloat || z_in.scalar_type() == at::kBFloat16),
              "rows_kernel.vocab_chain: z (1 + k, n, V) float32 or bf16 on the CPU, k ≥ 1");
  const at::Tensor z = z_in.contiguous();
  const int64_t k = z.size(0) - 1, n = z.size(1), V = z.size(2);
  const at::Tensor y = y_in.reshape({-1}).to(at::kLong).contiguous();
  TORCH_CHECK(y.numel() == n, "rows_kernel.vocab_chain: y holds ", y.numel(), " tokens for ", n, " rows");
  const int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t) TORCH_CHECK(0 <= yp[t] && yp[t] < V, "rows_kernel.vocab_chain: a token past V");
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    TORCH_CHECK(bias_in->numel() == V, "rows_kernel.vocab_chain: a bias of ", V, " values");
    bias = bias_in->to(at::kFloat).contiguous();
  }
  const at::TensorOptions f32 = z.options().dtype(at::kFloat);
  at::Tensor lp_y = at::empty({n}, f32), d = at::empty({k, n}, f32), lq_y = at::empty({k, n}, f32);
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float *lp = lp_y.data_ptr<float>(), *dp = d.data_ptr<float>(), *lq = lq_y.data_ptr<float>();
  if (z.scalar_type() == at::kFloat)
    vocab_chain_of(z.data_ptr<float>(), bp, exact, k, n, V, yp, lp, dp, lq);
  else
    vocab_chain_of(z.data_ptr<c10::BFloat16>(), bp, exact, k, n, V, yp, lp, dp, lq);
  return {lp_y, d, lq_y};
}

// A decoding step's draw from its logits z (n, V) (one row per response; rows may repeat in memory: stride 0) at
// temperature τ, with uniform numbers u (n,) in [0, 1): per row, s = z / τ, e_v = e^{s_v − m} (m = max s),
// Z = Σ_v e_v, and
//   token = the first i with Σ_{v ≤ i} e_v > u · Z      (the inverse of the cumulative distribution: p_v = e_v / Z;
//                                                         a token of probability 0 is never drawn)
//   H = −Σ_v p_v log p_v = log Z − Σ_v e_v (s_v − m) / Z    (the entropy of what is drawn from)
// reading the row from cache three times (its maximum, the sums, the walk to the drawn token) instead of the half-dozen
// passes over memory of torch's softmax, cumsum, searchsorted and logsumexp. The sums are float32 lanes over spans of
// kSpan values, those span sums in double; the walk adds the span sums in the same order, then the drawn span's values
// one by one in double. A row without a finite maximum (every logit −∞, or a NaN) draws token 0 with a NaN entropy.
template <typename E>
void draw_row(const E* z, int64_t V, float temperature, float u, int64_t& token, float& entropy) {
  const __m256 t = _mm256_set1_ps(temperature);
  const bool scaled = temperature != 1.0f;
  auto at = [&](int64_t v) {  // s at v..v+7 (z / τ, as torch divides; past V: −∞)
    const __m256 x = load8(z + v, V - v, -INFINITY);
    return scaled ? _mm256_div_ps(x, t) : x;
  };
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t v = 0; v < V; v += 8) mv = _mm256_max_ps(mv, at(v));
  const float m = hmax(mv);
  if (!std::isfinite(m)) {
    token = 0;
    entropy = NAN;
    return;
  }
  const __m256 mm = _mm256_set1_ps(m);
  const int64_t spans = (V + kSpan - 1) / kSpan;
  std::vector<double> span(static_cast<size_t>(spans));
  double Z = 0.0, A = 0.0;
  for (int64_t j = 0; j < spans; ++j) {
    __m256 acc = _mm256_setzero_ps(), wacc = _mm256_setzero_ps();
    for (int64_t v = j * kSpan; v < std::min((j + 1) * kSpan, V); v += 8) {
      const __m256 x = _mm256_sub_ps(at(v), mm);                    // s − m ≤ 0 (−∞ past V)
      const __m256 e = exp_ps(x);                                   // 0 where s = −∞
      acc = _mm256_add_ps(acc, e);
      wacc = _mm256_fmadd_ps(e, _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_EQ_OQ), x), wacc);
    }
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(), wlo = _mm256_setzero_pd(), whi = _mm256_setzero_pd();
    add_double(acc, lo, hi);
    add_double(wacc, wlo, whi);
    span[j] = hsum_double(lo, hi);
    Z += span[j];
    A += hsum_double(wlo, whi);
  }
  entropy = static_cast<float>(std::log(Z) - A / Z);
  const double target = static_cast<double>(u) * Z;
  double c = 0.0;
  int64_t j = 0;
  while (j + 1 < spans && c + span[j] <= target) c += span[j++];
  int64_t last = -1;  // the last token of positive probability walked (rounding may leave the target unreached)
  for (int64_t v0 = j * kSpan; v0 < V; v0 += 8) {
    alignas(32) float e[8];
    _mm256_store_ps(e, exp_ps(_mm256_sub_ps(at(v0), mm)));
    for (int i = 0; i < 8 && v0 + i < V; ++i) {
      if (e[i] <= 0.0f) continue;
      last = v0 + i;
      c += e[i];
      if (c > target) {
        token = last;
        return;
      }
    }
  }
  token = last >= 0 ? last : 0;
}

inline std::tuple<at::Tensor, at::Tensor> draw(const at::Tensor& z, const at::Tensor& u_in, double temperature) {
  TORCH_CHECK(z.dim() == 2 && z.device().is_cpu() && z.size(1) > 0 && z.stride(1) == 1 &&
                  (z.scalar_type() == at::kFloat || z.scalar_type() == at::kBFloat16),
              "rows_kernel.draw: logits (n, V) float32 or bf16 on the CPU, each row contiguous");
  TORCH_CHECK(temperature > 0, "rows_kernel.draw: a temperature > 0 (greedy takes the argmax)");
  const int64_t n = z.size(0), V = z.size(1), stride = z.stride(0);
  const at::Tensor u = u_in.reshape({-1}).to(at::kFloat).contiguous();
  TORCH_CHECK(u.numel() == n, "rows_kernel.draw: ", u.numel(), " uniform numbers for ", n, " rows");
  at::Tensor token = at::empty({n}, z.options().dtype(at::kLong));
  at::Tensor entropy = at::empty({n}, z.options().dtype(at::kFloat));
  const float* up = u.data_ptr<float>();
  int64_t* tp = token.data_ptr<int64_t>();
  float* hp = entropy.data_ptr<float>();
  const float tau = static_cast<float>(temperature);
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (z.scalar_type() == at::kFloat)
        draw_row(z.data_ptr<float>() + i * stride, V, tau, up[i], tp[i], hp[i]);
      else
        draw_row(z.data_ptr<c10::BFloat16>() + i * stride, V, tau, up[i], tp[i], hp[i]);
    }
  });
  return {token, entropy};
}

}  // namespace mrtpo_avx2
