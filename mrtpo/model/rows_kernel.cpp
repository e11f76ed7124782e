// A decoding step's few-row bf16 products at the memory's bandwidth, y (M, N) = x (M, K) · Wᵀ (+ bias) with W (N, K)
// bf16 (pack, linear), and its attention over the valid part of a KV buffer (attend, further down).
//
// A decoding step multiplies a handful of rows by every weight once: the product is bound by reading W, and
// oneDNN's kernels read it well below the bandwidth a plain stream gets. Here W is packed once
// (pack) so that each block of 16 output columns is one contiguous stream of K/2 k-pairs × 16 columns × 2
// (the layout VDPBF16PS reads); each thread walks whole tiles of 3–4 blocks, keeping one float32 accumulator
// per row and block in registers, so W is read once for up to 4 rows (tiles of 4 blocks) or 8 (tiles of 3);
// more rows read the tile, then in L2, again per 8. Sums are float32 over k in order, each k-pair's two
// products fused as VDPBF16PS does, then rounded to bf16 once (nearest even) after the bias is added in
// float32: oneDNN's arithmetic, up to the order of the sums.
// Needs AVX512-BF16; built ahead of time by mrtpo.model.rows_kernel. Also the vocabulary side: the replay's chain
// and the decoding step's draw (vocab_chain.h, shared by both kernels).
// ATen's core tensor and the operators used (not <ATen/ATen.h>: every operator's header, most of a build's time)
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
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

constexpr int64_t kBlock = 16;  // output columns per packed block: one zmm of float32 accumulators

// W (N, K) → (N/16, K/2, 32): block b, k-pair p holds W[16b + j, 2p + i] at [b, p, 2j + i].
at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(),
              "rows_kernel.pack: a (N, K) bf16 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % kBlock == 0 && K % 2 == 0, "rows_kernel.pack: N a multiple of 16 and K even");
  return w.contiguous().view({N / kBlock, kBlock, K / 2, 2}).permute({0, 2, 1, 3}).contiguous()
      .view({N / kBlock, K / 2, 2 * kBlock});
}

// acc[m][v] = Σ_p a[m, p] · w[block v, p] over Kp k-pairs (float32, p in order, one VDPBF16PS per pair): a's rows
// as bf16 pairs, a_stride pairs apart; w in pack's layout, its blocks w_stride elements apart.
template <int M, int NV>
inline void accumulate(const uint32_t* a, int64_t a_stride, int64_t Kp, const uint16_t* w, int64_t w_stride,
                       __m512 (&acc)[M][NV]) {
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < Kp; ++p) {
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(w + v * w_stride + p * 2 * kBlock);
    for (int m = 0; m < M; ++m) {
      const __m512bh ab = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[m * a_stride + p]));
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], ab, wv[v]);
    }
  }
}

template <int M, int NV>
inline void tile(const uint32_t* x, int64_t Kp, const uint16_t* w, const float* bias, at::BFloat16* y, int64_t N,
                 int64_t n0) {
  __m512 acc[M][NV];
  accumulate<M, NV>(x, Kp, Kp, w, Kp * 2 * kBlock, acc);
  for (int v = 0; v < NV; ++v) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + n0 + v * kBlock) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
      const __m512 s = bias ? _mm512_add_ps(acc[m][v], b) : acc[m][v];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * N + n0 + v * kBlock), (__m256i)_mm512_cvtneps_pbh(s));
    }
  }
}

