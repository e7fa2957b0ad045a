// float64 exp, log, sin, cos and pow for the host and the device, in
// double-double arithmetic (csrc/exact/double_double.h) from IEEE basic
// operations, explicit fma and integer operations only: the same bits on the
// CPU and every GPU. (The float32 / bfloat16 / float16 functions of
// elementwise_math.h evaluate in binary64, which is not enough for a float64
// result.) Diffusion transformers (DiT, PixArt, SD3, Flux) build their
// sin-cos position tables and rotary frequencies in float64:
// 1 / 10000 ** (arange / d), then sin and cos.
//
// Each function computes a double-double D with |D - f(x)| < 2^-98 |f(x)|
// (the bounds are argued beside each piece; u = 2^-53) and returns
// RN(D) = D.hi (D is normalized). So the result is correctly rounded except
// when f(x) lies within 2^-45 ulp of a rounding midpoint, and always within
// 0.5 + 2^-45 ulp. tests/test_elementwise_binary64.py checks against mpmath.
// Results below 2^-1022 (exp and pow) are rounded from D on the subnormal
// grid directly, with D.lo breaking exact ties: no double rounding.
//
// Constants: scripts/binary64_constants.py (mpmath); the words of 2/pi are
// elementwise_math.h's two_over_pi_word, shared with float32 sin and cos.
#pragma once

#include "../exact/double_double.h"
#include "elementwise_math.h"
#include "pow_math.h"

