// Per-row logic of the exact reductions, shared by the CPU and CUDA kernels.
// A row of n values x_k is reduced to
//     sum:  RN_f(c)        mean:  RN_f(c / n)        with c = sum_k x_k exact,
// by the same three tiers as the matmul (see matmul_kernel.h):
//   1. an fp64 sum and the fp64 sum of |x_k| by a summation tree of depth d
//      (any tree; the kernels know theirs): |fl - c| <= gamma_d sum|x|;
//   2. a compensated (TwoSum) sum, error about 2^-53 |c| + gamma_n^2 sum|x|;
//   3. the exact accumulator (and, for the mean, an exact long division).
// Whichever tier decides, the value is the correctly rounded one.
#pragma once

#include <c10/util/BFloat16.h>

#include "../exact/exact_sum.h"
#include "../exact/rounding_test.h"

namespace carbon {

// The value of one element as a double (exact for every supported format).
template <typename T>
CARBON_HD double element_value(const T& x) {
  return static_cast<double>(static_cast<float>(x));
}
CARBON_HD double element_value(const double& x) { return x; }  // partial sums
// bfloat16 is the top half of a float32: widen the bits directly (an exact
// integer operation, the same on host and device).
CARBON_HD double element_value(const c10::BFloat16& x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(bits);
#else
  std::memcpy(&f, &bits, sizeof f);
#endif
  return static_cast<double>(f);
}

// What a reduction returns for an empty row: sum +0, mean 0/0 = NaN.
CARBON_HD double empty_reduction(bool mean) { return mean ? canonical_nan() : 0.0; }

// A mean's divisor above 2^53 (sum_divided takes any int64) is not exact as
// a double: tiers 1 and 2 leave such quotients to the exact tier.
constexpr int64_t kLargestExactDivisor = int64_t(1) << 53;

// Tier 1: decide from the fp64 sum and absolute sum of n > 0 values, summed
// by a tree in which no value passes through more than `depth` additions:
// |fl - c| <= gamma_depth * sum|x| (Higham, ch. 4), and the absolute sum,
// computed alike, is within the slack of the true one.
CARBON_HD bool reduce_round_fast(double sum, double abs_sum, int64_t n, int64_t depth, bool mean,
                                 const FloatFormat& f, double* out) {
  if (mean && n > kLargestExactDivisor) return false;
  const double beta = gamma_n(depth) * abs_sum * kBoundSlack;
  return mean ? round_quotient_if_decided(sum, beta, static_cast<double>(n), f, out)
              : round_if_decided(sum, beta, f, out);
}

// Tier 2's decision, from a compensated sum built in at most `depth` steps.
CARBON_HD bool reduce_round_compensated(const CompensatedSum& acc, double abs_sum, int64_t n, int64_t depth,
                                        bool mean, const FloatFormat& f, double* out) {
  if (mean && n > kLargestExactDivisor) return false;
  const double value = acc.s + acc.t;
  const double beta = compensated_bound(value, abs_sum, depth);
  return mean ? round_quotient_if_decided(value, beta, static_cast<double>(n), f, out)
              : round_if_decided(value, beta, f, out);
}

// Tier 3's rounding of an exact accumulator.
CARBON_HD double reduce_round_exact_sum(int64_t* limb, uint32_t flags, int64_t n, bool mean,
                                        const FloatFormat& f) {
  return mean ? exact_sum_round_divided(limb, flags, static_cast<uint64_t>(n), f) : exact_sum_round(limb, flags, f);
}

// Tiers 2 and 3 for the n exact fp64 values value_at(0), ..., value_at(n-1)
// (elements, or products of two elements), sequentially; `abs_sum` is tier
// 1's fp64 sum of their absolute values. Any kernel whose terms are exact in
// fp64 falls back on this. With mean, the sum is divided by `divisor`
// (default: n).
template <typename ValueAt>
CARBON_HD double reduce_exact_values(int64_t n, ValueAt value_at, double abs_sum, bool mean, const FloatFormat& f,
                                     int64_t divisor = -1) {
  if (divisor < 0) divisor = n;
  if (abs_sum == 0.0 && n > 0) {
    // Usually every term is ±0 (a row of zeros: an unused position's gradient): then the sum and the mean are
    // an exact zero, -0 iff every term is -0 (exact_zero's rule), decided in one pass without the accumulator.
    // Any other term (a caller's bound of 0 would be wrong, but costs nothing to check) takes the tiers below.
    uint32_t flags = kSawTerm;
    bool zeros = true;
    for (int64_t k = 0; k < n && zeros; ++k) {
      const double t = value_at(k);
      zeros = t == 0.0;
      if (double_to_bits(t) != kSignBit) flags |= kSawNonNegZero;
    }
    if (zeros) return exact_zero(flags);
  }
  double out;
  CompensatedSum acc;
  for (int64_t k = 0; k < n; ++k) compensated_add(acc, value_at(k));
  if (reduce_round_compensated(acc, abs_sum * kBoundSlack, divisor, n + 1, mean, f, &out)) return out;
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < n; ++k) exact_sum_add(limb, flags, value_at(k));
  return reduce_round_exact_sum(limb, flags, divisor, mean, f);
}

// Tiers 2 and 3 for n values x[0], x[stride], ... (the CPU's path).
template <typename T>
CARBON_HD double reduce_exact(const T* x, int64_t n, int64_t stride, double abs_sum, bool mean, const FloatFormat& f) {
  return reduce_exact_values(
      n, [&](int64_t k) { return element_value(x[k * stride]); }, abs_sum, mean, f);
}

}  // namespace carbon