// Rows in register tiles of up to 4 (NV = 4) or 8 rows: M · NV accumulators, within the 32 zmm registers.
template <int NV>
void rows(const uint32_t* x, int64_t M, int64_t Kp, const uint16_t* w, const float* bias, at::BFloat16* y, int64_t N,
          int64_t n0) {
  constexpr int64_t R = NV >= 4 ? 4 : 8;
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    const uint32_t* xm = x + m0 * Kp;
    at::BFloat16* ym = y + m0 * N;
    const int64_t r = std::min<int64_t>(M - m0, R);
    if (r == 1) tile<1, NV>(xm, Kp, w, bias, ym, N, n0);
    else if (r == 2) tile<2, NV>(xm, Kp, w, bias, ym, N, n0);
    else if (r == 3) tile<3, NV>(xm, Kp, w, bias, ym, N, n0);
    else if (r == 4) tile<4, NV>(xm, Kp, w, bias, ym, N, n0);
    else if constexpr (R == 8) {
      if (r == 5) tile<5, NV>(xm, Kp, w, bias, ym, N, n0);
      else if (r == 6) tile<6, NV>(xm, Kp, w, bias, ym, N, n0);
      else if (r == 7) tile<7, NV>(xm, Kp, w, bias, ym, N, n0);
      else tile<8, NV>(xm, Kp, w, bias, ym, N, n0);
    }
  }
}

// Tiles of NV blocks over the threads; the last tile takes what is left.
template <int NV>
void columns(const uint32_t* x, int64_t M, int64_t Kp, const uint16_t* w, const float* bias, at::BFloat16* y,
             int64_t N) {
  const int64_t blocks = N / kBlock, tiles = (blocks + NV - 1) / NV;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t * NV, n0 = b * kBlock;
      const uint16_t* wt = w + b * Kp * 2 * kBlock;
      switch (std::min<int64_t>(blocks - b, NV)) {
        case 1: rows<1>(x, M, Kp, wt, bias, y, N, n0); break;
        case 2: rows<2>(x, M, Kp, wt, bias, y, N, n0); break;
        case 3: rows<3>(x, M, Kp, wt, bias, y, N, n0); break;
        default: rows<NV>(x, M, Kp, wt, bias, y, N, n0); break;
      }
    }
  });
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 && packed.dim() == 3 &&
                  packed.size(2) == 2 * kBlock && packed.is_contiguous() && x_in.device().is_cpu(),
              "rows_kernel.linear: bf16 CPU rows and a weight packed by rows_kernel.pack");
  const int64_t K = x_in.size(-1), Kp = K / 2, N = packed.size(0) * kBlock;
  TORCH_CHECK(K % 2 == 0 && packed.size(1) == Kp, "rows_kernel.linear: x has ", K, " columns, the weight ",
              2 * packed.size(1));
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
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (M <= 4)
    columns<4>(xp, M, Kp, wp, bp, y.data_ptr<at::BFloat16>(), N);
  else
    columns<3>(xp, M, Kp, wp, bp, y.data_ptr<at::BFloat16>(), N);
  return y;
}

// e^x for float32 lanes (x ≤ 0 here: scores minus their maximum): 2^n · p(r), x = n ln 2 + r, |r| ≤ ln 2 / 2, p a
// degree-6 polynomial (Cephes' expf coefficients); within about an ulp of expf, exactly 0 below −87 (−∞: a key
// masked out).
inline __m512 exp_ps(__m512 x_in) {
  const __mmask16 live = _mm512_cmp_ps_mask(x_in, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m512 x = _mm512_max_ps(x_in, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

inline __m512 bf16_to_ps(const at::BFloat16* p) {  // 16 bf16 → float32 (exact: the bits shifted up)
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

inline __m512 round_bf16(__m512 v) {  // to the nearest bf16, as float32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

// A softmax's numerators over one row of scores s[0, n): e_t = e^{s_t − max s}, handed to store(t, e, lanes) 16 at a
// time (the last block's lanes past n zero and masked off), and 1 / Σ_t e_t summed in float32 lanes. The attention
// of a decoding step and of a replay pass share it; each stores the weights its value product reads.
template <class Store>
inline float exp_weights(const float* s, int64_t n, Store store) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - t)) - 1);
  if (t < n) mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, s + t));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 total = _mm512_setzero_ps();
  for (t = 0; t + 16 <= n; t += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), m));
    total = _mm512_add_ps(total, e);
    store(t, e, static_cast<__mmask16>(0xFFFF));
  }
  if (t < n) {
    const __m512 e = _mm512_maskz_mov_ps(tail, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + t), m)));
    total = _mm512_add_ps(total, e);
    store(t, e, tail);
  }
  return 1.0f / _mm512_reduce_add_ps(total);
}

