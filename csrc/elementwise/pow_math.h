// x^p for a float value x and a binary64 exponent p (or a binary64 base and a
// float exponent), shared by the CPU and CUDA kernels of carbon's pow ops.
//
// Finite x != 0, finite p: |x|^p = exp(p log|x|) in binary64 with the cores
// of elementwise_math.h: log_core has relative error < 2^-50, the product
// p * L one rounding (2^-53), so the exponent's absolute error is below
// |p L| (2^-50 + 2^-53); exp_core adds < 2^-49.5 relative. Wherever the result
// is a finite nonzero float32 (or bfloat16 / float16) value, |p L| < 104
// (e^-104 < 2^-150 rounds to 0, e^104 > 2^150 to inf), so the relative error
// is below 104 * 2^-49.8 + 2^-49.5 < 2^-43: the contract's < 2^-40 (§6).
// Everything else follows IEEE 754's pow: x^0 = 1 and 1^p = 1 (also for NaN),
// a negative x needs an integer p (the sign is that of x for odd p), zeros
// and infinities give 0 or inf with the sign rules of C's pow.
#pragma once

#include "elementwise_math.h"

namespace carbon {
namespace math {

CARBON_HD bool is_integer_value(double p) {
  return abs_value(p) >= 0x1p53 || p == static_cast<double>(static_cast<int64_t>(p));
}
CARBON_HD bool is_odd_integer(double p) {
  return abs_value(p) < 0x1p53 && p == static_cast<double>(static_cast<int64_t>(p)) &&
         (static_cast<int64_t>(p) & 1) != 0;
}

CARBON_HD double pow_core(double x, double p) {
  const double inf = bits_to_double(kExpMask);
  if (p == 0.0 || x == 1.0) return 1.0;
  if (is_nan(x) || is_nan(p)) return quiet_nan();
  const double ax = abs_value(x);
  const bool negative_result = sign_bit(x) && is_odd_integer(p);
  if (is_inf(p)) {  // |x| = 1 gives 1 (x = -1 included), else 0 or inf
    if (ax == 1.0) return 1.0;
    return (ax < 1.0) == (p > 0.0) ? 0.0 : inf;
  }
  if (x == 0.0 || is_inf(x)) {
    // 0^p: 0 for p > 0, inf for p < 0; inf^p the other way round.
    const double magnitude = (x == 0.0) == (p > 0.0) ? 0.0 : inf;
    return negative_result ? -magnitude : magnitude;
  }
  if (sign_bit(x) && !is_integer_value(p)) return quiet_nan();
  const double v = exp_core(p * log_core(ax));
  return negative_result ? -v : v;
}

}  // namespace math
}  // namespace carbon
