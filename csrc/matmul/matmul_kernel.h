// Per-output logic of the correctly rounded matmul, shared by the CPU and
// CUDA kernels. For output (b, i, j) the exact value is
//     c = bias[b, i, j] + sum_k a[b, i, k] * b[b, k, j]
// and the result is RN_f(c). Three tiers, each exact in what it returns:
//   1. fp64 GEMM value + a rigorous bound (any summation order) -> decided
//      for almost every output (round_if_decided).
//   2. A compensated (TwoSum) dot product, error at most about
//      2^-53 |c| + gamma_K^2 sum|terms| -> decides everything except
//      (near-)ties and exact zeros.
//   3. The exact accumulator (exact_sum.h): always decides.
// Whatever tier decides, the returned value is RN_f(c): the result depends
// only on the inputs, never on which tier or which hardware ran.
#pragma once

#include "../exact/exact_sum.h"
#include "../exact/rounding_test.h"

namespace carbon {

// Raw view of one (batched) problem. All operands are in double (an exact
// copy of the float32/bfloat16/float16 inputs), row-major and contiguous.
struct MatmulView {
  const double* approx;      // [B, M, N] fp64 GEMM result (tier 1)
  const double* a;           // [B, M, K]
  const double* bt;          // [B, N, K]: b transposed, so a column is contiguous
  const double* a_norm;      // [B * M] 2-norms of the rows of a (fp64)
  const double* b_norm;      // [B * N] 2-norms of the columns of b
  const uint8_t* a_signs;    // [B * M] RowSigns of the rows of a
  const uint8_t* b_signs;    // [B * N] RowSigns of the columns of b
  const double* bias;        // null, or element (b, i, j) at the strides below
  int64_t bias_stride_b, bias_stride_m, bias_stride_n;
  int64_t B, M, N, K;
  double gemm_gamma;         // fp64_gemm_gamma(K, bias != null), computed once
  // CPU only (null on CUDA): for each row of a, 2^53 q_a with q_a a power of
  // two dividing every element of the row; for each column of b, such a q_b
  // (0 for rows without a nonzero finite element). See exact_gemm_value in
  // matmul_cpu.cpp.
  const double* a_quantum53;  // [B * M]
  const double* b_quantum;    // [B * N]
};

// Any fp64 evaluation of the K exact products plus the bias, in any order, is
// within gamma_{K+1} * sum|terms| of c; the slack covers computing the bound.
inline double fp64_gemm_gamma(int64_t K, bool has_bias) {
  return gamma_n(K + (has_bias ? 1 : 0)) * kBoundSlack;
}

// Which sign bits occur in a row: bit 0 = some element has its sign bit
// clear, bit 1 = some element has it set. 0 for an empty row.
enum RowSigns : uint8_t { kSomePositive = 1, kSomeNegative = 2 };

CARBON_HD uint8_t row_signs_of(double x) { return sign_bit(x) ? kSomeNegative : kSomePositive; }

CARBON_HD double bias_at(const MatmulView& v, int64_t b, int64_t i, int64_t j) {
  return v.bias[b * v.bias_stride_b + i * v.bias_stride_m + j * v.bias_stride_n];
}

// The sign of c when every product a_k*b_k is a zero and the bias, if any, is
// a zero: -0 iff there is at least one term and every term is -0 (the
// contract's rule). A product of zeros is -0 iff the signs differ. Returns
// 0 for +0, 1 for -0, -1 when the row summaries cannot tell.
CARBON_HD int zero_sum_sign(uint8_t a_signs, uint8_t b_signs, bool has_bias, bool bias_negative) {
  const bool any_product = a_signs != 0;
  if (!any_product && !has_bias) return 0;
  if (has_bias && !bias_negative) return 0;
  if (!any_product) return 1;
  if ((a_signs == kSomePositive && b_signs == kSomeNegative) ||
      (a_signs == kSomeNegative && b_signs == kSomePositive))
    return 1;
  const uint8_t both = kSomePositive | kSomeNegative;
  if (a_signs == both && b_signs == both) return -1;
  return 0;
}

// Upper bound on sum_k |a_k b_k| (+ |bias|) by Cauchy-Schwarz, from the norms.
CARBON_HD double abs_sum_bound(double a_norm, double b_norm, double bias) {
  return a_norm * b_norm + abs_value(bias);
}

// Tier 1. Returns true and sets *out when the fp64 GEMM value decides RN_f(c).
CARBON_HD bool matmul_round_fast(const MatmulView& v, int64_t b, int64_t i, int64_t j,
                                 const FloatFormat& f, double* out) {
  const double na = v.a_norm[b * v.M + i];
  const double nb = v.b_norm[b * v.N + j];
  const bool has_bias = v.bias != nullptr;
  const double bias = has_bias ? bias_at(v, b, i, j) : 0.0;
  if (is_finite(na) && is_finite(nb) && (na == 0.0 || nb == 0.0)) {
    // A zero row or column: every product is a zero, so c is the bias.
    if (has_bias && !(bias == 0.0)) {
      *out = round_double(bias, f);
      return true;
    }
    const int sign = zero_sum_sign(v.a_signs[b * v.M + i], v.b_signs[b * v.N + j], has_bias,
                                   sign_bit(bias));
    if (sign < 0) return false;
    *out = sign ? bits_to_double(kSignBit) : 0.0;
    return true;
  }
  const double gemm = v.approx[(b * v.M + i) * v.N + j];
  const double approx = has_bias ? gemm + bias : gemm;
  const double beta = v.gemm_gamma * abs_sum_bound(na, nb, bias);
  return round_if_decided(approx, beta, f, out);
}

// Tier 3 for one output, sequentially: the exact accumulator.
CARBON_HD double matmul_round_exact_sum(const MatmulView& v, int64_t b, int64_t i, int64_t j,
                                        const FloatFormat& f) {
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < v.K; ++k) exact_sum_add_product(limb, flags, a[k], bt[k]);
  if (v.bias != nullptr) exact_sum_add(limb, flags, bias_at(v, b, i, j));
  return exact_sum_round(limb, flags, f);
}

// Tier 2's decision for output (b, i, j) from `acc`, the compensated sum of
// its K products built with at most `depth` TwoSums / error additions on any
// path; the bias, if any, is added here (one more). Tier 3 when undecided.
CARBON_HD double matmul_round_compensated(const MatmulView& v, int64_t b, int64_t i, int64_t j, CompensatedSum acc,
                                          int64_t depth, const FloatFormat& f) {
  const bool has_bias = v.bias != nullptr;
  const double bias = has_bias ? bias_at(v, b, i, j) : 0.0;
  if (has_bias) compensated_add(acc, bias);
  const double value = acc.s + acc.t;
  const double abs_sum = abs_sum_bound(v.a_norm[b * v.M + i], v.b_norm[b * v.N + j], bias);
  double out;
  if (round_if_decided(value, compensated_bound(value, abs_sum, depth + (has_bias ? 1 : 0)), f, &out)) return out;
  return matmul_round_exact_sum(v, b, i, j, f);
}

// Tiers 2 and 3 for one output, sequentially (one chain; the CPU's AVX-512
// path splits it over 16 lanes, the CUDA kernel over a warp).
CARBON_HD double matmul_round_exact(const MatmulView& v, int64_t b, int64_t i, int64_t j,
                                    const FloatFormat& f) {
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  CompensatedSum acc;
  for (int64_t k = 0; k < v.K; ++k) compensated_add(acc, a[k] * bt[k]);
  return matmul_round_compensated(v, b, i, j, acc, v.K + 1, f);
}

}  // namespace carbon