struct AttendArgs {
  const at::BFloat16 *q, *K, *V, *k_new, *v_new;
  at::BFloat16* out;
  int64_t T, valid, d, r;
  float scale;
  int64_t kv, shared;  // positions [0, shared): alike in every row, read from the first row's buffer (head task % kv)
};

// One (row, kv head): its r queries over the valid cached keys and the own one. DV = d / 16 and R = r fixed at
// compile time keep the queries and sums in registers; DV = 0: both read at run time (any d ≤ 256, r ≤ 16).
template <int DV, int R>
void attend_task(const AttendArgs& a, int64_t task, float* s) {
  constexpr bool fixed = DV > 0;
  const int64_t dv = fixed ? DV : a.d / 16, r = fixed ? R : a.r, d = a.d, valid = a.valid;
  const at::BFloat16* qp = a.q + task * r * d;
  const at::BFloat16* kp = a.K + task * a.T * d;
  const at::BFloat16* vp = a.V + task * a.T * d;
  const at::BFloat16* kpre = a.K + (task % a.kv) * a.T * d;  // the common prefix: row 0, the same head
  const at::BFloat16* vpre = a.V + (task % a.kv) * a.T * d;
  const at::BFloat16* knp = a.k_new + task * d;
  const at::BFloat16* vnp = a.v_new + task * d;
  const int64_t L = valid + 1;  // the cached keys, then the own one
  __m512 qv[fixed ? R : 16][fixed ? DV : 16];  // the queries in float32: each key and value is read once for all r
  for (int64_t j = 0; j < r; ++j)
    for (int64_t c = 0; c < dv; ++c) qv[j][c] = bf16_to_ps(qp + j * d + c * 16);
  for (int64_t t = 0; t < L; ++t) {  // s (r, L): the scores
    const at::BFloat16* key = t < a.shared ? kpre + t * d : t < valid ? kp + t * d : knp;
    __m512 kc[fixed ? DV : 16];
    for (int64_t c = 0; c < dv; ++c) kc[c] = bf16_to_ps(key + c * 16);
    for (int64_t j = 0; j < r; ++j) {
      __m512 acc = _mm512_mul_ps(qv[j][0], kc[0]);
      for (int64_t c = 1; c < dv; ++c) acc = _mm512_fmadd_ps(qv[j][c], kc[c], acc);
      s[j * L + t] = _mm512_reduce_add_ps(acc) * a.scale;
    }
  }
  float inv[fixed ? R : 16];
  for (int64_t j = 0; j < r; ++j) {  // the weights in place (bf16-rounded: what the product takes), 1 / their sum
    float* sj = s + j * L;
    inv[j] = exp_weights(sj, L, [sj](int64_t t, __m512 e, __mmask16 lanes) {
      _mm512_mask_storeu_ps(sj + t, lanes, round_bf16(e));
    });
  }
  __m512 o[fixed ? R : 16][fixed ? DV : 16];  // Σ_u w_u v_u, the weights rounded to bf16 above
  for (int64_t j = 0; j < r; ++j)
    for (int64_t c = 0; c < dv; ++c) o[j][c] = _mm512_setzero_ps();
  for (int64_t u = 0; u < L; ++u) {  // Σ_u bf16(w_u) v_u for every query at once
    const at::BFloat16* val = u < a.shared ? vpre + u * d : u < valid ? vp + u * d : vnp;
    __m512 vc[fixed ? DV : 16];
    for (int64_t c = 0; c < dv; ++c) vc[c] = bf16_to_ps(val + c * 16);
    for (int64_t j = 0; j < r; ++j) {
      const __m512 w = _mm512_set1_ps(s[j * L + u]);
      for (int64_t c = 0; c < dv; ++c) o[j][c] = _mm512_fmadd_ps(w, vc[c], o[j][c]);
    }
  }
  for (int64_t j = 0; j < r; ++j) {
    at::BFloat16* op = a.out + task * r * d + j * d;
    for (int64_t c = 0; c < dv; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(op + c * 16),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[j][c], _mm512_set1_ps(inv[j]))));
  }
}

