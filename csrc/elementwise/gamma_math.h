// The gamma family for the host and the device: lgamma = log|Gamma|,
// digamma = psi = Gamma'/Gamma, trigamma = psi' (torch's polygamma(1, .))
// and tetragamma = psi'' (polygamma(2, .), trigamma's derivative), from IEEE
// basic operations, explicit fma and the double-double arithmetic of
// csrc/exact/double_double.h: the same bits on the CPU and every GPU. They
// serve the log-densities and entropies of torch.distributions' Gamma, Beta,
// Dirichlet, StudentT, Poisson, Binomial, ... (lgamma, digamma) and their
// gradients (digamma, trigamma).
//
// Cores for the float formats: like elementwise_math.h's, each returns a
// double whose relative error is below 2^-40 for every argument that is a
// float32 value, and the result in a format F is one rounding of it.
//  * lgamma and digamma have zeros (lgamma at 1 and 2 and twice between
//    each pair of negative integers below -2, digamma once in (0, inf) and
//    once between each pair of negative integers), where a binary64
//    evaluation loses its relative accuracy. lgamma for 0 < x < 3.5 sums
//    its Taylor series at 2 in binary64 (the zeros 1 and 2 are exact floats:
//    lgamma_near_one_and_two, < 2^-47). For other x > 0 a binary64
//    evaluation comes with a bound on its error from the size of its terms
//    (lgamma_binary64, digamma_binary64) and is taken where that bound is
//    below 2^-42 of the result -- most arguments, at ~1/20 of the cost;
//    elsewhere (digamma next to its zero, and both for every x < 0) they
//    are evaluated in double-double to an absolute error below ~2^-90 (a
//    few 2^-100 relative to the largest term). Either way the value is a fixed function
//    of x (the choice depends on x alone). lgamma(1) = lgamma(2) = +0
//    exactly. A float32 argument next to an irrational zero keeps |f(x)| far
//    above 2^-50 (tests/test_elementwise_gamma.py measures the closest ones
//    against mpmath; scripts/gamma_accuracy.py samples more), so the bound
//    holds there too.
//  * trigamma has no zero and sums positive terms (x > 0) or subtracts a
//    term at most 1/5 of the other (x < 0): binary64 suffices (< 2^-47).
//  * tetragamma (only a derivative, like gelu') has the same relative bound
//    for x > 0; for x < 0 it has zeros and the bound is absolute there,
//    below 2^-50 times its two terms' magnitude.
//
// Method (z >= 16 the asymptotic series; coefficients from
// scripts/gamma_constants.py):
//  * |x| < 2^-25: the first terms of the Taylor series of lgamma(1 + x),
//    psi(1 + x), ... plus the pole's term: lgamma(x) = -log|x| - gamma x,
//    psi(x) = -1/x - gamma + (pi^2/6) x, psi'(x) = 1/x^2 + pi^2/6 -
//    2 zeta(3) x, psi''(x) = -2/x^3 - 2 zeta(3); the first omitted term is
//    below 2^-75 of the result.
//  * 2^-25 <= x < 16: the recurrences lgamma(x) = lgamma(x + k) -
//    log(x (x+1) ... (x+k-1)), psi(x) = psi(x + k) - sum_i 1/(x+i), ... up
//    to z = x + k >= 16. Every x + i is exact: x has no bit below 2^-48 and
//    x + i < 32.
//  * z >= 16: Stirling's series for lgamma to j = 16 (its remainder is
//    below the first omitted term, 2^-103), digamma's to j = 17 (< 2^-102),
//    trigamma's to j = 8 and tetragamma's to j = 9 (< 2^-56 relative). The
//    first terms as double-doubles, the small tail in binary64.
//  * x < 0 (not an integer; float32 values below -2^23 all are): reflection
//    with 1 - x (exact: x has no bit below 2^-48 and |x| < 2^23) and
//    sin(pi x), cos(pi x) from f = x - nearest integer (exact) as
//    double-doubles (binary64_math.h's Taylor series on |pi f| <= pi/4,
//    using cos(pi (1/2 - |f|)) for |f| > 1/4):
//      lgamma(x) = log(pi) - log|sin(pi f)| - lgamma(1 - x),
//      psi(x) = psi(1 - x) - pi cot(pi f),
//      psi'(x) = pi^2 / sin^2(pi f) - psi'(1 - x),
//      psi''(x) = psi''(1 - x) - 2 pi^3 cos(pi f) / sin^3(pi f).
//
// Special values (the limits; torch's where torch is consistent): NaN ->
// NaN. lgamma: +inf at +-inf, at +-0 and at the negative integers. digamma:
// +inf at +inf, NaN at -inf and the negative integers, -1/x at +-0 (-inf at
// +0, +inf at -0). trigamma: +0 at +inf, NaN at -inf, +inf at +-0 and at the
// negative integers (a pole of even order). tetragamma: -0 at +inf, NaN at
// -inf and the negative integers, -2/x^3 at +-0.
#pragma once

