// Products with a short inner dimension and few rows (K <= kSmallK,
// M <= kSmallM) on the CPU, computed directly: a depthwise convolution is
// one such product per channel (a 1 x 9 row of weights times 9 x positions
// of windows), and the general path's per-row work (fp64 copies, norms,
// spans and a GEMM call for a 1-row product) cost ~60 ns per output there
// against ~1 ns of arithmetic.
//
// Each output c = bias + sum_k a_k b_k (exact products of two values of the
// supported formats: exact in fp64) is evaluated in fp64 in k order, with
// the fp64 sum of |bias| + sum_k |a_k| |b_k| beside it; any fp64 evaluation
// is within gamma_{K+1} of that absolute sum (matmul_kernel.h's tier 1, with
// the absolute sum itself in place of the norms' Cauchy-Schwarz bound; its
// own rounding errs by less than gamma_{K+1}, which kBoundSlack covers).
// Blocks of outputs are decided together (decide_block); the rest (zeros,
// subnormals, ties, non-finite values) go to the exact accumulator. Either
// way an output is RN_f(c), so which path computed it never shows in the
// bits.
#include "matmul_small_k.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>

#include "../dtypes.h"
#include "../exact/decide_block.h"
#include "../exact/exact_sum.h"
#include "../exact/fp_env.h"
#include "../reduce/reduce_kernel.h"
#include "matmul_kernel.h"

namespace carbon {
namespace {

constexpr int64_t kColumns = 64;  // outputs of one row decided together

#define CARBON_SMALL_K_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

// dst[k * kColumns + c] = b[k * sk + c] for k < K, c < width (exact widenings).
template <typename T>
CARBON_SMALL_K_CLONES void widen_block(const T* __restrict__ b, int64_t sk, int64_t K, int64_t width,
                                       double* __restrict__ dst) {
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < width; ++c) dst[k * kColumns + c] = element_value(b[k * sk + c]);
}

// s[c] = bias[c sn] (+) a_0 b_0c (+) ... (+) a_{K-1} b_{K-1,c} in fp64 (each
// product exact), t[c] the same for |bias[c sn]| and |a_k| |b_kc|; bias
// null: both start at +0.
CARBON_SMALL_K_CLONES void dot_columns(const double* __restrict__ a, const double* __restrict__ bw, int64_t K,
                                       const double* __restrict__ bias, int64_t sn, int64_t width,
                                       double* __restrict__ s, double* __restrict__ t) {
  for (int64_t c = 0; c < width; ++c) {
    s[c] = bias ? bias[c * sn] : 0.0;
    t[c] = abs_value(s[c]);
  }
  for (int64_t k = 0; k < K; ++k) {
    const double ak = a[k], abs_ak = abs_value(ak);
    const double* __restrict__ row = bw + k * kColumns;
    for (int64_t c = 0; c < width; ++c) {
      s[c] = s[c] + ak * row[c];
      t[c] = t[c] + abs_ak * abs_value(row[c]);
    }
  }
}

// The exact accumulator's RN_f(c) for one output.
double exact_output(const double* a, const double* bw, int64_t K, int64_t c, const double* bias, int64_t sn,
                    const FloatFormat& f) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < K; ++k) exact_sum_add_product(limb, flags, a[k], bw[k * kColumns + c]);
  if (bias) exact_sum_add(limb, flags, bias[c * sn]);
  return exact_sum_round(limb, flags, f);
}

template <typename TB, typename F>
void small_k_products(const at::Tensor& a64, const at::Tensor& b3, const at::Tensor& bias64, at::Tensor& out) {
  constexpr FloatFormat f = F::get();
  const int64_t B = b3.size(0), K = b3.size(1), N = b3.size(2), M = a64.size(1);
  const double* a = a64.const_data_ptr<double>();  // [B, M, K], contiguous
  const TB* b = b3.const_data_ptr<TB>();
  const int64_t sbb = b3.stride(0), sbk = b3.stride(1);  // stride(2) == 1
  const double* bias = bias64.defined() ? bias64.const_data_ptr<double>() : nullptr;  // [B, M, N], expanded
  const int64_t sxb = bias ? bias64.stride(0) : 0, sxm = bias ? bias64.stride(1) : 0, sxn = bias ? bias64.stride(2) : 0;
  auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
  const double factor = fp64_gemm_gamma(K, bias != nullptr);
  const int64_t blocks = (N + kColumns - 1) / kColumns;
  const int64_t grain = std::max<int64_t>(1, 16384 / (M * kColumns * std::max<int64_t>(K, 1)));
  carbon::parallel_for(0, B * blocks, grain, [&](int64_t begin, int64_t end) {
    double bw[kSmallK * kColumns], s[kColumns], t[kColumns];
    uint8_t pending[kColumns];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / blocks, j0 = (task % blocks) * kColumns, width = std::min(kColumns, N - j0);
      widen_block(b + bi * sbb + j0, sbk, K, width, bw);
      for (int64_t i = 0; i < M; ++i) {
        const double* ai = a + (bi * M + i) * K;
        const double* bias_row = bias ? bias + bi * sxb + i * sxm + j0 * sxn : nullptr;
        typename F::Bits* out_row = o + (bi * M + i) * N + j0;
        dot_columns(ai, bw, K, bias_row, sxn, width, s, t);
        if (decide_block<F>(s, t, factor, width, out_row, pending)) continue;
        for (int64_t c = 0; c < width; ++c)
          if (pending[c])
            out_row[c] = static_cast<typename F::Bits>(encode(exact_output(ai, bw, K, c, bias_row, sxn, f), f));
      }
    }
  });
}

}  // namespace

bool matmul_small_k_cpu(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out) {
  const int64_t B = a3.size(0), M = a3.size(1), K = a3.size(2), N = b3.size(2);
  if (K > kSmallK || M > kSmallM || !out.is_contiguous()) return false;
  // CARBON_MATMUL_GENERAL set: the general path for every shape (read per
  // call, so that tests can run the small shapes of their exact cases
  // through both paths).
  if (std::getenv("CARBON_MATMUL_GENERAL") != nullptr) return false;
  // a is tiny (at most 128 values per batch): widened here, on this thread
  // (in the default floating-point environment: fp_env.h). b keeps its
  // layout when its rows are contiguous (a depthwise convolution's windows
  // are); otherwise one copy (of bits). The bias is widened as the general
  // path does and read through its broadcast strides.
  at::Tensor a64 = at::empty({B, M, K}, a3.options().dtype(at::kDouble));
  with_element_type(a3.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* src = a3.const_data_ptr<T>();
    double* dst = a64.mutable_data_ptr<double>();
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k)
          *dst++ = element_value(src[bi * a3.stride(0) + i * a3.stride(1) + k * a3.stride(2)]);
  });
  const at::Tensor b = b3.stride(2) == 1 ? b3 : b3.contiguous();
  const at::Tensor bias64 = bias.defined() ? bias.to(at::kDouble).expand({B, M, N}) : at::Tensor();
  with_element_type(b.scalar_type(), [&](auto element) {
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      small_k_products<decltype(element), decltype(fmt)>(a64, b, bias64, out);
    });
  });
  return true;
}

}  // namespace carbon
