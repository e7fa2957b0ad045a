// atan2(y, x), hypot(x, y) and pow(x, y) of two float values (float32,
// bfloat16 or float16, as doubles), shared by the CPU and CUDA kernels: IEEE
// +, -, *, /, sqrt and elementwise_math.h's cores only, so the same bits
// everywhere. pow is pow_math.h's pow_core (IEEE 754's special values;
// relative error < 2^-43 elsewhere: one rounding is correct except within
// ~2^-19 ulp of a midpoint -- also for integer exponents, where x^2 can be a
// midpoint exactly).
// The result in the inputs' format F is one rounding of the binary64 value:
// correctly rounded except within ~2^-20 ulp of a midpoint.
//
// hypot: x^2 and y^2 are exact in binary64 (24-bit significands, exponents
// far inside binary64's range), their sum rounds once and sqrt rounds once
// (IEEE): relative error < 1.5u. hypot(+-inf, anything) = +inf (NaN
// included, as C's hypot), else NaN if either is NaN.
//
// atan2: C's atan2 for the special values (signed zeros pick 0 or pi, an
// infinite argument gives 0, pi/4, pi/2, 3pi/4 or pi, with y's sign); both
// finite and nonzero: t = min/max of |y|, |x| (one rounding, sensitivity of
// atan <= 1), a = atan_core(t) (< 2^-50.6 relative, a <= pi/4), then
// a, pi/2 - a, pi/2 + a or pi - a by the quadrant, with pi and pi/2 as
// double-doubles: every combined result is >= pi/4 > a, so the error stays
// < 2^-49 relative. The sign is y's.
#pragma once

#include <cmath>  // sqrt only (correctly rounded by IEEE 754)

#include "elementwise_math.h"
#include "pow_math.h"

namespace carbon {
namespace math {

CARBON_HD double hypot_core(double x, double y) {
  if (is_inf(x) || is_inf(y)) return bits_to_double(kExpMask);
  if (is_nan(x) || is_nan(y)) return quiet_nan();
  return sqrt(x * x + y * y);
}

CARBON_HD double atan2_core(double y, double x) {
  constexpr double kPi = 0x1.921fb54442d18p+1, kPiLo = 0x1.1a62633145c07p-53;
  constexpr double kHalfPi = 0x1.921fb54442d18p+0, kHalfPiLo = 0x1.1a62633145c07p-54;
  constexpr double kQuarterPi = 0x1.921fb54442d18p-1, kThreeQuarterPi = 0x1.2d97c7f3321d2p+1;
  if (is_nan(x) || is_nan(y)) return quiet_nan();
  const double ay = abs_value(y), ax = abs_value(x);
  const bool x_negative = sign_bit(x);
  double r;
  if (is_inf(ay) && is_inf(ax)) {
    r = x_negative ? kThreeQuarterPi : kQuarterPi;
  } else if (ay == 0.0 || is_inf(ax)) {
    r = x_negative ? kPi : 0.0;  // atan2(+-0, -0) = +-pi, atan2(+-0, +0) = +-0
  } else if (is_inf(ay) || ax == 0.0) {
    r = kHalfPi;
  } else if (ay <= ax) {
    const double a = atan_core(ay / ax);
    r = x_negative ? (kPi - a) + kPiLo : a;
  } else {
    const double a = atan_core(ax / ay);
    r = x_negative ? (kHalfPi + a) + kHalfPiLo : (kHalfPi - a) + kHalfPiLo;
  }
  return with_sign_of(r, y);
}

}  // namespace math

enum class TwoArgumentFn { kAtan2, kHypot, kPow };

// The function fn of the inputs (a, b): atan2(a, b), hypot(a, b) or a^b.
CARBON_HD double two_argument_core(TwoArgumentFn fn, double a, double b) {
  if (fn == TwoArgumentFn::kAtan2) return math::atan2_core(a, b);
  if (fn == TwoArgumentFn::kHypot) return math::hypot_core(a, b);
  return math::pow_core(a, b);
}

}  // namespace carbon
