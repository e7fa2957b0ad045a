// Double-double arithmetic for the host and the device: a value is the
// unevaluated sum hi + lo of two doubles with hi = RN(hi + lo). Every
// operation is a fixed sequence of IEEE +, -, *, / and explicit fma, so the
// CPU and every GPU compute the same bits (compiled without contraction).
//
// Used by the float64 elementwise functions (csrc/elementwise/
// binary64_math.h), which need about 100 bits of precision so that one
// final rounding to binary64 is correct. The error bounds below are those
// proven by Joldes, Muller and Popescu, "Tight and rigorous error bounds for
// basic building blocks of double-word arithmetic" (ACM TOMS 44(2), 2017),
// relative to the exact result of the operation on the double-double
// inputs, with u = 2^-53, valid while no intermediate underflows (all uses
// here keep the values near 1 or far above 2^-900).
#pragma once

#include <cmath>  // fma only

#include "portable.h"

namespace carbon {
namespace dd {

struct DD {
  double hi, lo;
};

// s + e = a + b exactly, any a and b (Knuth's TwoSum; 6 operations).
CARBON_HD DD two_sum(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  const double e = (a - (s - bb)) + (b - bb);
  return {s, e};
}

// s + e = a + b exactly when a = 0 or exponent(a) >= exponent(b) (Dekker).
CARBON_HD DD fast_two_sum(double a, double b) {
  const double s = a + b;
  return {s, b - (s - a)};
}

// p + e = a * b exactly (the fma gives the product's rounding error).
CARBON_HD DD two_prod(double a, double b) {
  const double p = a * b;
  return {p, fma(a, b, -p)};
}

CARBON_HD DD neg(DD x) { return {-x.hi, -x.lo}; }

// x + y for a double y (JMP Algorithm 4, DWPlusFP): relative error < 2u^2.
CARBON_HD DD add(DD x, double y) {
  const DD s = two_sum(x.hi, y);
  return fast_two_sum(s.hi, x.lo + s.lo);
}

// x + y (JMP Algorithm 6, AccurateDWPlusDW): relative error < 3u^2 + 13u^3,
// also when the sum cancels.
CARBON_HD DD add(DD x, DD y) {
  const DD s = two_sum(x.hi, y.hi);
  const DD t = two_sum(x.lo, y.lo);
  const DD v = fast_two_sum(s.hi, s.lo + t.hi);
  return fast_two_sum(v.hi, t.lo + v.lo);
}

// x * y for a double y (JMP Algorithm 9, DWTimesFP3): relative error < 2u^2.
CARBON_HD DD mul(DD x, double y) {
  const DD c = two_prod(x.hi, y);
  return fast_two_sum(c.hi, fma(x.lo, y, c.lo));
}

// x * y (JMP Algorithm 12, DWTimesDW3): relative error < 5u^2.
CARBON_HD DD mul(DD x, DD y) {
  const DD c = two_prod(x.hi, y.hi);
  const double t = fma(x.hi, y.lo, x.lo * y.lo);
  return fast_two_sum(c.hi, c.lo + fma(x.lo, y.hi, t));
}

// x / y for a double y (JMP Algorithm 15, DWDivFP3): relative error < 3u^2.
CARBON_HD DD div(DD x, double y) {
  const double th = x.hi / y;
  const DD p = two_prod(th, y);
  const double d = ((x.hi - p.hi) - p.lo) + x.lo;
  return fast_two_sum(th, d / y);
}

// x / y (JMP Algorithm 17, DWDivDW2): relative error < 15u^2 + 56u^3.
CARBON_HD DD div(DD x, DD y) {
  const double th = x.hi / y.hi;
  const DD r = mul(y, th);
  const double ph = x.hi - r.hi;  // exact (Sterbenz)
  const double dl = x.lo - r.lo;
  const double d = ph + dl;
  return fast_two_sum(th, d / y.hi);
}

}  // namespace dd
}  // namespace carbon