using AttendTask = void (*)(const AttendArgs&, int64_t, float*);

template <int DV>
AttendTask attend_for(int64_t r) {
  switch (r) {
    case 1: return &attend_task<DV, 1>;
    case 2: return &attend_task<DV, 2>;
    case 3: return &attend_task<DV, 3>;
    case 4: return &attend_task<DV, 4>;
    case 5: return &attend_task<DV, 5>;
    case 6: return &attend_task<DV, 6>;
    case 7: return &attend_task<DV, 7>;
    case 8: return &attend_task<DV, 8>;
    default: return &attend_task<0, 0>;
  }
}

// A decoding step's attention, one query per row and query head, the r query heads of each kv head together:
// over the `valid` cached keys K[..., :valid, :] and the step's own key k_new,
//   out = Σ_t bf16(e^{s_t − m}) v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t (float32 sums),  m = max_t s_t
// — the CPU flash kernel's arithmetic for bf16 (float32 scores and sums, the weights rounded to bf16 for the
// product with V) in one block. q (n, kv, r, d); K, V (n, kv, T, d); k_new, v_new (n, kv, d); bf16, d a multiple
// of 16 up to 256, r up to 16; `pos` the number of valid positions (a float32 scalar, as the step's rotary angle
// takes it). `shared` (an int64 scalar, absent: 0): the first positions every row holds alike (a group's prompt),
// read from the first row's buffer for all rows; the (row, kv head) pairs run head by head, so a head's common keys
// are read from memory once and from cache for the other rows.
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& K, const at::Tensor& V, const at::Tensor& k_in,
                  const at::Tensor& v_in, const at::Tensor& pos, double scale,
                  const std::optional<at::Tensor>& shared_in) {
  TORCH_CHECK(q_in.dim() == 4 && K.dim() == 4 && V.sizes() == K.sizes() && q_in.scalar_type() == at::kBFloat16 &&
                  K.scalar_type() == at::kBFloat16 && V.scalar_type() == at::kBFloat16 &&
                  k_in.scalar_type() == at::kBFloat16 && v_in.scalar_type() == at::kBFloat16 && K.is_contiguous() &&
                  V.is_contiguous(), "rows_kernel.attend: bf16 q (n, kv, r, d) and contiguous K, V (n, kv, T, d)");
  const at::Tensor q = q_in.contiguous(), kn = k_in.contiguous(), vn = v_in.contiguous();
  const int64_t n = q.size(0), kv = q.size(1), r = q.size(2), d = q.size(3), T = K.size(2);
  const int64_t valid = static_cast<int64_t>(pos.item<float>());
  const int64_t shared = shared_in.has_value() && shared_in->defined() ? shared_in->item<int64_t>() : 0;
  TORCH_CHECK(K.size(0) == n && K.size(1) == kv && K.size(3) == d && d % 16 == 0 && d <= 256 && r <= 16 &&
                  kn.numel() == n * kv * d && vn.numel() == n * kv * d && 0 <= valid && valid <= T,
              "rows_kernel.attend: shapes");
  TORCH_CHECK(0 <= shared && shared <= valid, "rows_kernel.attend: shared (", shared, ") outside 0 … pos (", valid,
              ")");
  at::Tensor out = at::empty_like(q);
  const AttendArgs args{q.data_ptr<at::BFloat16>(), K.data_ptr<at::BFloat16>(), V.data_ptr<at::BFloat16>(),
                        kn.data_ptr<at::BFloat16>(), vn.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(),
                        T, valid, d, r, static_cast<float>(scale), kv, shared};
  AttendTask task = &attend_task<0, 0>;
  switch (d / 16) {
    case 1: task = attend_for<1>(r); break;
    case 2: task = attend_for<2>(r); break;
    case 4: task = attend_for<4>(r); break;
    case 8: task = attend_for<8>(r); break;
    default: break;
  }
  at::parallel_for(0, n * kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(r * (valid + 1)));  // scores, then weights: (r, valid + 1)
    for (int64_t u = begin; u < end; ++u) task(args, (u % n) * kv + u / n, s.data());  // head by head
  });
  return out;
}

