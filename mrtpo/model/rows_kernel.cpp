// Few-row bf16 matrix products at the memory's bandwidth: y (M, N) = x (M, K) · Wᵀ (+ bias), W (N, K) bf16.
//
// A decoding step multiplies a handful of rows by every weight once: the product is bound by reading W, and
// oneDNN's kernels read it well below the bandwidth a plain stream gets. Here W is packed once
// (pack) so that each block of 16 output columns is one contiguous stream of K/2 k-pairs × 16 columns × 2
// (the layout VDPBF16PS reads); each thread walks whole tiles of 3–4 blocks, keeping one float32 accumulator
// per row and block in registers, so W is read once for up to 4 rows (tiles of 4 blocks) or 8 (tiles of 3);
// more rows read the tile, then in L2, again per 8. Sums are float32 over k in order, each k-pair's two
// products fused as VDPBF16PS does, then rounded to bf16 once (nearest even) after the bias is added in
// float32: oneDNN's arithmetic, up to the order of the sums.
// Needs AVX512-BF16; built ahead of time by mrtpo.model.rows_kernel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

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

template <int M, int NV>
inline void tile(const uint32_t* x, int64_t Kp, const uint16_t* w, const float* bias, at::BFloat16* y, int64_t N,
                 int64_t n0) {
  __m512 acc[M][NV];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  const int64_t stride = Kp * 2 * kBlock;  // elements of one block
  for (int64_t p = 0; p < Kp; ++p) {
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(w + v * stride + p * 2 * kBlock);
    for (int m = 0; m < M; ++m) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * Kp + p]));
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], xb, wv[v]);
    }
  }
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

}  // namespace

TORCH_LIBRARY(mrtpo_rows, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mrtpo_rows, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
}
