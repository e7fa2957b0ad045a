// Deciding the correctly rounded result from an approximation and an error
// bound, and the error bounds Carbon's fast paths use.
//
// If the exact value c is known to lie strictly inside (lo, hi) and
// RN_f(lo) == RN_f(hi), then RN_f(c) is that value too, because rounding to
// nearest is monotone. No reasoning about midpoints is needed: an interval
// that contains a tie rounds differently at its two ends, so a tie is never
// "decided" and always reaches the exact path, the only place it can be seen.
// Zero is the one place monotonicity is not enough: +0 and -0 compare equal
// but are different answers, so an interval that touches 0 is never decided.
#pragma once

#include "float_format.h"

namespace carbon {

constexpr double kUnitRoundoff = 1.0 / 9007199254740992.0;  // u = 2^-53

// Slack that covers the rounding errors made while *computing* a bound (norms,
// products, gamma itself): every such relative error is below 2^-22 for fewer
// than 2^31 terms, so a factor 1 + 2^-20 covers their product generously.
constexpr double kBoundSlack = 1.0 + 1.0 / 1048576.0;

// gamma_n = n u / (1 - n u): |fl(sum) - sum| <= gamma_n * sum |terms| for
// any order or tree of n terms summed in IEEE double (Higham, ch. 4).
CARBON_HD double gamma_n(int64_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1.0 - nu);
}

// If the exact value is known to lie in [lo, hi] (rigorous bounds), every
// value there rounds to the same result in f and its sign is certain, write
// it to *out and return true. Non-finite bounds are never decided.
CARBON_HD bool round_interval_if_decided(double lo, double hi, const FloatFormat& f, double* out) {
  if (!is_finite(lo) || !is_finite(hi)) return false;
  if (!(lo > 0.0 || hi < 0.0)) return false;  // sign of the result not certain
  const double r_lo = round_double(lo, f);
  const double r_hi = round_double(hi, f);
  if (double_to_bits(r_lo) != double_to_bits(r_hi)) return false;
  *out = r_lo;
  return true;
}

// If every value within `beta` of `approx` rounds to the same result in f and
// the sign of that result is certain, write it to *out and return true.
// approx and beta must come from IEEE double arithmetic; non-finite inputs
// are never decided (the exact path handles them).
CARBON_HD bool round_if_decided(double approx, double beta, const FloatFormat& f, double* out) {
  if (!is_finite(approx) || !is_finite(beta)) return false;
  // fl(approx -+ beta) is within half an ulp of the exact endpoint; stepping
  // one more ulp outwards gives a strict bound on each side.
  return round_interval_if_decided(next_down(approx - beta), next_up(approx + beta), f, out);
}

// The same for the quotient c / n (n > 0) of a value c within `beta` of
// `approx`: each rounded step is followed by a step outwards.
CARBON_HD bool round_quotient_if_decided(double approx, double beta, double n, const FloatFormat& f,
                                         double* out) {
  if (!is_finite(approx) || !is_finite(beta)) return false;
  const double lo = next_down(next_down(approx - beta) / n);
  const double hi = next_up(next_up(approx + beta) / n);
  return round_interval_if_decided(lo, hi, f, out);
}

// Compensated summation (TwoSum, Knuth): s + e == a + b exactly.
struct CompensatedSum {
  double s = 0.0;  // running sum
  double t = 0.0;  // running sum of the exact rounding errors of s
};

CARBON_HD void two_sum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

CARBON_HD void compensated_add(CompensatedSum& acc, double x) {
  double e;
  two_sum(acc.s, x, acc.s, e);
  acc.t = acc.t + e;
}

CARBON_HD CompensatedSum compensated_merge(const CompensatedSum& x, const CompensatedSum& y) {
  CompensatedSum r;
  double e;
  two_sum(x.s, y.s, r.s, e);
  r.t = (x.t + y.t) + e;
  return r;
}

// Error bound for value = fl(s + t) of a compensated sum of exact terms whose
// absolute values sum to at most `abs_sum`, computed with at most `depth`
// TwoSum / error additions on any path (any order or tree):
//   c = s + (sum of the TwoSum errors e_i) exactly,  sum |e_i| <= gamma_d abs_sum,
//   |t - sum e_i| <= gamma_d sum |e_i|,  |fl(s + t) - (s + t)| <= u |fl(s + t)|,
// so |value - c| <= u |value| + gamma_d^2 abs_sum.
CARBON_HD double compensated_bound(double value, double abs_sum, int64_t depth) {
  const double g = gamma_n(depth);
  return (kUnitRoundoff * abs_value(value) + g * g * abs_sum) * kBoundSlack;
}

}  // namespace carbon