// out (MR rows, NV blocks of 16 columns) float32 = Σ_p a[m, p] · w[block, p] over Kp pairs: a's rows as bf16 pairs
// (a_stride pairs apart), w in pack's layout (blocks w_stride elements apart); out rows out_stride apart.
template <int MR, int NV>
inline void dot_tile(const uint32_t* a, int64_t a_stride, int64_t Kp, const uint16_t* w, int64_t w_stride, float* out,
                     int64_t out_stride, float scale) {
  __m512 acc[MR][NV];
  accumulate<MR, NV>(a, a_stride, Kp, w, w_stride, acc);
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(out + m * out_stride + v * kBlock, _mm512_mul_ps(acc[m][v], _mm512_set1_ps(scale)));
}

template <int NV>
inline void dot_rows(const uint32_t* a, int64_t a_stride, int64_t M, int64_t Kp, const uint16_t* w, int64_t w_stride,
                     float* out, int64_t out_stride, float scale) {
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const uint32_t* am = a + m0 * a_stride;
    float* om = out + m0 * out_stride;
    switch (std::min<int64_t>(M - m0, 8)) {
      case 1: dot_tile<1, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 2: dot_tile<2, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 3: dot_tile<3, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 4: dot_tile<4, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 5: dot_tile<5, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 6: dot_tile<6, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      case 7: dot_tile<7, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
      default: dot_tile<8, NV>(am, a_stride, Kp, w, w_stride, om, out_stride, scale); break;
    }
  }
}

// out (M, 16 · blocks) float32 = scale · a (M, 2 Kp) · wᵀ, w packed (blocks of 16 columns, w_stride elements apart,
// their first Kp pairs read), in tiles of 8 rows × 3 blocks.
void dot(const uint32_t* a, int64_t a_stride, int64_t M, int64_t Kp, const uint16_t* w, int64_t w_stride,
         int64_t blocks, float* out, int64_t out_stride, float scale) {
  for (int64_t b = 0; b < blocks; b += 3) {
    const uint16_t* wb = w + b * w_stride;
    float* ob = out + b * kBlock;
    switch (std::min<int64_t>(blocks - b, 3)) {
      case 1: dot_rows<1>(a, a_stride, M, Kp, wb, w_stride, ob, out_stride, scale); break;
      case 2: dot_rows<2>(a, a_stride, M, Kp, wb, w_stride, ob, out_stride, scale); break;
      default: dot_rows<3>(a, a_stride, M, Kp, wb, w_stride, ob, out_stride, scale); break;
    }
  }
}

constexpr int64_t kQueries = 16;  // query positions per task of a pass's attention (times the r heads of a kv head)

