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

#include "../exact/float_format.h"
#include "elementwise_math.h"

namespace carbon {
namespace math {

// sqrt: IEEE 754's square root in binary64, correctly rounded on every
// platform (the CPU's sqrtsd, CUDA's double sqrt, which no flag relaxes), so
// RN(sqrt x) for a float64 x. Rounded once more to a float of p <= 24 bits it
// is still RN_p(sqrt x): double rounding is innocuous for the square root when
// 53 >= 2p + 2 (Figueroa, "When is double rounding innocuous?", 1995).
// sqrt(-0) = -0, sqrt(+inf) = +inf, x < 0 and NaN give NaN.
CARBON_HD double sqrt_core(double x) { return sqrt(x); }

CARBON_HD bool is_integer_value(double p) {
  return abs_value(p) >= 0x1p53 || p == static_cast<double>(static_cast<int64_t>(p));
}
CARBON_HD bool is_odd_integer(double p) {
  return abs_value(p) < 0x1p53 && p == static_cast<double>(static_cast<int64_t>(p)) &&
         (static_cast<int64_t>(p) & 1) != 0;
}

// IEEE 754's pow at the special cases: returns true with *out set when
// (x, p) is one (x^0 = 1, 1^p = 1, NaN, p = +-inf, x = +-0 or +-inf, a
// negative x with a non-integer p). Otherwise x and p are finite, x != 0
// and |x|^p is left to the caller (pow_result gives it its sign). Shared by
// the float cores below and the float64 ones of binary64_math.h.
CARBON_HD bool pow_special_case(double x, double p, double* out) {
  const double inf = bits_to_double(kExpMask);
  const double ax = abs_value(x);
  const bool negative_result = sign_bit(x) && is_odd_integer(p);
  if (p == 0.0 || x == 1.0) {
    *out = 1.0;
  } else if (is_nan(x) || is_nan(p)) {
    *out = quiet_nan();
  } else if (is_inf(p)) {  // |x| = 1 gives 1 (x = -1 included), else 0 or inf
    *out = ax == 1.0 ? 1.0 : ((ax < 1.0) == (p > 0.0) ? 0.0 : inf);
  } else if (x == 0.0 || is_inf(x)) {
    // 0^p: 0 for p > 0, inf for p < 0; inf^p the other way round.
    const double magnitude = (x == 0.0) == (p > 0.0) ? 0.0 : inf;
    *out = negative_result ? -magnitude : magnitude;
  } else if (sign_bit(x) && !is_integer_value(p)) {
    *out = quiet_nan();
  } else {
    return false;
  }
  return true;
}

// x^p from |x|^p outside the special cases: negative for x < 0 and odd p.
CARBON_HD double pow_result(double x, double p, double magnitude) {
  return sign_bit(x) && is_odd_integer(p) ? -magnitude : magnitude;
}

CARBON_HD double pow_core(double x, double p) {
  double special;
  if (pow_special_case(x, p, &special)) return special;
  return pow_result(x, p, exp_core(p * log_core(abs_value(x))));
}

}  // namespace math

// One element of carbon.sqrt. float64: RN(sqrt x), NaN canonical (a negative
// x's NaN has the sign bit on x86 and not on CUDA). Float formats: RN_F of
// the binary64 root (encode writes the canonical NaN).
CARBON_HD double sqrt_binary64_one(double x) {
  const double v = math::sqrt_core(x);
  return is_nan(v) ? math::quiet_nan() : v;
}
CARBON_HD double sqrt_one(double x, const FloatFormat& f) { return round_double(math::sqrt_core(x), f); }

}  // namespace carbon