namespace carbon {
namespace math {
namespace b64 {

using dd::DD;

CARBON_HD double infinity() { return bits_to_double(kExpMask); }

// ---- exp ---------------------------------------------------------------------
// e^z for a double-double z (|z.lo| <= ulp(z.hi) / 2):
//  * z.hi > 709.8: +inf (e^709.79 > DBL_MAX (1 + 2^-54)); z.hi < -745.2: +0
//    (e^-745.14 < 2^-1075, half the smallest subnormal); NaN: NaN.
//  * k = the integer nearest z.hi log2(e) (|k| <= 1076), r = z - k ln2 with
//    ln2 = L1 + L2 + L3 (L1 has 42 bits, so k L1 is exact and z.hi - k L1 is
//    exact by Sterbenz; L1 + L2 + L3 is within 2^-150 of ln 2). r is formed
//    in double-double: three additions of < 3u^2 |r| each plus the rounding
//    of k L3 (< 2^-140): |r| <= ln2/2 + 2^-40, absolute error < 2^-103.
//  * e^r by Taylor's series to degree 22 in nested form
//    p = 1 + r (1 + r/2 (1 + r/3 (... (1 + r/22)))): the remainder is below
//    0.3466^23 / 23! < 2^-109.6 < 2^-109 e^r; each step (one product, one
//    division, one addition) adds < 10u^2 and the errors of the inner steps
//    are damped by |r / n| <= 0.35: < 16u^2 = 2^-102 in all. With r's error:
//    |p - e^z 2^-k| < 2^-101 e^r.
//  * 2^k: p.hi 2^k is exact for normal results (p.hi = RN(p)); for subnormal
//    ones p is rounded on the grid of 2^-1074 with p.lo deciding ties.
CARBON_HD double scale_rounded(DD p, int k) {
  if (k > -1022 || (k == -1022 && p.hi >= 1.0)) {  // a normal result (or overflow to +inf)
    const int k1 = k / 2;
    return p.hi * pow2(k1) * pow2(k - k1);
  }
  // p.hi 2^(k + 1074) is exact (p.hi in [0.7, 1.5], k + 1074 in [-2, 52],
  // p.hi < 1 at 52): the result in units of the smallest subnormal, < 2^52.
  const double units = p.hi * pow2(k + 1074);
  const double nearest = (units + 0x1p52) - 0x1p52;  // round to nearest, ties to even
  const double below_tie = units - nearest;          // exact, in [-1/2, 1/2]
  double n = nearest;
  if (below_tie == 0.5 && p.lo > 0.0) n += 1.0;       // the tie was above
  if (below_tie == -0.5 && p.lo < 0.0) n -= 1.0;      // the tie was below
  return n * 0x1p-1074;                               // exact
}

CARBON_HD double exp_dd(DD z) {
  constexpr double kL1 = 0x1.62e42fefa3800p-1, kL2 = 0x1.ef35793c76730p-45, kL3 = 0x1.f97b57a079a19p-103;
  constexpr double kLog2e = 0x1.71547652b82fep+0;
  if (is_nan(z.hi)) return quiet_nan();
  if (z.hi > 709.8) return infinity();
  if (z.hi < -745.2) return 0.0;
  const double kd = fma(z.hi, kLog2e, 0x1.8p52) - 0x1.8p52;  // nearest integer (|z.hi log2 e| < 1100)
  DD r = dd::two_sum(z.hi - kd * kL1, z.lo);
  r = dd::add(r, dd::neg(dd::two_prod(kd, kL2)));
  r = dd::add(r, -(kd * kL3));
  DD p = {1.0, 0.0};
  for (int n = 22; n >= 1; --n) p = dd::add(dd::div(dd::mul(r, p), static_cast<double>(n)), 1.0);
  return scale_rounded(p, static_cast<int>(kd));
}

// ---- log -----------------------------------------------------------------------
// log x for a positive finite double x, as a double-double:
//  * x = 2^e m with m in [sqrt(1/2), sqrt(2)) (split_log_argument);
//    log x = e ln2 + 2 atanh(s), s = (m - 1) / (m + 1): m - 1 is exact
//    (Sterbenz), m + 1 a two_sum, s one division (< 15u^2 + 56u^3).
//  * |s| <= (sqrt2 - 1) / (sqrt2 + 1) < 0.1716, w = s^2 < 0.02944:
//    atanh(s) / s = sum_(n >= 0) w^n / (2n + 1), to n = 20 by Horner in
//    double-double (positive terms; each step < 10u^2, the coefficients
//    1/(2n+1) as double-doubles with < 3u^2): the tail is below
//    w^21 / 43 / (1 - w) < 2^-113 relative; in all < 2^-101.
//  * e ln2 (ln2 as a double-double within 2^-107 of ln 2, product < 2u^2)
//    plus 2 s P: for e != 0, |2 atanh(s)| <= 0.35 < |e ln2| / 2, no
//    cancellation; one addition < 3u^2. Relative error < 2^-99.
CARBON_HD DD log_dd(double x) {
  constexpr double kLn2Hi = 0x1.62e42fefa39efp-1, kLn2Lo = 0x1.abc9e3b39803fp-56;
  const LogArgument a = split_log_argument(x);
  const double m = a.m;
  const int e = a.e;
  const DD s = dd::div(DD{m - 1.0, 0.0}, dd::two_sum(m, 1.0));
  const DD w = dd::mul(s, s);
  DD p = dd::div(DD{1.0, 0.0}, 41.0);
  for (int n = 19; n >= 0; --n) p = dd::add(dd::mul(p, w), dd::div(DD{1.0, 0.0}, static_cast<double>(2 * n + 1)));
  const DD log_m = dd::mul(dd::mul(s, p), 2.0);
  if (e == 0) return log_m;
  return dd::add(dd::mul(DD{kLn2Hi, kLn2Lo}, static_cast<double>(e)), log_m);
}

// log x: -inf at +-0, NaN below 0 and for NaN, +inf at +inf, +0 at 1.
CARBON_HD double log_core(double x) {
  if (is_nan(x) || x < 0.0) return quiet_nan();
  if (x == 0.0) return -infinity();
  if (is_inf(x)) return infinity();
  return log_dd(x).hi;
}

// e^x: NaN -> NaN, +inf -> +inf, -inf -> +0.
CARBON_HD double exp_core(double x) { return exp_dd(DD{x, 0.0}); }

// ---- sin and cos -----------------------------------------------------------------
// |x| = (q + f) pi/2 with q an integer (only q mod 4 matters) and
// f in [-1/2, 1/2]; r = f pi/2 as a double-double.
//  * |x| <= pi/4: q = 0, r = x exactly.
//  * Otherwise (Payne-Hanek in integers): |x| = M 2^E, M < 2^53 an integer,
//    -53 <= E <= 971. With 2/pi = sum_(i >= 1) c_i 2^-i, the bits i <= E - 2
//    contribute multiples of 4 and drop out; the 256 bits c_(E-1) ..
//    c_(E+254) form the integer W, and M W 2^-254 = |x| 2/pi (mod 4) up to
//    the omitted tail, below 2^53 2^E 2^-(E+254) = 2^-201. q is bits 254-255
//    of M W and f's 254 fraction bits the bits below (computed mod 2^256);
//    f >= 1/2 is taken as f - 1 with q + 1. Over all doubles,
//    |f| > 2^-62 (the double closest to a multiple of pi/2 is
//    6381956970095103 2^797, with |f| ~ 2^-61.6), so the tail is below
//    2^-139 |f|. f's leading 106 bits become a double-double (truncation
//    < 2^-105 relative), r = f (pi/2) with pi/2 as a double-double within
//    2^-107 (product < 5u^2): |r - exact| < 2^-103.5 |r|.
//  * sin r = r (1 - w/(2 3) (1 - w/(4 5) (... (1 - w/(28 29))))),
//    cos r = 1 - w/(1 2) (1 - w/(3 4) (... (1 - w/(27 28)))), w = r^2,
//    |r| <= pi/4 + 2^-40: the first omitted terms are below
//    0.7854^29 / 29! < 2^-112 (sin, relative to sin r >= 0.9 r) and
//    0.7854^30 / 30! < 2^-117 (cos >= 0.707); each step < 10u^2 with the
//    inner errors damped by w / (2n (2n+1)) <= 0.31: < 2^-101 in all, plus
//    r's error times the condition number of sin or cos at r (<= 1): < 2^-100.
//  * |x| < 2^-26: sin x rounds to x (x^2/6 < 2^-54.5 relative, below half an
//    ulp of x); |x| < 2^-27: cos x rounds to 1 (x^2/2 < 2^-55, below half
//    the ulp under 1, 2^-54).
struct Reduced {
  int q;  // mod 4
  DD r;   // in [-pi/4, pi/4] (up to 2^-100)
};

// hi 2^64 + lo = a b (integers: every implementation gives the same bits).
CARBON_HD void mul_64x64(uint64_t a, uint64_t b, uint64_t* hi, uint64_t* lo) {
#if defined(__CUDA_ARCH__)
  *hi = __umul64hi(a, b);
  *lo = a * b;
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  *hi = static_cast<uint64_t>(p >> 64);
  *lo = static_cast<uint64_t>(p);
#endif
}

CARBON_HD Reduced reduce_quarter_turns_dd(double ax) {
  constexpr double kQuarterPi = 0x1.921fb54442d18p-1;  // below pi/4
  constexpr double kHalfPiHi = 0x1.921fb54442d18p+0, kHalfPiLo = 0x1.1a62633145c07p-54;
  if (ax <= kQuarterPi) return {0, DD{ax, 0.0}};
  const uint64_t bits = double_to_bits(ax);                    // ax > pi/4: normal
  const uint64_t m = (bits & kFracMask) | (uint64_t(1) << 52);  // ax = m 2^e
  const int e = static_cast<int>(bits >> 52) - 1023 - 52;       // -53 .. 971
  // The window starts at c_(e-1): bit position e - 1 + 63 of the padded words.
  const int o = e + 62;
  const int k = o >> 6, b = o & 63;
  uint64_t w[4];
  for (int t = 0; t < 4; ++t) {
    const uint64_t a0 = two_over_pi_word(k + t), a1 = two_over_pi_word(k + t + 1);
    w[t] = b == 0 ? a0 : (a0 << b) | (a1 >> (64 - b));
  }
  // P = m (w0 2^192 + w1 2^128 + w2 2^64 + w3) mod 2^256, limbs p[3] (high) .. p[0].
  uint64_t h[4], l[4];
  for (int t = 0; t < 4; ++t) mul_64x64(m, w[t], &h[t], &l[t]);
  uint64_t p[4];
  p[0] = l[3];
  p[1] = h[3] + l[2];
  uint64_t carry = p[1] < l[2] ? 1 : 0;
  p[2] = h[2] + l[1];
  uint64_t c2 = p[2] < l[1] ? 1 : 0;
  p[2] += carry;
  c2 += p[2] < carry ? 1 : 0;
  p[3] = h[1] + l[0] + c2;  // mod 2^64
  int q = static_cast<int>(p[3] >> 62);
  p[3] &= (uint64_t(1) << 62) - 1;  // f = p 2^-254 in [0, 1)
  const bool negative = (p[3] >> 61) != 0;
  if (negative) {  // f - 1 = -(2^254 - p) 2^-254
    q = (q + 1) & 3;
    uint64_t borrow = 0;
    for (int t = 0; t < 4; ++t) {
      const uint64_t v = 0 - p[t] - borrow;
      borrow = (p[t] != 0 || borrow != 0) ? 1 : 0;
      p[t] = v;
    }
    p[3] &= (uint64_t(1) << 62) - 1;
  }
  // The leading 106 bits of p (nonzero: |f| > 2^-62, so p >= 2^191).
  int j = 3;
  while (j > 1 && p[j] == 0) --j;
  const int c = clz64(p[j]);
  const uint64_t top = c == 0 ? p[j] : (p[j] << c) | (p[j - 1] >> (64 - c));
  const uint64_t next = c == 0 ? p[j - 1] : (p[j - 1] << c) | (j >= 2 ? p[j - 2] >> (64 - c) : 0);
  const int lead = 64 * j + 63 - c;  // position of p's top bit: f ~ 2^(lead - 254)
  const double hi = static_cast<double>(top >> 11) * pow2(lead - 52 - 254);
  const double lo = static_cast<double>(((top & 0x7FF) << 42) | (next >> 22)) * pow2(lead - 105 - 254);
  DD f = dd::fast_two_sum(hi, lo);
  if (negative) f = dd::neg(f);
  return {q, dd::mul(f, DD{kHalfPiHi, kHalfPiLo})};
}

CARBON_HD DD sin_dd(DD r) {
  const DD w = dd::mul(r, r);
  DD p = {1.0, 0.0};
  for (int n = 14; n >= 1; --n) p = dd::add(dd::neg(dd::div(dd::mul(w, p), static_cast<double>(2 * n * (2 * n + 1)))), 1.0);
  return dd::mul(r, p);
}

CARBON_HD DD cos_dd(DD r) {
  const DD w = dd::mul(r, r);
  DD p = {1.0, 0.0};
  for (int n = 14; n >= 1; --n) p = dd::add(dd::neg(dd::div(dd::mul(w, p), static_cast<double>((2 * n - 1) * 2 * n))), 1.0);
  return p;
}

// sin(|x|) for shift = 0, cos(|x|) for shift = 1.
CARBON_HD double sin_quarter_turns(double ax, int shift) {
  const Reduced red = reduce_quarter_turns_dd(ax);
  const int q = (red.q + shift) & 3;
  const double v = (q & 1) ? cos_dd(red.r).hi : sin_dd(red.r).hi;
  return q >= 2 ? -v : v;
}

// sin x: odd (sin(-0) = -0); NaN at +-inf and NaN.
CARBON_HD double sin_core(double x) {
  if (!is_finite(x)) return quiet_nan();
  const double ax = abs_value(x);
  if (ax < 0x1p-26) return x;
  const double v = sin_quarter_turns(ax, 0);
  return sign_bit(x) ? -v : v;
}

// cos x: even; NaN at +-inf and NaN.
CARBON_HD double cos_core(double x) {
  if (!is_finite(x)) return quiet_nan();
  const double ax = abs_value(x);
  if (ax < 0x1p-27) return 1.0;
  return sin_quarter_turns(ax, 1);
}

// ---- pow -----------------------------------------------------------------------------
// x^p: pow_math.h's special cases (C's pow), and otherwise
// |x|^p = exp_dd(p log_dd(|x|)) with the sign of x for odd integers p:
// p L has relative error < 2^-98.9 (log_dd, one product < 2u^2), so an
// absolute error below 745 2^-98.9 < 2^-89.3 wherever the result is finite
// and nonzero, and exp_dd adds 2^-101: |D - x^p| < 2^-89 x^p, so correctly
// rounded unless within 2^-36 ulp of a midpoint. (An exact midpoint, e.g.
// 3^34 with its 54 significant bits, may round either way: the same way on
// every device.)
CARBON_HD double pow_core(double x, double p) {
  double special;
  if (pow_special_case(x, p, &special)) return special;
  return pow_result(x, p, exp_dd(dd::mul(log_dd(abs_value(x)), p)));
}

}  // namespace b64
}  // namespace math

// One float64 element of pow_tensor_scalar (tensor_is_base) or
// pow_scalar_tensor, NaN canonical.
CARBON_HD double pow_binary64_one(double t, double scalar, bool tensor_is_base) {
  const double v = tensor_is_base ? math::b64::pow_core(t, scalar) : math::b64::pow_core(scalar, t);
  return is_nan(v) ? math::quiet_nan() : v;
}
}  // namespace carbon