// A pass's attention (the replay's: L queries per row after `past` cached keys): query i of row b sees key t where
// t < past and seen[b, t], or past ≤ t ≤ past + i. With the CPU flash kernel's bf16 arithmetic in one block of keys:
//   out = Σ_t bf16(e^{s_t − m}) v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t (float32 sums),  m = max over seen t
// q (b, heads, L, d); keys, values (b, kv, past + L, d), rows of d contiguous; seen (b, past) bool or undefined
// (all seen); bf16, d a multiple of 16. Each (row, kv head) packs its keys and values once (keys as pack lays a
// weight out, values transposed, both in k-pairs for VDPBF16PS); tasks of 16 query positions × the r heads of a kv
// head then compute the scores as a product with the packed keys (only up to the last key the task's queries see),
// the weights, and their product with the packed values.
at::Tensor attend_pass(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                       const std::optional<at::Tensor>& seen_in, int64_t past, double scale) {
  TORCH_CHECK(q_in.dim() == 4 && keys.dim() == 4 && values.sizes() == keys.sizes() &&
                  q_in.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
                  values.scalar_type() == at::kBFloat16 && keys.stride(3) == 1 && values.stride(3) == 1 &&
                  keys.stride(2) == keys.size(3) && values.stride(2) == values.size(3),
              "rows_kernel.attend_pass: bf16 q (b, heads, L, d) and keys, values (b, kv, past + L, d) with rows of d");
  const at::Tensor q = q_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3), KV = keys.size(1), T = keys.size(2);
  TORCH_CHECK(keys.size(0) == B && keys.size(3) == d && H % KV == 0 && T == past + L && d % 16 == 0 && past >= 0,
              "rows_kernel.attend_pass: shapes");
  at::Tensor seen;
  if (seen_in.has_value() && seen_in->defined()) {
    TORCH_CHECK(seen_in->scalar_type() == at::kBool && seen_in->dim() == 2 && seen_in->size(0) == B &&
                    seen_in->size(1) == past, "rows_kernel.attend_pass: seen (b, past) bool");
    seen = seen_in->contiguous();
  }
  const int64_t r = H / KV, Tb = (T + kBlock - 1) / kBlock, Tp = Tb * kBlock, dp = d / 2, db = d / kBlock;
  // keys packed (B·KV, Tb, d/2, 32); values transposed and packed (B·KV, d/16, Tp/2, 32); zeros past T
  at::Tensor kp = at::zeros({B * KV, Tb, dp, 2 * kBlock}, q.options());
  at::Tensor vp = at::zeros({B * KV, db, Tp / 2, 2 * kBlock}, q.options());
  auto* kpp = reinterpret_cast<uint16_t*>(kp.data_ptr<at::BFloat16>());
  auto* vpp = reinterpret_cast<uint16_t*>(vp.data_ptr<at::BFloat16>());
  const auto* kb = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::BFloat16>());
  const auto* vb = reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>());
  at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KV, g = task % KV;
      const uint16_t* kr = kb + b * keys.stride(0) + g * keys.stride(1);
      const uint16_t* vr = vb + b * values.stride(0) + g * values.stride(1);
      uint16_t* kt = kpp + task * Tb * dp * 2 * kBlock;
      uint16_t* vt = vpp + task * db * (Tp / 2) * 2 * kBlock;
      const __m512i rows16 = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(static_cast<int>(dp)));
      for (int64_t t0 = 0; t0 < T; t0 += kBlock) {  // keys t0..t0+15, pair p → [t0 / 16, p, 2 j + i]: a gather each
        const int64_t nk = std::min<int64_t>(T - t0, kBlock);
        const __mmask16 have = static_cast<__mmask16>((1u << nk) - 1);
        const auto* base = reinterpret_cast<const int*>(kr + t0 * d);
        for (int64_t p = 0; p < dp; ++p)
          _mm512_storeu_si512(kt + ((t0 / kBlock) * dp + p) * 2 * kBlock,
                              _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), have, rows16, base + p, 4));
      }
      // values t, t+1 and columns c..c+15 → [c / 16, t / 2, 2 (c % 16) + i]: the two rows interleaved
      const __m512i pairs = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                             37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      for (int64_t t = 0; t < T; t += 2) {
        for (int64_t c = 0; c < d; c += kBlock) {
          const __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + t * d + c)));
          const __m512i b2 = t + 1 < T ? _mm512_castsi256_si512(
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + (t + 1) * d + c)))
                                       : _mm512_setzero_si512();
          _mm512_storeu_si512(vt + ((c / kBlock) * (Tp / 2) + t / 2) * 2 * kBlock,
                              _mm512_permutex2var_epi16(a, pairs, b2));
        }
      }
    }
  });
  at::Tensor out = at::empty({B, H, L, d}, q.options());
  const int64_t qblocks = (L + kQueries - 1) / kQueries;
  const float sc = static_cast<float>(scale);
  at::Tensor additive;  // the past's mask as 0 / −∞ (b, past), added to the scores
  if (seen.defined())
    additive = at::zeros({B, past}, q.options().dtype(at::kFloat)).masked_fill_(seen.logical_not(), -INFINITY);
  const float* hidden = additive.defined() ? additive.data_ptr<float>() : nullptr;
  at::parallel_for(0, B * KV * qblocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    std::vector<uint16_t> w;
    std::vector<float> o;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / qblocks, i0 = (task % qblocks) * kQueries, b = bg / KV, g = bg % KV;
      const int64_t nq = std::min<int64_t>(L - i0, kQueries), M = r * nq;
      const int64_t tend = past + i0 + nq, te = (tend + kBlock - 1) / kBlock * kBlock;  // keys any query here sees
      s.resize(static_cast<size_t>(M * te));
      w.resize(static_cast<size_t>(M * te));
      o.resize(static_cast<size_t>(M * d));
      // rows m = j · nq + ii: head g·r + j, position i0 + ii (rows of one head contiguous in q)
      for (int64_t j = 0; j < r; ++j) {
        const auto* qa = reinterpret_cast<const uint32_t*>(q.data_ptr<at::BFloat16>() +
                                                             ((b * H + g * r + j) * L + i0) * d);
        dot(qa, dp, nq, dp, kpp + bg * Tb * dp * 2 * kBlock, dp * 2 * kBlock, te / kBlock, s.data() + j * nq * te, te,
            sc);
      }
      for (int64_t m = 0; m < M; ++m) {  // the past's mask, the weights in bf16 for the product, 1 / their sum
        const int64_t i = i0 + m % nq, last = past + i;  // the last key this query sees
        float* sm = s.data() + m * te;
        for (int64_t u = 0; hidden && u < past; u += 16) {  // the past's mask added (0 / −∞)
          const __mmask16 in = u + 16 <= past ? static_cast<__mmask16>(0xFFFF)
                                              : static_cast<__mmask16>((1u << (past - u)) - 1);
          const __m512 add = _mm512_maskz_loadu_ps(in, hidden + b * past + u);
          _mm512_storeu_ps(sm + u, _mm512_add_ps(_mm512_loadu_ps(sm + u), add));
        }
        uint16_t* wm = w.data() + m * te;
        const float inv = exp_weights(sm, last + 1, [wm](int64_t t, __m512 e, __mmask16) {  // (zeros past last)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(wm + t), (__m256i)_mm512_cvtneps_pbh(e));
        });
        for (int64_t t = (last + 16) / 16 * 16; t < te; t += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(wm + t), _mm256_setzero_si256());
        sm[0] = inv;  // (the scores are spent: keep 1 / Σ in the row's first slot)
      }
      // o (M, d) = w (M, te) · values[:te]: the values packed in pairs of keys
      dot(reinterpret_cast<const uint32_t*>(w.data()), te / 2, M, te / 2, vpp + bg * db * (Tp / 2) * 2 * kBlock,
          (Tp / 2) * 2 * kBlock, db, o.data(), d, 1.0f);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t j = m / nq, i = i0 + m % nq;
        at::BFloat16* op = out.data_ptr<at::BFloat16>() + ((b * H + g * r + j) * L + i) * d;
        const __m512 inv = _mm512_set1_ps(s[m * te]);
        for (int64_t c = 0; c < d; c += kBlock)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(op + c),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o.data() + m * d + c), inv)));
      }
    }
  });
  return out;
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