#include "../exact/double_double.h"
#include "binary64_math.h"
#include "elementwise_math.h"

namespace carbon {
namespace math {
namespace gamma_family {

using dd::DD;

constexpr DD kPi = {0x1.921fb54442d18p+1, 0x1.1a62633145c07p-53};
constexpr DD kLogPi = {0x1.250d048e7a1bdp+0, 0x1.7abf2ad8d5088p-57};
constexpr DD kHalfLog2Pi = {0x1.d67f1c864beb5p-1, -0x1.65b5a1b7ff5dfp-55};
constexpr double kEulerGamma = 0x1.2788cfc6fb619p-1;
constexpr double kPiSquaredOver6 = 0x1.a51a6625307d3p+0;
constexpr double kZeta3 = 0x1.33ba004f00621p+0;
constexpr double kPiSquared = 0x1.3bd3cc9be45dep+3;
constexpr double kTwoPiCubed = 0x1.f019b59389d7cp+5;

constexpr double kAsymptotic = 16.0;  // the series are used from here on
constexpr double kTiny = 0x1p-25;     // below: the Taylor series at the pole

// The integer nearest x (any finite double; |x| >= 2^52 is one already).
CARBON_HD double nearest_integer(double x) {
  if (!(abs_value(x) < 0x1p52)) return x;
  return with_sign_of((abs_value(x) + 0x1p52) - 0x1p52, x);
}

// log p for a positive double-double p: log(p.hi) + log1p(p.lo / p.hi),
// the latter as p.lo / p.hi (|p.lo / p.hi| <= 2^-53: error < 2^-107).
CARBON_HD DD log_of(DD p) { return dd::add(b64::log_dd(p.hi), p.lo / p.hi); }

// Horner's sum c_0 w^(N-1) + ... + c_(N-1) in binary64 (fma), continued in
// double-double through the head coefficients: the series' value, as a
// double-double, of sum_j c_j w^(j-1) with the largest j first.
template <int T, int H>
CARBON_HD DD series(const double (&tail)[T], const DD (&head)[H], DD w) {
  DD s = dd::add(head[0], dd::mul(w, horner(tail, w.hi)));
  for (int i = 1; i < H; ++i) s = dd::add(dd::mul(s, w), head[i]);
  return s;
}

// The coefficients of the asymptotic series, largest j first: a binary64
// tail and a double-double head (scripts/gamma_constants.py). The binary64
// fast paths use the tail and the heads' high parts; the double-double paths
// all of them. (Returned by value: namespace-scope arrays are not visible in
// device code.)
struct SeriesCoefficients16 {
  double tail[11];
  DD head[5];
};
struct SeriesCoefficients17 {
  double tail[13];
  DD head[4];
};
// lgamma: B_2j / (2j (2j-1)), j = 16 .. 6 in binary64, j = 5 .. 1 as double-doubles.
CARBON_HD SeriesCoefficients16 lgamma_coefficients() {
  return {{
      -0x1.d1089b142d357p+23, 0x1.51a2089a6e11ap+19, -0x1.1a198ae1c4ab8p+15, 0x1.12234e81b4e82p+11,
      -0x1.39b2525cccc1bp+7,  0x1.ace44322ce006p+3,  -0x1.6476701181f3ap+0,  0x1.6fe96381e0680p-3,
      -0x1.e4286cb0f5398p-6,  0x1.a41a41a41a41ap-8,  -0x1.f6ab0d9993c7dp-10},
          {{0x1.b951e2b18ff23p-11, 0x1.5c3a9ce01b952p-65},
           {-0x1.3813813813814p-11, 0x1.fb1fb1fb1fb20p-65},
           {0x1.a01a01a01a01ap-11, 0x1.a01a01a01a01ap-71},
           {-0x1.6c16c16c16c17p-9, 0x1.f49f49f49f49fp-64},
           {0x1.5555555555555p-4, 0x1.5555555555555p-58}}};
}
// digamma: B_2j / (2j), j = 17 .. 5 in binary64, j = 4 .. 1 as double-doubles.
CARBON_HD SeriesCoefficients17 digamma_coefficients() {
  return {{
      0x1.7892edfdf5555p+33, -0x1.c280563b8bcbdp+28, 0x1.31fad7cbf3c00p+24, -0x1.dc0b1a5cfbe16p+19,
      0x1.ac572aaaaaaabp+15, -0x1.c2f0566566566p+11, 0x1.1975cc0ed7304p+8,  -0x1.a74ca514ca515p+4,
      0x1.86e7f9b9fe6e8p+1,  -0x1.c5e5e5e5e5e5ep-2,  0x1.5555555555555p-4,  -0x1.5995995995996p-6,
      0x1.f07c1f07c1f08p-8},
          {{-0x1.1111111111111p-8, -0x1.1111111111111p-64},
           {0x1.0410410410410p-8, 0x1.0410410410410p-62},
           {-0x1.1111111111111p-7, -0x1.1111111111111p-63},
           {0x1.5555555555555p-4, 0x1.5555555555555p-58}}};
}

// The same series in binary64: Horner's sum through the tail, then the
// heads' high parts.
template <int T, int H>
CARBON_HD double series_binary64(const double (&tail)[T], const DD (&head)[H], double w) {
  double t = horner(tail, w);
  for (int i = 0; i < H; ++i) t = fma(t, w, head[i].hi);
  return t;
}

// sin(pi f) and cos(pi f) for 0 < |f| <= 1/2 as double-doubles.
struct SinCosPi {
  DD s, c;
};
CARBON_HD SinCosPi sincos_pi(double f) {
  const double a = abs_value(f);
  SinCosPi r;
  if (a <= 0.25) {
    const DD t = dd::mul(kPi, a);
    r = {b64::sin_dd(t), b64::cos_dd(t)};
  } else {
    const DD t = dd::mul(kPi, 0.5 - a);  // 1/2 - a exact (Sterbenz)
    r = {b64::cos_dd(t), b64::sin_dd(t)};
  }
  if (f < 0.0) r.s = dd::neg(r.s);
  return r;
}

// ---- lgamma ----------------------------------------------------------------------
// Stirling's series for z >= 16 (a double): |error| < 2^-92 absolute (the
// terms reach ~16 log 16 = 44 with relative errors of a few 2^-100).
CARBON_HD DD lgamma_stirling(double z) {
  const DD lz = b64::log_dd(z);
  DD t = dd::mul(dd::two_sum(z, -0.5), lz);
  t = dd::add(t, -z);
  t = dd::add(t, kHalfLog2Pi);
  const DD w = dd::div(DD{1.0, 0.0}, dd::two_prod(z, z));
  const SeriesCoefficients16 c = lgamma_coefficients();
  const DD s = dd::div(series(c.tail, c.head, w), z);
  return dd::add(t, s);
}

// lgamma(x) for x >= 2^-25 that has no bit below 2^-48 (every such float32
// value and every 1 - x of the reflection): the recurrence up to 16.
CARBON_HD DD lgamma_positive(double x) {
  if (x >= kAsymptotic) return lgamma_stirling(x);
  DD product = {x, 0.0};
  double z = x + 1.0;
  for (; z < kAsymptotic; z += 1.0) product = dd::mul(product, z);
  return dd::add(lgamma_stirling(z), dd::neg(log_of(product)));
}

// The binary64 fast path for x >= 2^-25 (no bit below 2^-48): the same
// recurrence and series in binary64, lgamma = A - z + log(2 pi)/2 + S - log P
// with A = (z - 1/2) log z and P = x (x+1) ... (x+k-1). Error: P carries
// k <= 16 roundings (log P: < 2^-48.9 absolute, plus log_core's 2^-50
// relative), A has log_core's 2^-50 and one product (2^-49.6 of A), S is
// below 0.0053 with a few roundings, the four sums at most u each of the
// terms' total T = A + z + 1 + |log P|: |v - lgamma| < 2^-48.7 T (T >= 28).
// *terms returns T; the core takes v only where T <= 64 |v|, so its relative
// error is below 2^-42.7, and uses double-double elsewhere (next to the zeros).
CARBON_HD double lgamma_binary64(double x, double* terms) {
  double product = 1.0, z = x;
  for (; z < kAsymptotic; z += 1.0) product *= z;
  const double log_product = z == x ? 0.0 : log_core(product);
  const double a = (z - 0.5) * log_core(z);
  const double inv = 1.0 / z, w = inv * inv;
  const SeriesCoefficients16 c = lgamma_coefficients();
  const double s = series_binary64(c.tail, c.head, w);
  *terms = a + z + 1.0 + abs_value(log_product);
  return (((a - z) + kHalfLog2Pi.hi) + s * inv) - log_product;
}

// Taylor's series of lgamma at 2: lgamma(2 + e) = (1 - gamma) e +
// sum_(k >= 2) (-1)^k (zeta(k) - 1) e^k / k, for |e| <= 1/2 (exact e). The
// coefficients fall like 2^-k / k, so to k = 30 the remainder is below
// 2^-61 e^2; Horner's sum (fma) has relative error < 4u: the e^2 part is at
// most 0.45 of the linear one, no cancellation.
CARBON_HD double lgamma_near_two(double e) {
  // (-1)^k (zeta(k) - 1) / k, k = 30 .. 2 (scripts/gamma_constants.py)
  constexpr double kSeries[29] = {
      0x1.11116e693ed98p-35,  -0x1.1a7c26ec2523cp-34, 0x1.24932a337434cp-33,  -0x1.2f69a9fabe3e0p-32,
      0x1.3b15d2b2fc10cp-31,  -0x1.47b1679258d0ep-30, 0x1.555a877ffd2c3p-29,  -0x1.6434a8447aeadp-28,
      0x1.7469daccfadcdp-27,  -0x1.862c734df3eacp-26, 0x1.99b93c2070b0fp-25,  -0x1.af5a6cbbf8a97p-24,
      0x1.c76bbb3f07a4dp-23,  -0x1.e2600d93cfd2fp-22, 0x1.0064cdeb22f0fp-20,  -0x1.11b2eb7679541p-19,
      0x1.2597a39f34aacp-18,  -0x1.3cbc963ce2243p-17, 0x1.580dcee66eb02p-16,  -0x1.78de5bd7c81efp-15,
      0x1.a127b0f17d65ap-14,  -0x1.d3fd4c76d2fc8p-13, 0x1.0b36af86396e9p-11,  -0x1.38ac5c2bf8e08p-10,
      0x1.7add6eadb6c30p-9,   -0x1.e404fc218f5f2p-8,  0x1.51322ac7d8483p-6,   -0x1.13e001a557607p-4,
      0x1.4a34cc4a60fa6p-2};
  constexpr double kOneMinusGamma = 0x1.b0ee6072093cep-2;
  return e * fma(e, horner(kSeries, e), kOneMinusGamma);
}

// lgamma for 2^-25 <= x < 3.5 in binary64 around 2 (x + 1, x - 1, x - 2, x - 3
// are exact: x has no bit below 2^-48):
//   x < 1/2:       lgamma(x + 2) - log(x + 1) - log x   (-log x >= 0.69 dominates)
//   1/2 <= x < 3/2: lgamma(x + 1) - log x   (near 1 the two terms are 0.42 e and
//                   e - e^2/2 against a result of -0.58 e: a factor 2.5)
//   3/2 <= x <= 5/2: lgamma(x)
//   x > 5/2:       lgamma(x - 1) + log(x - 1)   (log(x - 1) > 0.4 dominates)
// with log_core (< 2^-50): relative error < 2^-47 throughout, also next to
// the zeros 1 and 2 (no double-double needed there).
CARBON_HD double lgamma_near_one_and_two(double x) {
  if (x < 0.5) return (lgamma_near_two(x) - log_core(x + 1.0)) - log_core(x);
  if (x < 1.5) return lgamma_near_two(x - 1.0) - log_core(x);
  if (x <= 2.5) return lgamma_near_two(x - 2.0);
  return lgamma_near_two(x - 3.0) + log_core(x - 1.0);
}

CARBON_HD double lgamma_core(double x) {
  if (is_nan(x)) return quiet_nan();
  const double ax = abs_value(x);
  if (is_inf(x) || (x <= 0.0 && nearest_integer(x) == x)) return b64::infinity();
  if (x == 1.0 || x == 2.0) return 0.0;
  if (ax < kTiny) return -log_core(ax) - kEulerGamma * x;
  if (x > 0.0 && x < 3.5) return lgamma_near_one_and_two(x);
  if (x > 0.0) {
    double terms;
    const double v = lgamma_binary64(x, &terms);
    return terms <= 64.0 * abs_value(v) ? v : lgamma_positive(x).hi;
  }
  const SinCosPi t = sincos_pi(x - nearest_integer(x));
  const DD abs_sin = t.s.hi < 0.0 ? dd::neg(t.s) : t.s;
  const DD v = dd::add(dd::add(kLogPi, dd::neg(log_of(abs_sin))), dd::neg(lgamma_positive(1.0 - x)));
  return v.hi;
}

// ---- digamma ---------------------------------------------------------------------
// psi(z) for z >= 16: log z - 1/(2z) - w S(w), w = 1/z^2; |error| < 2^-96.
CARBON_HD DD digamma_asymptotic(double z) {
  const DD w = dd::div(DD{1.0, 0.0}, dd::two_prod(z, z));
  DD v = dd::add(b64::log_dd(z), dd::neg(dd::div(DD{0.5, 0.0}, z)));
  const SeriesCoefficients17 c = digamma_coefficients();
  return dd::add(v, dd::neg(dd::mul(series(c.tail, c.head, w), w)));
}

// psi(x) for x >= 2^-25 with no bit below 2^-48: psi(z) - sum 1/(x + i).
CARBON_HD DD digamma_positive(double x) {
  DD sum = {0.0, 0.0};
  double z = x;
  for (; z < kAsymptotic; z += 1.0) sum = dd::add(sum, dd::div(DD{1.0, 0.0}, z));
  return dd::add(digamma_asymptotic(z), dd::neg(sum));
}

// The binary64 fast path for x >= 2^-25 (no bit below 2^-48): psi(z) - R,
// R = sum_i 1/(x+i) (k <= 16 divisions and sums: < 17u R), log_core's
// 2^-50 relative, three more sums: |v - psi(x)| < 2^-48.3 T with
// T = log z + 1 + R (*terms). As for lgamma, taken where T <= 64 |v|
// (relative error < 2^-42.3).
CARBON_HD double digamma_binary64(double x, double* terms) {
  double r = 0.0, z = x;
  for (; z < kAsymptotic; z += 1.0) r += 1.0 / z;
  const double inv = 1.0 / z, w = inv * inv;
  const SeriesCoefficients17 c = digamma_coefficients();
  const double s = series_binary64(c.tail, c.head, w);
  const double log_z = log_core(z);
  *terms = log_z + 1.0 + r;
  return ((log_z - 0.5 * inv) - w * s) - r;
}

CARBON_HD double digamma_core(double x) {
  if (is_nan(x) || x == -b64::infinity()) return quiet_nan();
  if (x == b64::infinity()) return x;
  if (x == 0.0) return -1.0 / x;  // -inf at +0, +inf at -0
  if (x < 0.0 && nearest_integer(x) == x) return quiet_nan();
  if (abs_value(x) < kTiny) return (-1.0 / x - kEulerGamma) + kPiSquaredOver6 * x;
  if (x > 0.0) {
    double terms;
    const double v = digamma_binary64(x, &terms);
    return terms <= 64.0 * abs_value(v) ? v : digamma_positive(x).hi;
  }
  const SinCosPi t = sincos_pi(x - nearest_integer(x));
  const DD pi_cot = dd::div(dd::mul(t.c, kPi), t.s);
  return dd::add(digamma_positive(1.0 - x), dd::neg(pi_cot)).hi;
}

// ---- trigamma and tetragamma (binary64) ----------------------------------------------
// psi'(x) for x >= 2^-25 with no bit below 2^-48: sum 1/(x+i)^2 + psi'(z),
// psi'(z) = (1/z) (1 + 1/(2z) + w S(w)); positive terms, < 2^-48 relative.
CARBON_HD double trigamma_positive(double x) {
  // B_2j, j = 8 .. 1
  constexpr double kTrigamma[8] = {-0x1.c5e5e5e5e5e5ep+2, 0x1.2aaaaaaaaaaabp+0,  -0x1.0330330330330p-2,
                                   0x1.364d9364d9365p-4,  -0x1.1111111111111p-5, 0x1.8618618618618p-6,
                                   -0x1.1111111111111p-5, 0x1.5555555555555p-3};
  double sum = 0.0, z = x;
  for (; z < kAsymptotic; z += 1.0) sum += 1.0 / (z * z);
  const double inv = 1.0 / z, w = inv * inv;
  return sum + inv * (1.0 + fma(0.5, inv, w * horner(kTrigamma, w)));
}

CARBON_HD double trigamma_core(double x) {
  if (is_nan(x) || x == -b64::infinity()) return quiet_nan();
  if (x == b64::infinity()) return 0.0;
  if (x <= 0.0 && nearest_integer(x) == x) return b64::infinity();
  if (abs_value(x) < kTiny) return (1.0 / (x * x) + kPiSquaredOver6) - 2.0 * kZeta3 * x;
  if (x > 0.0) return trigamma_positive(x);
  const double s = sincos_pi(x - nearest_integer(x)).s.hi;
  return kPiSquared / (s * s) - trigamma_positive(1.0 - x);
}

// psi''(x) for x >= 2^-25 with no bit below 2^-48: -sum 2/(x+i)^3 + psi''(z),
// psi''(z) = -(1/z^2) (1 + 1/z + w S(w)); negative terms, < 2^-48 relative.
CARBON_HD double tetragamma_positive(double x) {
  // (2j + 1) B_2j, j = 9 .. 1
  constexpr double kTetragamma[9] = {0x1.051cf3cf3cf3dp+10, -0x1.e244444444444p+6, 0x1.1800000000000p+4,
                                     -0x1.a52e52e52e52ep+1, 0x1.aaaaaaaaaaaabp-1,  -0x1.3333333333333p-2,
                                     0x1.5555555555555p-3,  -0x1.5555555555555p-3, 0x1.0000000000000p-1};
  double sum = 0.0, z = x;
  for (; z < kAsymptotic; z += 1.0) sum += 2.0 / (z * z * z);
  const double inv = 1.0 / z, w = inv * inv;
  return -(sum + w * (1.0 + fma(w, horner(kTetragamma, w), inv)));
}

CARBON_HD double tetragamma_core(double x) {
  if (is_nan(x) || x == -b64::infinity()) return quiet_nan();
  if (x == b64::infinity()) return -0.0;
  if (x == 0.0) return -2.0 / x;  // -inf at +0, +inf at -0
  if (x < 0.0 && nearest_integer(x) == x) return quiet_nan();
  if (abs_value(x) < kTiny) return -2.0 / (x * x * x) - 2.0 * kZeta3;
  if (x > 0.0) return tetragamma_positive(x);
  const SinCosPi t = sincos_pi(x - nearest_integer(x));
  const double s = t.s.hi;
  return tetragamma_positive(1.0 - x) - kTwoPiCubed * t.c.hi / (s * s * s);
}

}  // namespace gamma_family

CARBON_HD double lgamma_core(double x) { return gamma_family::lgamma_core(x); }
CARBON_HD double digamma_core(double x) { return gamma_family::digamma_core(x); }
CARBON_HD double trigamma_core(double x) { return gamma_family::trigamma_core(x); }
CARBON_HD double lgamma_grad_core(double x) { return gamma_family::digamma_core(x); }
CARBON_HD double digamma_grad_core(double x) { return gamma_family::trigamma_core(x); }
CARBON_HD double trigamma_grad_core(double x) { return gamma_family::tetragamma_core(x); }

}  // namespace math
}  // namespace carbon
