// Carbon's elementwise math: exp, log, tanh, sigmoid, erf, gelu (erf form and
// tanh approximation), silu, sin, cos, log1p, softplus, log_sigmoid, expm1,
// log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos, erfinv, asinh,
// acosh, atanh and their derivatives, written once for the host and the device from IEEE basic
// operations only (+, -, *, /, sqrt, explicit fma, integer bit manipulation).
// No other libm / std:: math and no CUDA intrinsics, so the CPU and every GPU
// perform the same operations on the same values and return the same bits.
//
// Each function f has a "core" `double f_core(double x)` evaluated in IEEE
// binary64. For every argument x that is a value of float32 (hence of bf16
// and fp16 too) the core's relative error is below 2^-40 (the comments give
// the bound, in every case about 2^-45 or better); the result in a format F is
// then ONE rounding of the core, round_double(core, F) (csrc/exact/
// float_format.h). So the float results are correctly rounded except when the
// exact value lies within ~2^-16 ulp of a rounding midpoint, and always within
// 0.5 + 2^-16 ulp. scripts/elementwise_ulp.py checks every float32 input.
// Where the exact value comes structurally close to a midpoint (near x = 0:
// sigmoid ~ 1/2 + x/4, silu ~ x/2 + x^2/4, silu' ~ 1/2 + x/2, gelu ~ x/2),
// the cores form the leading terms exactly and carry the rest as a
// correction (with_correction, above_half_x), so those round correctly too.
//
// Derivative cores (f_grad_core) have the same bound except near a zero of
// the derivative (gelu' at x ~ -0.7518, gelu_tanh' at x ~ -0.7522, silu' at
// x ~ -1.2785), where the formula Phi(x) + x phi(x) etc. cancels: there the
// absolute error is below ~2^-52 instead.
//
// Special values: NaN -> NaN; the values at +-inf are the limits (exp(-inf)=0,
// tanh(+-inf)=+-1, gelu(-inf)=silu(-inf)=-0, log(+inf)=+inf, ...); log(+-0) =
// -inf, log(x<0) = NaN; odd functions keep the sign of zero.
//
// Two cores are also used by other ops with arguments that are not float
// values: exp_core(d) meets its bound for EVERY double d (whenever the result
// is a normal double; below 2^-1022 its absolute error is below 2^-1074), and
// log_core(x) for every positive double.
//
// Notation in the error comments: u = 2^-53 (unit roundoff of binary64).
#pragma once

#include <cmath>  // fma and sqrt only (correctly rounded by IEEE 754 on every platform)

#include "../exact/portable.h"

namespace carbon {
namespace math {

// Horner evaluation c[0] x^(N-1) + ... + c[N-1] with one fma per step.
template <int N>
CARBON_HD double horner(const double (&c)[N], double x) {
  double p = c[0];
#if defined(__CUDA_ARCH__)
#pragma unroll
#else
#pragma GCC unroll 32  // unrolled before vectorization, so CPU loops over a core vectorize
#endif
  for (int i = 1; i < N; ++i) p = fma(p, x, c[i]);
  return p;
}

CARBON_HD double with_sign_of(double magnitude, double x) {
  return bits_to_double((double_to_bits(magnitude) & ~kSignBit) | (double_to_bits(x) & kSignBit));
}

CARBON_HD double quiet_nan() { return bits_to_double(0x7FF8000000000000ull); }

// 2^k for -1022 <= k <= 1023, from its bits.
CARBON_HD double pow2(int k) { return bits_to_double(static_cast<uint64_t>(k + 1023) << 52); }

// ---- exp -------------------------------------------------------------------
// exp(x) = 2^k e^r, k = round(x log2e), r = x - k ln2 with |r| <= ln2/2 + tiny.
//  * k: x*log2e + 1.5*2^52 in one fma rounds x*log2e to the nearest integer.
//  * ln2 = kLn2Hi + kLn2Lo (fdlibm's split; |ln2 - hi - lo| < 2^-84); kLn2Hi
//    has 32 significant bits, so k*kLn2Hi is exact for |k| < 2^21, and
//    x - k*kLn2Hi is exact (Sterbenz: for k != 0 both lie within a factor 2).
//    r = that - k*kLn2Lo: |k*kLn2Lo| < 1100 * 2^-32 and two roundings, so the
//    absolute error of r is < 2^-54.4 + 2^-75: relative error of e^r < 2^-54.
//  * e^r: Taylor polynomial of degree 12; truncation < 0.3466^13/13! / e^-0.35
//    < 2^-51.4 relative; Horner with fma on |r| < 0.35 (all terms positive
//    for r > 0, rapidly decreasing): < 2^-51.
//  * 2^k: in two exact powers of two, so p * 2^k1 is exact and the final
//    multiplication by 2^k2 rounds once (gradual underflow, overflow to inf).
// Total: relative error < 2^-49.5 for every double x whose exp is normal.
//
// exp_reduce performs the first three steps for exp_core and exp_f32_core
// (the same operations, so the same p): it returns p = e^r and sets
// *shifted = 1.5*2^52 + k (k in its low bits).
CARBON_HD double exp_reduce(double xc, double* shifted) {
  constexpr double kLog2e = 0x1.71547652b82fep+0;
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  constexpr double kShifter = 0x1.8p52;
  constexpr double kTaylor[13] = {
      0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19,
      0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
      0x1.5555555555555p-5,  0x1.5555555555555p-3,  0x1.0000000000000p-1,  0x1.0000000000000p+0,
      0x1.0000000000000p+0,
  };
  *shifted = fma(xc, kLog2e, kShifter);
  const double kd = *shifted - kShifter;
  const double r = (xc - kd * kLn2Hi) - kd * kLn2Lo;
  return horner(kTaylor, r);
}

CARBON_HD double exp_core(double x) {
  const bool nan = !(x == x);
  // Beyond [-760, 720] the result is 0 or inf in double already.
  double xc = nan ? 0.0 : x;
  xc = xc < -760.0 ? -760.0 : xc;
  xc = xc > 720.0 ? 720.0 : xc;
  double shifted;
  const double p = exp_reduce(xc, &shifted);
  const int k = static_cast<int>(shifted - 0x1.8p52);
  const int k1 = k / 2;
  const double result = (p * pow2(k1)) * pow2(k - k1);
  return nan ? x : result;
}

// exp of a float32 argument d (passed as the double holding its value), for
// the float32 EXP (docs/contract.md §6): RN32(exp_f32_core(d)) ==
// RN32(exp_core(d)) for EVERY float32 d -- and RN_F for every format F of at
// most float32's range (bfloat16, float16) too, by the same argument -- at
// about 4/5 of the vector instructions (softmax, log_softmax and
// cross-entropy spend much of their CPU time here). Why the bits are the same:
//  * d in [-104, 89] (every finite float32 whose exp is neither 0 nor inf
//    in float32, since e^-104 < 2^-150 and e^89 > 2^128): the same xc, the
//    same exp_reduce, so the same p and k, |k| <= 151. exp_core returns
//    (p 2^k1) 2^k2 and this function p 2^k; p in [0.7, 1.42], so p 2^k lies
//    in [2^-152, 2^130], a normal double: both products are exact, the
//    doubles are identical. 2^k comes from the bits of shifted =
//    1.5*2^52 + k, whose low 12 bits hold k mod 4096 (the ulp there is 1):
//    (bits + 1023) << 52 keeps (k + 1023) mod 4096 in the exponent field,
//    which is k + 1023 in [872, 1152] -- no conversion to int, no split.
//  * d < -104 (and -inf): clamped to -104, exp_f32_core = exp_core(-104)
//    < e^-104 (1 + 2^-49.5) < 2^-150 (e^-104 = 2^-150.04), RN32 gives +0;
//    exp_core(d) is below that bound too (or a subnormal double, or 0
//    beyond its own clamp): +0. d > 89 (and +inf): both exceed
//    e^89 (1 - 2^-49.5) > 2^128, RN32 gives +inf. (Only the ROUNDED values agree
//    there: a caller that scales the double before rounding, like exp's
//    gradient g * exp(x), must use exp_core.)
//  * NaN: both return d (as a double) itself.
// scripts/exp_f32_check.py compares the two for all 2^32 float32 bit
// patterns (docs/elementwise.md has the run: no difference).
CARBON_HD double exp_f32_core(double x) {
  double xc = x < -104.0 ? -104.0 : x;  // NaN passes through (selected away below)
  xc = xc > 89.0 ? 89.0 : xc;
  double shifted;
  const double p = exp_reduce(xc, &shifted);
  const double scale = bits_to_double((double_to_bits(shifted) + 1023) << 52);
  const double result = p * scale;
  return x == x ? result : x;
}

// ---- expm1 on [0, 1.1] -------------------------------------------------------
// y * sum_{n=0}^{18} y^n/(n+1)!: truncation < 1.1^19/20! < 2^-56 relative;
// positive terms, Horner: < 2^-51.
CARBON_HD double expm1_small(double y) {
  constexpr double kTaylor[19] = {
      0x1.2f49b46814157p-57, 0x1.6827863b97d97p-53, 0x1.952c77030ad4ap-49, 0x1.ae7f3e733b81fp-45,
      0x1.ae7f3e733b81fp-41, 0x1.93974a8c07c9dp-37, 0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29,
      0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
      0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,  0x1.5555555555555p-5,
      0x1.5555555555555p-3,  0x1.0000000000000p-1,  0x1.0000000000000p+0,
  };
  return y * horner(kTaylor, y);
}

// ---- log -------------------------------------------------------------------
// A positive finite double as x = 2^e m with m in [sqrt(1/2), sqrt(2)), from
// its bits (a subnormal x is first scaled by 2^54); exact. Also used by the
// float64 log of binary64_math.h.
struct LogArgument {
  double m;
  int e;
};

CARBON_HD LogArgument split_log_argument(double x) {
  constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;  // below sqrt(2)
  int e = 0;
  if (x < 0x1p-1022) {
    x *= 0x1p54;
    e = -54;
  }
  const uint64_t u = double_to_bits(x);
  e += static_cast<int>(u >> 52) - 1023;
  double m = bits_to_double((u & kFracMask) | (uint64_t{1023} << 52));  // [1, 2)
  if (m > kSqrt2) {
    m *= 0.5;
    e += 1;
  }
  return {m, e};
}

// x = 2^e m as above. log m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716:
//  * m - 1 is exact (Sterbenz), m + 1 and the division round: s has relative
//    error < 2.01u.
//  * atanh(s)/s = 1 + z/3 + ... + z^10/21, z = s^2 <= 0.02944: truncation
//    < z^11/23 < 2^-60; the correction z*q is < 0.01 of the sum, so its
//    rounding errors count 1/100: log m has relative error < 2^-51.
//  * + e ln2: e*kLn2Hi exact (|e| <= 1100), e*kLn2Lo + log m and the final
//    addition round; for e != 0, |e ln2| >= 2 |log m|, so no cancellation.
// Total: relative error < 2^-50 for every positive double.
CARBON_HD double log_core(double x) {
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  constexpr double kSeries[10] = {
      0x1.8618618618618p-5, 0x1.af286bca1af28p-5, 0x1.e1e1e1e1e1e1ep-5, 0x1.1111111111111p-4,
      0x1.3b13b13b13b14p-4, 0x1.745d1745d1746p-4, 0x1.c71c71c71c71cp-4, 0x1.2492492492492p-3,
      0x1.999999999999ap-3, 0x1.5555555555555p-2,
  };
  if (!(x > 0.0) || !is_finite(x)) {
    if (x == 0.0) return bits_to_double(kSignBit | kExpMask);  // -inf
    if (x > 0.0) return x;                                     // +inf
    return quiet_nan();                                        // x < 0 or NaN
  }
  const LogArgument a = split_log_argument(x);
  const double m = a.m;
  const int e = a.e;
  const double s = (m - 1.0) / (m + 1.0);
  const double z = s * s;
  const double s2 = 2.0 * s;
  const double log_m = fma(s2, z * horner(kSeries, z), s2);
  const double ed = static_cast<double>(e);
  return ed * kLn2Hi + fma(ed, kLn2Lo, log_m);
}

// ---- sigmoid, tanh -----------------------------------------------------------
// s + e for a double s and a correction e with |e| far below half an ulp of
// every output format at s, as ONE double with the same rounding in every
// format. If s + e rounds to another double, that is it (an ordinary
// rounding). Otherwise: s itself, or its neighbour towards e when s has at
// most 25 significant bits (then s may be a rounding midpoint of a format,
// where the sign of e decides; a neighbour has 53 significant bits, so it is
// no midpoint, and it rounds like s wherever s is representable).
CARBON_HD double with_correction(double s, double e) {
  const double t = s + e;
  if (t != s) return t;
  const bool short_s = (double_to_bits(s) & ((uint64_t{1} << 28) - 1)) == 0;
  if (!short_s || e == 0.0 || s == 0.0) return s;
  return e > 0.0 ? next_up(s) : next_down(s);
}

// (sigmoid(x) - 1/2 - x/4) for |x| < 2^-10: -x^3/48 + x^5/480 - 17 x^7/80640,
// truncation < 2^-70 |x|^3.
CARBON_HD double sigmoid_small_tail(double x, double z) {
  constexpr double kC3 = -0x1.5555555555555p-6;  // -1/48
  constexpr double kC5 = 0x1.1111111111111p-9;   // 1/480
  constexpr double kC7 = -0x1.ba1ba1ba1ba1cp-13;  // -17/80640
  return x * z * fma(z, fma(z, kC7, kC5), kC3);
}

// With E = exp(-|x|) in (0, 1]: sigmoid(x) = 1/(1+E) for x >= 0 and E/(1+E)
// for x < 0 (no overflow, no cancellation): error < 2^-49.5 + 2u.
// For |x| < 2^-10, sigmoid(x) = 1/2 + x/4 - x^3/48 + ...: 1/2 + x/4 can be
// exactly a rounding midpoint (x = odd * 2^-23 or 2^-24) and the tail, below
// double's resolution there, decides: 1/2 + x/4 by an exact two-sum, and the
// rest as a correction (with_correction).
//
// sigmoid_large is the main branch (|x| >= 2^-10, NaN, +-inf) on its own,
// without branches, so that CPU loops over it vectorize (main_branch below).
CARBON_HD double sigmoid_large(double x) {
  const double E = exp_core(-abs_value(x));
  const double d = 1.0 + E;
  return (x < 0.0 ? E : 1.0) / d;  // NaN: E is NaN
}
CARBON_HD bool sigmoid_is_small(double x) { return abs_value(x) < 0x1p-10; }
CARBON_HD double sigmoid_core(double x) {
  if (sigmoid_is_small(x)) {
    const double q = 0.25 * x;
    const double s = 0.5 + q;
    const double err = (q - (s - 0.5)) + sigmoid_small_tail(x, x * x);  // Fast2Sum: 0.5 >= |q|
    return with_correction(s, err);
  }
  return sigmoid_large(x);
}

// |x| < 0.55: tanh = em/(em+2) with em = expm1(2|x|) (positive terms, no
// cancellation): < 2^-50. Otherwise tanh = 1 - q, q = 2/(e^{2|x|}+1) <= 0.4996:
// q has relative error < 2^-49, and 1 - q >= q, so < 2^-49 too. Saturates to 1
// (q = 0) for large |x| and at inf.
CARBON_HD double tanh_q(double a) { return 2.0 / (exp_core(2.0 * a) + 1.0); }
CARBON_HD double tanh_core(double x) {
  const double a = abs_value(x);
  double t;
  if (a < 0.55) {
    const double em = expm1_small(2.0 * a);
    t = em / (em + 2.0);
  } else {
    t = 1.0 - tanh_q(a);  // NaN stays NaN
  }
  return with_sign_of(t, x);
}

// ---- erf, erfc -----------------------------------------------------------------
// erf(u) for |u| < 0.5, with z = u^2: u * (2/sqrt(pi)) sum_{n<=12} (-1)^n z^n /
// (n! (2n+1)). Truncation < 0.25^13/(13! 27) < 2^-64; the alternating terms
// add up to at most 1.1 times the result: < 2^-51.
CARBON_HD double erf_small(double u, double z) {
  constexpr double kSeries[13] = {
      0x1.9e6ad5e55a730p-34,  -0x1.51d7181c5d36dp-30, 0x1.fcc5720624c1cp-27, -0x1.5f742ec43e71ap-23,
      0x1.b9e6c9dc651a3p-20,  -0x1.f4d25c3e0c2ebp-17, 0x1.f9a326f9b89b7p-14, -0x1.c02db40040b86p-11,
      0x1.565bcd0e6a53fp-8,   -0x1.b82ce31288b51p-6,  0x1.ce2f21a042be2p-4,  -0x1.812746b0379e7p-2,
      0x1.20dd750429b6dp+0,
  };
  return u * horner(kSeries, z);
}

// erfcx(u) = exp(u^2) erfc(u) for u >= 0.5 by two Chebyshev fits of degree 21
// (scripts/elementwise_fit.py): P(u - 1.3125) on [0.5, 2.125] and
// Q(1/u - 0.28125) on [2.125, 10.625], fit errors < 2^-60 relative; the sums of
// |terms| are at most 2.6 and 4.9 times the value: < 2^-50. u is clamped to
// 10.625 (erfc(10.625) < 2^-166, below anything a format can hold next to
// the factors it is used with).
CARBON_HD double erfcx_large(double u) {
  constexpr double kMid[22] = {
      -0x1.72c768676d7a5p-35, 0x1.76694beffba18p-33,  -0x1.1f1131a8cc021p-31, 0x1.141bb8147e4d6p-29,
      -0x1.0c4dcb1cd74e8p-27, 0x1.efe00310177bcp-26,  -0x1.bf084729b6205p-24, 0x1.8a2b31f63f426p-22,
      -0x1.52e82c1d898d1p-20, 0x1.1baa8cf324912p-18,  -0x1.cd84508f18c17p-17, 0x1.6c2f328cd2166p-15,
      -0x1.1624f91b63b2cp-13, 0x1.9a25c3dcf40f8p-12,  -0x1.230930608102fp-10, 0x1.8c10e9aaf10ddp-9,
      -0x1.014991d6579d3p-7,  0x1.3d5e9f54c98e2p-6,   -0x1.711413b59af41p-5,  0x1.90e47c99926d0p-4,
      -0x1.917d7928e2332p-3,  0x1.6bb376a9390cdp-2,
  };
  constexpr double kLarge[22] = {
      0x1.13e60301ad89bp+8,  -0x1.c07b1d8aa89d2p+5, -0x1.789d6127909edp+6, 0x1.d857feb9d8930p+5,
      -0x1.9f4be7d57a2bbp+3, -0x1.64487a8a9fe3cp+2, 0x1.146e9ed1fe03ep+3,  -0x1.551def99caa77p+2,
      0x1.4c31afa2d5f17p+0,  0x1.e2f4693e8e312p-1,  -0x1.512642e90a4e3p+0, 0x1.7470014b1b640p-1,
      -0x1.212417e4408fbp-5, -0x1.4b9be94d6a726p-2, 0x1.3d723994e387ap-2,  -0x1.7f482cd98ea31p-4,
      -0x1.ee7b540d1304ap-4, 0x1.9014851e1bff3p-3,  -0x1.65e6850863b93p-4, -0x1.5dba191ebb5b3p-3,
      0x1.03f6fa839192dp-1,  0x1.3967fa672c478p-3,
  };
  const double uc = u < 10.625 ? u : 10.625;  // NaN: 10.625 (the caller's exp carries the NaN)
  // Both fits, then a select (not a branch): CPU loops over it vectorize.
  const double mid = horner(kMid, uc - 1.3125), large = horner(kLarge, 1.0 / uc - 0.28125);
  return uc < 2.125 ? mid : large;
}

// erfc(u) for u >= 0.5 (or NaN), given u2 = u^2 exactly (the caller knows it
// exactly: x*x of a float, or (t*t)/2 when u = t/sqrt(2) rounded). exp(-u2)
// has an exact argument; erfcx's sensitivity to the rounding of u is below
// 1 (|d log erfcx / d log u| < 1): < 2^-48.5 in all.
CARBON_HD double erfc_large(double u, double u2) { return exp_core(-u2) * erfcx_large(u); }

// |x| < 0.5: series. Else 1 - erfc(|x|) with erfc <= 0.48 < erf: < 2^-48.
// Saturates to +-1 through erfc -> 0.
CARBON_HD double erf_core(double x) {
  const double a = abs_value(x);
  const double z = a * a;  // exact for float arguments (48 significant bits)
  const double r = a < 0.5 ? erf_small(a, z) : 1.0 - erfc_large(a, z);
  return with_sign_of(r, x);
}

// Phi(x) = P(N(0,1) <= x) = erfc(-x/sqrt(2))/2, from u = |x|/sqrt(2) (rounded:
// relative sensitivity of the result below 1 in every branch) and
// u2 = x^2/2 (exact for float x):
//   |u| < 0.5: 1/2 +- erf(u)/2 (result >= 0.24: no cancellation);
//   u >= 0.5:  x > 0: 1 - erfc(u)/2 (>= 0.76); x < 0: erfc(u)/2.
// Relative error < 2^-47.5.
CARBON_HD double phi_cdf(double x) {
  constexpr double kInvSqrt2 = 0x1.6a09e667f3bcdp-1;
  const double a = abs_value(x);
  const double u = a * kInvSqrt2;
  const double u2 = 0.5 * (a * a);
  // Both branches, then selects (not branches): CPU loops over gelu and its
  // derivative vectorize. (erfc_large of a small u, or erf_small of a large
  // one, is finite or NaN and is discarded.)
  const bool negative = sign_bit(x);
  const double half_erf = 0.5 * erf_small(u, u2);
  const double small = negative ? 0.5 - half_erf : 0.5 + half_erf;
  const double half_erfc = 0.5 * erfc_large(u, u2);
  const double large = negative ? half_erfc : 1.0 - half_erfc;
  return u < 0.5 ? small : large;
}

// phi(x) = exp(-x^2/2)/sqrt(2 pi): exact argument, < 2^-49.
CARBON_HD double phi_pdf(double x) {
  constexpr double kInvSqrt2Pi = 0x1.9884533d43651p-2;
  return kInvSqrt2Pi * exp_core(-0.5 * (x * x));
}

// Clamp of x to [lo, hi], NaN kept (the limits at +-inf are reached well
// inside, and clamping avoids inf * 0).
CARBON_HD double clamp(double x, double lo, double hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

// ---- gelu, gelu_tanh, silu ---------------------------------------------------
// For 0 < |x| < 2^-60 these three functions equal x/2 + c x^2 + O(x^4) with
// c > 0, and their double result is x/2 exactly (the x^2 term is below half an
// ulp). x/2 can be a rounding midpoint (x subnormal in its format, odd last
// bit), where the lost term decides: the true value is above x/2, so the
// result steps to the next double up. That changes no other rounding: x/2 has
// at most 25 significant bits, so neither it is passed nor is its successor
// (53 significant bits) a midpoint of any format.
CARBON_HD double above_half_x(double x, double r) {
  return (abs_value(x) < 0x1p-60 && x != 0.0) ? next_up(r) : r;
}

// gelu(x) = x Phi(x): one more rounding, < 2^-47. For x < 0 Phi(x) comes from
// erfc (no cancellation), so the bound holds down to gelu's underflow.
CARBON_HD double gelu_core(double x) {
  const double xc = x < -1e10 ? -1e10 : x;  // gelu(-inf) = -0 (the limit)
  return above_half_x(x, xc * phi_cdf(xc));
}

// gelu_tanh(x) = x/2 (1 + tanh(v)), v = sqrt(2/pi) (x + 0.044715 x^3)
//              = x sigmoid(2v)   (1 + tanh v = 2 sigmoid(2v)).
// y = 2v = c x (1 + a x^2), with x^2 exact and fma: relative error < 3.01u
// (plus the constants' own rounding, < 2u). sigmoid(y) has sensitivity
// |y| (1 - sigmoid(y)) < |y| + 1; where the result is above float's underflow,
// |y| < 110: error < 110 * 5u + 2^-49.5 < 2^-45 relative.
CARBON_HD double gelu_tanh_y(double x) {
  constexpr double kTwoSqrt2OverPi = 0x1.9884533d43651p+0;
  constexpr double kA = 0.044715;
  return kTwoSqrt2OverPi * x * fma(kA, x * x, 1.0);
}
CARBON_HD double gelu_tanh_core(double x) {
  const double xc = x < -1e10 ? -1e10 : x;
  return above_half_x(x, xc * sigmoid_core(gelu_tanh_y(xc)));
}
// gelu_tanh_core where sigmoid takes its main branch (|y| >= 2^-10), and
// whether it does not.
CARBON_HD double gelu_tanh_large(double x) {
  const double xc = x < -1e10 ? -1e10 : x;
  return above_half_x(x, xc * sigmoid_large(gelu_tanh_y(xc)));
}
CARBON_HD bool gelu_tanh_is_small(double x) { return sigmoid_is_small(gelu_tanh_y(clamp(x, -1e10, 1e10))); }

// silu(x) = x sigmoid(x): < 2^-49. For |x| < 2^-10 silu(x) = x/2 + x^2/4 -
// x^4/48 + ..., where x/2 + x^2/4 can be exactly a rounding midpoint: it is
// formed by an exact two-sum (x^2 exact for float x) and the rest passed as
// a correction, as for sigmoid. (This includes |x| < 2^-60, x/2 + tiny.)
CARBON_HD double silu_large(double x) {  // |x| >= 2^-10, NaN, +-inf
  const double xc = x < -1e10 ? -1e10 : x;
  return xc * sigmoid_large(xc);
}
CARBON_HD double silu_core(double x) {
  if (sigmoid_is_small(x)) {
    if (x == 0.0) return x;  // silu(-0) = -0
    const double h = 0.5 * x, q = 0.25 * (x * x);
    const double s = h + q;
    const double err = (q - (s - h)) + x * sigmoid_small_tail(x, x * x);  // Fast2Sum: |h| >= q
    return with_correction(s, err);
  }
  return silu_large(x);
}

// ---- derivatives -----------------------------------------------------------------
CARBON_HD double exp_grad_core(double x) { return exp_core(x); }

// log'(x) = 1/x for x >= 0 (log'(+-0) = +inf), NaN for x < 0 (where log is NaN).
CARBON_HD double log_grad_core(double x) { return x < 0.0 ? quiet_nan() : 1.0 / abs_value(x); }

// tanh' = 1 - tanh^2: |x| < 0.55: 1 - t^2 with t <= 0.5 (fma); otherwise
// (1 - t)(1 + t) = q (2 - q) with q = 1 - |tanh x| computed directly: < 2^-48.
CARBON_HD double tanh_grad_core(double x) {
  const double a = abs_value(x);
  if (a < 0.55) {
    const double em = expm1_small(2.0 * a);
    const double t = em / (em + 2.0);
    return fma(-t, t, 1.0);
  }
  const double q = tanh_q(a);
  return q * (2.0 - q);
}

// sigmoid'(x) = s (1 - s) = E/(1+E)^2, E = exp(-|x|): < 2^-48.
CARBON_HD double sigmoid_grad_core(double x) {
  const double E = exp_core(-abs_value(x));
  const double d = 1.0 + E;
  return E / (d * d);
}

// erf'(x) = 2/sqrt(pi) exp(-x^2): < 2^-49.
CARBON_HD double erf_grad_core(double x) {
  constexpr double kTwoOverSqrtPi = 0x1.20dd750429b6dp+0;
  return kTwoOverSqrtPi * exp_core(-(x * x));
}

// ---- derivatives near their roots ---------------------------------------------
// gelu', gelu_tanh' and silu' cross zero (near -0.752, -0.752 and -1.278). There
// their formulas subtract nearly equal terms (Phi(x) ~ -x phi(x)), and the
// relative error of the difference grows as x nears the root r: at the float32
// closest to r (|x - r| ~ 1.2e-8) it reached 2^-27, 0.58 ulp after rounding
// (scripts/elementwise_ulp.py, all 2^32 inputs). For |x - r_hi| < 2^-7 the cores
// evaluate the Taylor series instead: f(x) = d (c1 + d (c2 + ... + d c8)),
// d = (x - r_hi) - r_lo, with r = r_hi + r_lo to ~2^-106 and c_k = f^(k)(r)/k!
// rounded to binary64 (scripts/elementwise_roots.py, mpmath at 240 bits).
// x - r_hi is exact (Sterbenz: x and r_hi within a factor 2), so d has relative
// error <= 2^-53 (+ 2^-106 absolute, against |d| >= 1.1e-8 for any float32 x);
// truncation after c8 is below 2^-60 relative to c1 d for |d| < 2^-7, and the
// Horner steps (fma, |c_k d| << |c_{k-1}|) add a few 2^-53: well below 2^-40.
CARBON_HD bool near_root(double x, double root_hi) {
  const double d = x - root_hi;
  return d < 0x1p-7 && d > -0x1p-7;  // false for NaN
}

CARBON_HD double root_series(double x, double hi, double lo, double c1, double c2, double c3, double c4, double c5,
                             double c6, double c7, double c8) {
  const double d = (x - hi) - lo;
  double p = fma(c8, d, c7);
  p = fma(p, d, c6);
  p = fma(p, d, c5);
  p = fma(p, d, c4);
  p = fma(p, d, c3);
  p = fma(p, d, c2);
  p = fma(p, d, c1);
  return p * d;
}

constexpr double kGeluGradRootHi = -0x1.80ead197f00b4p-1;     // gelu' = 0 at -0.751791524693564457...
constexpr double kGeluTanhGradRootHi = -0x1.81429f9e97e4dp-1;  // gelu_tanh' = 0 at -0.752461422071016258...
constexpr double kSiluGradRootHi = -0x1.474973c84120bp+0;      // silu' = 0 at -1.278464542761073795...

CARBON_HD double gelu_grad_near_root(double x) {
  return root_series(x, kGeluGradRootHi, 0x1.13e74c58cada8p-56, 0x1.b9d98fa5a3215p-2, 0x1.8d9a941de3ac5p-2,
                     -0x1.2a2ef9bb865aep-6, -0x1.d2fa4c17c7e84p-4, -0x1.e4088244f901dp-7, 0x1.3e346def42057p-6,
                     0x1.297b9d6ffaacdp-8, -0x1.258a6d85633afp-9);
}
CARBON_HD double gelu_tanh_grad_near_root(double x) {
  return root_series(x, kGeluTanhGradRootHi, 0x1.4f523ed77dbdcp-55, 0x1.b8bacd2c96b91p-2, 0x1.8cd1a2b2fff33p-2,
                     -0x1.029615edb077ap-6, -0x1.d2b77346470abp-4, -0x1.104a83edc0ddcp-6, 0x1.427996dc249cep-6,
                     0x1.58c9ed713486cp-8, -0x1.3d8d64170bb72p-9);
}
CARBON_HD double silu_grad_near_root(double x) {
  return root_series(x, kSiluGradRootHi, -0x1.f8d74bc9ac154p-54, 0x1.be1410460527fp-3, 0x1.2c563458cc0adp-3,
                     0x1.353eb573ca457p-6, -0x1.f2d0e32bc2994p-7, -0x1.b0f82c498fd2fp-8, 0x1.098e92b8f076dp-13,
                     0x1.a2a7caf0ee747p-11, 0x1.8574d136d4cb4p-13);
}

// gelu'(x) = Phi(x) + x phi(x); the series near its root.
CARBON_HD double gelu_grad_core(double x) {
  if (near_root(x, kGeluGradRootHi)) return gelu_grad_near_root(x);
  const double xc = clamp(x, -1e10, 1e10);
  return phi_cdf(xc) + xc * phi_pdf(xc);
}

// gelu_tanh'(x) = s + x s (1 - s) y', s = sigmoid(y), y = c x (1 + a x^2),
// y' = c (1 + 3 a x^2); s (1 - s) = sigmoid'(y) computed without cancellation.
// kMainBranch: s from sigmoid_large, which is sigmoid_core where |y| >= 2^-10.
template <bool kMainBranch>
CARBON_HD double gelu_tanh_grad_of(double x) {
  constexpr double kTwoSqrt2OverPi = 0x1.9884533d43651p+0;
  constexpr double kThreeA = 3.0 * 0.044715;
  const double xc = clamp(x, -1e10, 1e10);
  const double y = gelu_tanh_y(xc);
  const double dy = kTwoSqrt2OverPi * fma(kThreeA, xc * xc, 1.0);
  const double s = kMainBranch ? sigmoid_large(y) : sigmoid_core(y);
  return s + xc * sigmoid_grad_core(y) * dy;
}
CARBON_HD double gelu_tanh_grad_core(double x) {
  return near_root(x, kGeluTanhGradRootHi) ? gelu_tanh_grad_near_root(x) : gelu_tanh_grad_of<false>(x);
}
CARBON_HD double gelu_tanh_grad_large(double x) { return gelu_tanh_grad_of<true>(x); }

// silu'(x) = s (1 + x (1 - s)) = s + x s (1 - s). For |x| < 2^-10 it is
// 1/2 + x/2 - x^3/12 + x^5/80 - 17 x^7/10080 + ... (truncation < 2^-100),
// where 1/2 + x/2 can be exactly a rounding midpoint: exact two-sum plus a
// correction, as for sigmoid.
CARBON_HD double silu_grad_large(double x) {  // |x| >= 2^-10, NaN, +-inf
  const double xc = clamp(x, -1e10, 1e10);
  return sigmoid_large(xc) + xc * sigmoid_grad_core(xc);
}
CARBON_HD double silu_grad_core(double x) {
  if (sigmoid_is_small(x)) {
    constexpr double kC3 = -0x1.5555555555555p-4;  // -1/12
    constexpr double kC5 = 0x1.999999999999ap-7;   // 1/80
    constexpr double kC7 = -0x1.ba1ba1ba1ba1cp-10; // -17/10080
    const double h = 0.5 * x;
    const double s = 0.5 + h;
    const double z = x * x;
    const double err = (h - (s - 0.5)) + x * z * fma(z, fma(z, kC7, kC5), kC3);  // Fast2Sum: 0.5 >= |h|
    return with_correction(s, err);
  }
  if (near_root(x, kSiluGradRootHi)) return silu_grad_near_root(x);
  return silu_grad_large(x);
}

// ---- cos(2 pi u), for the normal distribution (csrc/random/philox.h) --------
// sin(pi/2 g) = g S(g^2) and cos(pi/2 g) = C(g^2) for g in [0, 1/2], x = pi/2 g
// in [0, pi/4]: Taylor polynomials (coefficients (+-)(pi/2)^n/n! rounded to
// double), S to x^17 and C to x^18. Truncation: (pi/4)^19/19! / sin(pi/4)
// < 2^-61 and (pi/4)^20/20! / cos(pi/4) < 2^-67, relative. Rounding: with
// z = g^2 <= 1/4 each term is at most 0.31 times the previous one, so Horner
// with one fma per step keeps every partial sum within a factor 1.3 (S) and
// 1.9 (C) of the final value (sin: sum|terms|/value <= sinh(pi/4)/sin(pi/4)
// = 1.23; cos: cosh(pi/4)/cos(pi/4) = 1.88); each of the <= 10 fmas adds at most
// u times a partial sum, and the rounded coefficients u times a term: in all
// < (10 * 1.9 + 1.9) u < 2^-48.6 relative for C and < 2^-49 for g S(z) (one
// more rounding for the product by g). z = g^2 is exact when g has at most 26
// significant bits (always the case for the uniform draws, multiples of
// 2^-24); otherwise its rounding adds < u * |z C'(z)/C(z)| < 0.6u.
CARBON_HD double sin_half_pi(double g) {
  constexpr double kSin[9] = {
      0x1.aaec32af93359p-38, -0x1.6fadb9f155744p-31, 0x1.e8f434d018d63p-25, -0x1.e3074fde8871fp-19,
      0x1.50783487ee782p-13, -0x1.32d2cce62bd86p-8,  0x1.466bc6775aae2p-4,  -0x1.4abbce625be53p-1,
      0x1.921fb54442d18p+0,
  };
  return g * horner(kSin, g * g);
}
CARBON_HD double cos_half_pi(double g) {
  constexpr double kCos[10] = {
      -0x1.2a0c591af8314p-41, 0x1.20c62c2f2d7f5p-34, -0x1.b6e24f44b128fp-28, 0x1.f9d38a3763cc3p-22,
      -0x1.a6d1f2a204a8cp-16, 0x1.e1f506891babbp-11, -0x1.55d3c7e3cbffap-6,  0x1.03c1f081b5ac4p-2,
      -0x1.3bd3cc9be45dep+0,  0x1.0000000000000p+0,
  };
  return horner(kCos, g * g);
}

// cos(2 pi u) for u in [0, 1). Reduction without rounding: t = 4u is exact
// (a power of two), q = floor(t) in {0,1,2,3} and f = t - q in [0, 1) are
// exact (f's bits are a subset of t's), and cos(2 pi u) = cos(pi/2 (q + f))
// = cos(pi/2 f), -sin(pi/2 f), -cos(pi/2 f), sin(pi/2 f) for q = 0, 1, 2, 3.
// For f > 1/2 the complementary g = 1 - f (exact, Sterbenz) is used:
// cos(pi/2 f) = sin(pi/2 g), sin(pi/2 f) = cos(pi/2 g); so the polynomials
// only see g in [0, 1/2]. Relative error < 2^-48.6 (above); IEEE *, -, fma only.
CARBON_HD double cos2pi_core(double u) {
  const double t = u * 4.0;
  const int q = static_cast<int>(t);  // t >= 0: truncation is floor
  const double f = t - static_cast<double>(q);
  const bool flip = f > 0.5;
  const double g = flip ? 1.0 - f : f;
  // q even needs cos(pi/2 f), q odd sin(pi/2 f); the flip swaps them: only
  // one polynomial is evaluated. Sign: negative for q = 1, 2.
  const bool use_sin = ((q & 1) != 0) != flip;
  const double v = use_sin ? sin_half_pi(g) : cos_half_pi(g);
  return (q == 1 || q == 2) ? -v : v;
}

// ---- sin and cos of a float32 value ----------------------------------------
// x * 2/pi = q + f (mod 4), q integer, f in [-1/2, 1/2]; then
// sin x = sin(pi/2 f), cos(pi/2 f), -sin(pi/2 f), -cos(pi/2 f) for q = 0..3
// (mod 4), and cos x = sin(x + pi/2) uses q + 1. The polynomials above see
// g = |f| <= 1/2.
//
// Reduction (Payne-Hanek, in integers, for |x| > pi/4; x must be a float32
// value, so x = m 2^e with m < 2^24 and e <= 104). Let C = 2/pi = sum_i b_i 2^-i.
// Bits b_i with i <= e - 2 contribute m 2^(e-i), a multiple of 4: they drop
// out mod 4. The 128 bits b_(e-1) .. b_(e+126) form the integer W, and
// m W 2^-126 = x C (mod 4) up to the dropped tail m 2^e sum_(i > e+126) b_i
// 2^-i < 2^24 2^-126 = 2^-102 (absolute). q is bits 126..127 of P = m W and
// f's 126 fraction bits are the bits below. Over all float32 x > pi/4,
// |f| >= 2^-29.86 (`scripts/elementwise_ulp.py --sincos-reduction` measures it; x = 16367173 *
// 2^72 is the closest to a multiple of pi/2), so f has relative error
// < 2^-102 / 2^-29.86 + 2 u < 2^-51.9 (two conversions and one addition, all
// of positive terms). For |x| <= pi/4: q = 0 and f = x * 2/pi in binary64
// (relative error < 1.01 u; x * kTwoOverPiLo is below 2^-54 x).
// sin(pi/2 g) and cos(pi/2 g) have relative error < 2^-48.6 (above), and
// their argument's relative error < 2^-51.9 moves them by at most that times
// |g d/dg log sin(pi/2 g)| <= 1 (sin) or |g (pi/2) tan(pi/2 g)| <= 0.79
// (cos, g <= 1/2): in all < 2^-48 relative. IEEE ops and integers only.
struct QuarterTurns {
  int q;     // x * 2/pi rounded to the nearest integer, mod 4
  double g;  // |f|, f = x * 2/pi - q in [-1/2, 1/2]
  bool f_negative;
};

CARBON_HD uint64_t two_over_pi_word(int k) {
  // Word 0 is zero (bits b_-63 .. b_0, the integer part: the window start
  // e - 1 < 1 for x below 2^25); words 1 .. 20 hold b_1 .. b_1280, high bit
  // first (scripts/binary64_constants.py). float32 arguments read words 0-4;
  // binary64_math.h's float64 reduction reads all of them.
  constexpr uint64_t kWords[21] = {
      0,
      0xa2f9836e4e441529ull, 0xfc2757d1f534ddc0ull, 0xdb6295993c439041ull, 0xfe5163abdebbc561ull,
      0xb7246e3a424dd2e0ull, 0x06492eea09d1921cull, 0xfe1deb1cb129a73eull, 0xe88235f52ebb4484ull,
      0xe99c7026b45f7e41ull, 0x3991d639835339f4ull, 0x9c845f8bbdf9283bull, 0x1ff897ffde05980full,
      0xef2f118b5a0a6d1full, 0x6d367ecf27cb09b7ull, 0x4f463f669e5fea2dull, 0x7527bac7ebe5f17bull,
      0x3d0739f78a5292eaull, 0x6bfb5fb11f8d5d08ull, 0x56033046fc7b6babull, 0xf0cfbc209af4361dull,
  };
  return kWords[k];
}

// |x| > pi/4, a float32 value (as a double): the integer reduction above.
CARBON_HD QuarterTurns reduce_quarter_turns_large(double ax) {
  const uint64_t bits = double_to_bits(ax);
  const int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023 - 23;  // ax = m 2^e
  const uint64_t m = ((bits & kFracMask) | (uint64_t(1) << 52)) >> 29;  // 24 bits: ax is a float32 value
  // The window starts at bit e - 1 of C, at index e - 1 + 63 of the padded words.
  const int o = e + 62;  // 38 .. 166
  const int k = o >> 6, b = o & 63;
  const uint64_t w0 = two_over_pi_word(k), w1 = two_over_pi_word(k + 1), w2 = two_over_pi_word(k + 2);
  const uint64_t hi = b == 0 ? w0 : (w0 << b) | (w1 >> (64 - b));
  const uint64_t mid = b == 0 ? w1 : (w1 << b) | (w2 >> (64 - b));
  // P = m (hi 2^64 + mid): bits 0..127 are all that matter mod 4 * 2^126.
  const uint64_t ma = m * (mid >> 32), mb = m * (mid & 0xFFFFFFFFull);  // each < 2^56
  const uint64_t p0 = (ma << 32) + mb;
  const uint64_t carry = p0 < mb ? 1 : 0;
  const uint64_t p1 = m * hi + (ma >> 32) + carry;  // mod 2^64
  int q = static_cast<int>(p1 >> 62);
  uint64_t f1 = p1 & ((uint64_t(1) << 62) - 1), f0 = p0;  // f = (f1 2^64 + f0) 2^-126
  const bool negative = (f1 >> 61) != 0;                   // f >= 1/2: round q up, f -= 1
  if (negative) {
    q = (q + 1) & 3;
    // 2^126 - f, in two words.
    f1 = (uint64_t(1) << 62) - f1 - (f0 != 0 ? 1 : 0);
    f0 = 0 - f0;
  }
  const double g = static_cast<double>(f1) * 0x1p-62 + static_cast<double>(f0) * 0x1p-126;
  return {q, g, negative};
}

CARBON_HD QuarterTurns reduce_quarter_turns(double ax) {
  constexpr double kQuarterPi = 0x1.921fb54442d18p-1;  // below pi/4
  constexpr double kTwoOverPiHi = 0x1.45f306dc9c883p-1, kTwoOverPiLo = -0x1.6b01ec5417056p-55;
  if (ax <= kQuarterPi) return {0, fma(ax, kTwoOverPiHi, ax * kTwoOverPiLo), false};
  return reduce_quarter_turns_large(ax);
}

// sin(pi/2 (q + f)) from the reduction; shift = 1 gives cos.
CARBON_HD double quarter_turn_sin(QuarterTurns r, int shift) {
  const int q = (r.q + shift) & 3;
  const bool use_cos = (q & 1) != 0;
  double v = use_cos ? cos_half_pi(r.g) : sin_half_pi(r.g);
  // sin(pi/2 f) is odd in f, cos(pi/2 f) even; q = 2, 3 negate.
  const bool negate = (q >= 2) != (!use_cos && r.f_negative);
  return negate ? -v : v;
}

// sin x for a float32 value x: odd (sin(-0) = -0); NaN for +-inf and NaN.
CARBON_HD double sin_core(double x) {
  if (!is_finite(x)) return quiet_nan();
  const double v = quarter_turn_sin(reduce_quarter_turns(abs_value(x)), 0);
  return sign_bit(x) ? -v : v;
}

// cos x for a float32 value x: even; NaN for +-inf and NaN.
CARBON_HD double cos_core(double x) {
  if (!is_finite(x)) return quiet_nan();
  return quarter_turn_sin(reduce_quarter_turns(abs_value(x)), 1);
}

CARBON_HD double sin_grad_core(double x) { return cos_core(x); }
CARBON_HD double cos_grad_core(double x) { return -sin_core(x); }

// ---- log1p, softplus, log-sigmoid -------------------------------------------
// log1p(y): for |y| <= 1/4, 2 atanh(s) with s = y / (2 + y) (two roundings:
// relative error of s < 2.01u), |s| <= 1/7, z = s^2 <= 0.0205, inside
// log_core's series bound (z <= 0.0294): < 2^-50. Otherwise log_core(1 + y):
// 1 + y rounds by at most u (1 + y), which moves the log by at most
// u (1 + y) / ((1 + y) |log(1 + y)|) <= u / log(4/3) < 3.5u: < 2^-49.8 in all.
// log1p(-1) = -inf, y < -1 NaN, log1p(+-0) = +-0, log1p(inf) = inf.
CARBON_HD double log1p_core(double y) {
  constexpr double kSeries[10] = {
      0x1.8618618618618p-5, 0x1.af286bca1af28p-5, 0x1.e1e1e1e1e1e1ep-5, 0x1.1111111111111p-4,
      0x1.3b13b13b13b14p-4, 0x1.745d1745d1746p-4, 0x1.c71c71c71c71cp-4, 0x1.2492492492492p-3,
      0x1.999999999999ap-3, 0x1.5555555555555p-2,
  };
  if (!(abs_value(y) <= 0.25)) return log_core(1.0 + y);  // NaN, inf and y < -1 included
  if (y == 0.0) return y;                                  // keeps the sign of zero
  const double s = y / (2.0 + y);
  const double z = s * s;
  const double s2 = 2.0 * s;
  return fma(s2, z * horner(kSeries, z), s2);
}

// softplus(x) = log(1 + e^x): x + log1p(e^-x) for x >= 0 (two positive terms),
// log1p(e^x) for x < 0 (e^x < 1, log1p's condition number <= 1): relative
// error < 2^-49 (exp 2^-49.5, log1p 2^-49.8, one addition). +inf -> +inf,
// -inf -> +0 (e^x underflows to 0 below -745; the float result is 0 anyway).
CARBON_HD double softplus_core(double x) {
  if (is_nan(x)) return x;
  if (x >= 0.0) return x + log1p_core(exp_core(-x));
  return log1p_core(exp_core(x));
}

// log sigmoid(x) = -softplus(-x): NaN stays NaN; -inf -> -inf, +inf -> -0.
CARBON_HD double log_sigmoid_core(double x) { return -softplus_core(-x); }

// Derivatives: log1p' = 1 / (1 + x) (relative error < 2u; +inf at -1, NaN
// below); softplus' = sigmoid(x); log-sigmoid' = sigmoid(-x).
CARBON_HD double log1p_grad_core(double x) {
  if (x < -1.0) return quiet_nan();
  return 1.0 / (1.0 + x);
}
CARBON_HD double softplus_grad_core(double x) { return sigmoid_core(x); }
CARBON_HD double log_sigmoid_grad_core(double x) { return sigmoid_core(-x); }

// ---- expm1 -------------------------------------------------------------------------
// expm1(x) = e^x - 1 without the cancellation near 0 (ELU, SELU, CELU; Mamba):
//  * 0 < x <= 1.1: expm1_small(x) (< 2^-51);
//  * -1.1 <= x < 0: -e / (1 + e) with e = expm1_small(-x) > 0 (e^x - 1 = -(e^-x - 1) / e^-x):
//    e < 2^-51, 1 + e and the division one rounding each: < 2^-50;
//  * beyond: exp_core(x) - 1: for x > 1.1, e^x - 1 >= (2/3) e^x, so exp's 2^-49.5 grows by at
//    most 1.5 (< 2^-48.9 with the subtraction); for x < -1.1, |e^x - 1| >= 2/3 > e^x: < 2^-50.
// expm1(+-0) = +-0, +inf -> +inf, -inf -> -1, NaN stays NaN. The derivative is e^x.
CARBON_HD double expm1_core(double x) {
  if (!(x == x) || x == 0.0) return x;
  if (abs_value(x) <= 1.1) {
    if (x > 0.0) return expm1_small(x);
    const double e = expm1_small(-x);
    return -e / (1.0 + e);
  }
  return exp_core(x) - 1.0;
}
CARBON_HD double expm1_grad_core(double x) { return exp_core(x); }

// ---- log2, log10 -------------------------------------------------------------------
// log2(x) = log_core(x) * RN(1/ln 2): log_core < 2^-50 (every positive double), the
// constant and the product one rounding each: < 2^-50 + 2u < 2^-49.6 (all 2^32 float32
// inputs correctly rounded, docs/elementwise.md). log10(x) = log_core(x) / ln 10 with
// 1/ln 10 as a double-double (hi + lo, error < 2^-107) and one fma: < 2^-50 + u. (With
// the single constant, log10 of 3 float32 inputs landed on a rounding midpoint exactly,
// e.g. x = 9.88485542e-33, 2^-52 from it; with the fma 1 input of 2^32 still does:
// docs/elementwise.md.) log2(2^k) and log10(10^k) are integers,
// never rounding midpoints (and log_b(x) is irrational for every other float x), so
// nothing structural sits at a midpoint. Special values as log: +-0 -> -inf, x < 0 ->
// NaN, +inf -> +inf, log_b(1) = +0.
// Derivatives: RN(1/ln b) / |x| (+inf at +-0, NaN below 0): < 2u.
constexpr double kRnInvLn2 = 0x1.71547652b82fep+0;   // RN(1/ln 2)
constexpr double kRnInvLn10 = 0x1.bcb7b1526e50ep-2;  // RN(1/ln 10)
CARBON_HD double log2_core(double x) { return log_core(x) * kRnInvLn2; }
CARBON_HD double log10_core(double x) {
  constexpr double kInvLn10Lo = 0x1.95355baaafad3p-57;  // 1/ln 10 - kRnInvLn10, rounded
  const double y = log_core(x);
  return fma(y, kRnInvLn10, y * kInvLn10Lo);
}
CARBON_HD double log2_grad_core(double x) { return x < 0.0 ? quiet_nan() : kRnInvLn2 / abs_value(x); }
CARBON_HD double log10_grad_core(double x) { return x < 0.0 ? quiet_nan() : kRnInvLn10 / abs_value(x); }

// ---- exp2 ---------------------------------------------------------------------------
// 2^x = 2^k 2^r with k = round(x) and r = x - k in [-1/2, 1/2], both exact (x + 1.5*2^52
// rounds x to an integer for |x| < 2^51; the difference keeps x's low bits). 2^r =
// exp_core(r * RN(ln 2)): the constant and the product round by u each, an absolute error
// < 0.35 * 2.01u in the argument of e^: relative < 0.71u, plus exp_core's 2^-49.5:
// < 2^-49.4. 2^k in two exact powers of two as in exp_core (one rounding, gradual
// underflow, overflow). Integers x give 2^x exactly (r = 0, exp_core(0) = 1); 2^x of
// any other float is irrational. x is clamped to [-1080, 1030], where 2^x is 0 / inf in
// double already; NaN stays NaN.
// Derivative: RN(ln 2) * 2^x: < 2^-49.3.
constexpr double kRnLn2 = 0x1.62e42fefa39efp-1;  // RN(ln 2)
CARBON_HD double exp2_core(double x) {
  constexpr double kShifter = 0x1.8p52;
  const bool nan = !(x == x);
  const double xc = nan ? 0.0 : clamp(x, -1080.0, 1030.0);
  const double kd = (xc + kShifter) - kShifter;
  const double r = xc - kd;
  const int k = static_cast<int>(kd);
  const int k1 = k / 2;
  const double result = (exp_core(r * kRnLn2) * pow2(k1)) * pow2(k - k1);
  return nan ? x : result;
}
CARBON_HD double exp2_grad_core(double x) { return kRnLn2 * exp2_core(x); }

// ---- erfc ---------------------------------------------------------------------------
// erfc(x) = 1 - erf(x), without 1 - erf's cancellation for large x:
//  * |x| < 0.5: 1 - erf_small(x) (< 2^-51): |erf x| <= 0.5205 and the result >= 0.4795,
//    so the error grows by at most 1.09, plus the subtraction: < 2^-50.6;
//  * x >= 0.5: erfc_large(x, x^2) (x^2 exact for a float x): < 2^-48.5;
//  * x <= -0.5: 2 - erfc_large(|x|, x^2): erfc(|x|) <= 0.4795 against a result >= 1.52:
//    < 2^-49.9.
// Beyond x = 10.625 erfcx_large is held at its value there, so the result is off by
// a factor < 1, but erfc(x) and the core are both below 2^-166 there: +0 in every
// format. erfc(+inf) = +0, erfc(-inf) = 2, NaN stays NaN.
// Derivative: -2/sqrt(pi) e^{-x^2} = -erf'(x): < 2^-49.
CARBON_HD double erfc_core(double x) {
  const double a = abs_value(x);
  const double z = a * a;  // exact for float arguments (48 significant bits)
  if (a < 0.5) return 1.0 - erf_small(x, z);
  const double e = erfc_large(a, z);  // NaN: NaN
  return sign_bit(x) ? 2.0 - e : e;
}
CARBON_HD double erfc_grad_core(double x) { return -erf_grad_core(x); }

// ---- sinh, cosh ---------------------------------------------------------------------
// sinh(a), a = |x| (odd: the sign of x is put back, sinh(-0) = -0):
//  * a <= 1.1: (e + e/(1 + e))/2 with e = expm1_small(a) (< 2^-51; e^-a - 1 = -e/(1 + e)):
//    e/(1 + e) has sensitivity <= 1 to e and two roundings, the sum of the two positive
//    terms one more: < 2^-51 + 3u < 2^-50.2;
//  * a > 1.1: (E - 1/E)/2 with E = exp_core(a) (< 2^-49.5): the difference cancels by
//    at most coth(1.1) < 1.25: < 1.25 * 2^-49.5 + 2u < 2^-48.9.
// Overflows to inf (for a > 709.78, where sinh is far beyond every format). NaN stays
// NaN. Its derivative is cosh.
CARBON_HD double sinh_core(double x) {
  const double a = abs_value(x);
  double s;
  if (a <= 1.1) {
    const double e = expm1_small(a);
    s = 0.5 * (e + e / (1.0 + e));
  } else {
    const double E = exp_core(a);  // NaN: NaN
    s = 0.5 * (E - 1.0 / E);
  }
  return with_sign_of(s, x);
}

// cosh(a), a = |x| (even):
//  * a < 0.5: 1 + t with t = cosh a - 1 = e^2 / (2 (1 + e)), e = expm1_small(a): t has
//    relative error < 2^-50 + 3u < 2^-49.4 and t < 0.128, so 1 + t is within 2^-52.3
//    before its own rounding. 1 + t is formed by an exact two-sum and the rest passed as
//    a correction (with_correction): near a = 0, cosh a = 1 + a^2/2 + ... comes within
//    2^-49 (relative) of float32 midpoints 1 + (2k+1) 2^-24, closer than one double
//    rounding could resolve; with the correction those round correctly too;
//  * a >= 0.5: (E + 1/E)/2, E = exp_core(a): positive terms, < 2^-49.5 + 2u < 2^-49.2.
// cosh(+-0) = 1, cosh(+-inf) = +inf, NaN stays NaN. Its derivative is sinh.
CARBON_HD double cosh_core(double x) {
  const double a = abs_value(x);
  if (a < 0.5) {
    const double e = expm1_small(a);
    const double t = (e * e) / (2.0 * (1.0 + e));
    const double s = 1.0 + t;
    return with_correction(s, t - (s - 1.0));  // Fast2Sum: 1 >= t
  }
  const double E = exp_core(a);  // NaN: NaN
  return 0.5 * (E + 1.0 / E);
}
CARBON_HD double sinh_grad_core(double x) { return cosh_core(x); }
CARBON_HD double cosh_grad_core(double x) { return sinh_core(x); }

// ---- tan ----------------------------------------------------------------------------
// tan x for a float32 value x, from sin/cos's reduction |x| 2/pi = q + f, g = |f| <= 1/2
// (above): tan(pi/2 (q + f)) = tan(pi/2 f) for q even, -cot(pi/2 f) for q odd, with
// tan(pi/2 f) = sign(f) S/C, S = sin_half_pi(g), C = cos_half_pi(g). S < 2^-49, C
// < 2^-48.6, the division u, and g's relative error (< 2^-51.9) moves tan(pi/2 g) and
// cot(pi/2 g) by at most pi g / sin(pi g) <= pi/2 times it: < 2^-47.5 in all. Near an
// odd multiple of pi/2 the reduction keeps g's relative accuracy (|f| >= 2^-29.86 over
// all float32 x > pi/4), so tan stays accurate there, up to |tan x| < 2^30. Odd (tan(-0)
// = -0); NaN for +-inf and NaN.
// Derivative: 1/cos^2 x from cos_core (< 2^-48): < 2^-46.9.
CARBON_HD double tan_core(double x) {
  if (!is_finite(x)) return quiet_nan();
  const QuarterTurns r = reduce_quarter_turns(abs_value(x));
  const double s = sin_half_pi(r.g), c = cos_half_pi(r.g);
  double t = (r.q & 1) != 0 ? -(c / s) : s / c;
  if (r.f_negative) t = -t;
  return sign_bit(x) ? -t : t;
}
CARBON_HD double tan_grad_core(double x) {
  const double c = cos_core(x);
  return 1.0 / (c * c);
}

// ---- atan, asin, acos ---------------------------------------------------------------
// atan(a), a = |x| (odd). b = a for a <= 1, else b = RN(1/a) and atan a = pi/2 - atan b.
// k = round(4b) in 0..4 and c = k/4, |b - c| <= 1/8: atan b = atan c + atan t with
// t = (b - c)/(1 + bc), |t| <= 0.1251 (t = b for k = 0). b - c is exact (Sterbenz: b
// in [c/2, 2c] for k >= 1), 1 + bc (fma) and the division round: t has relative error
// < 2.01u. atan t = t + t z Q(z), z = t^2 <= 0.01566, Q the Taylor series to t^17/17:
// truncation < z^9/19 < 2^-58 relative; t z Q is below t/190, so its rounding errors
// count 1/190, and the final fma rounds: atan t has error < 3.05u |t| (with t's own,
// sensitivity <= 1). atan c and pi/2 - atan c are double-doubles (hi + lo, error
// < 2^-106); atan b = hi + (lo + atan t) rounds twice more. With |t| < 0.98 |atan b|
// (worst at b = 1/8, k = 1) the total is < 5.1u; for b = RN(1/a) its rounding adds
// < u/2 absolute and the result pi/2 - atan b >= pi/4 keeps it < 3u. In all < 5.1u
// < 2^-50.6. atan(+-inf) = +-RN(pi/2), atan(+-0) = +-0, NaN stays NaN.
// Derivative: 1/(1 + x^2) (fma: two roundings): < 2u.
CARBON_HD double atan_core(double x) {
  constexpr double kSeries[8] = {  // (-1)^n / (2n + 1), n = 8..1
      0x1.e1e1e1e1e1e1ep-5,  -0x1.1111111111111p-4, 0x1.3b13b13b13b14p-4, -0x1.745d1745d1746p-4,
      0x1.c71c71c71c71cp-4,  -0x1.2492492492492p-3, 0x1.999999999999ap-3, -0x1.5555555555555p-2,
  };
  constexpr double kAtanHi[5] = {0.0, 0x1.f5b75f92c80ddp-3, 0x1.dac670561bb4fp-2, 0x1.4978fa3269ee1p-1,
                                 0x1.921fb54442d18p-1};  // atan(k/4)
  constexpr double kAtanLo[5] = {0.0, 0x1.8ab6e3cf7afbdp-57, 0x1.a2b7f222f65e2p-56, 0x1.2419a87f2a458p-56,
                                 0x1.1a62633145c07p-55};
  constexpr double kCoHi[5] = {0x1.921fb54442d18p+0, 0x1.5368c951e9cfdp+0, 0x1.1b6e192ebbe44p+0,
                               0x1.dac670561bb4fp-1, 0x1.921fb54442d18p-1};  // pi/2 - atan(k/4)
  constexpr double kCoLo[5] = {0x1.1a62633145c07p-54, -0x1.96f47948a99f1p-54, 0x1.b1b466a88828ep-54,
                               0x1.a2b7f222f65e2p-55, 0x1.1a62633145c07p-55};
  if (!(x == x)) return x;
  const double a = abs_value(x);
  const bool invert = a > 1.0;
  const double b = invert ? 1.0 / a : a;  // in [0, 1]
  const int k = static_cast<int>(4.0 * b + 0.5);
  const double c = 0.25 * static_cast<double>(k);
  const double t = k == 0 ? b : (b - c) / fma(b, c, 1.0);
  const double z = t * t;
  const double p = fma(t * z, horner(kSeries, z), t);
  const double r = invert ? kCoHi[k] + (kCoLo[k] - p) : kAtanHi[k] + (kAtanLo[k] + p);
  return with_sign_of(r, x);
}
CARBON_HD double atan_grad_core(double x) { return 1.0 / fma(x, x, 1.0); }

// asin x = atan(x / sqrt(1 - x^2)) for |x| <= 1: 1 - x^2 (fma, one rounding), the
// square root (IEEE, correctly rounded) and the division give the argument a relative
// error < 2.5u, which atan's sensitivity (y / ((1 + y^2) atan y) <= 1) passes on: with
// atan's 5.1u, < 7.6u < 2^-50. asin(+-1) = atan(+-inf) = +-RN(pi/2); |x| > 1 (and
// +-inf) give sqrt of a negative number: NaN. Odd (asin(-0) = -0).
// acos x = 2 atan(sqrt((1 - x)/(1 + x))): two roundings in 1 -+ x, the division and the
// square root: < 2.5u in the argument, < 7.6u < 2^-50 in all. acos(1) = +0, acos(-1) =
// 2 atan(+inf) = RN(pi); |x| > 1 and +-inf: NaN.
// Derivatives: +-1/sqrt(1 - x^2): < 2.5u; +inf at +-1, NaN beyond.
CARBON_HD double asin_core(double x) { return atan_core(x / sqrt(fma(-x, x, 1.0))); }
CARBON_HD double acos_core(double x) { return 2.0 * atan_core(sqrt((1.0 - x) / (1.0 + x))); }
CARBON_HD double asin_grad_core(double x) { return 1.0 / sqrt(fma(-x, x, 1.0)); }
CARBON_HD double acos_grad_core(double x) { return -1.0 / sqrt(fma(-x, x, 1.0)); }

// ---- erfinv -----------------------------------------------------------------------
// erfinv(x) for a float32 value x (odd; a = |x|), by one Halley step from an approximation:
//  * start: M. Giles' single-precision approximation ("Approximating the erfinv function",
//    GPU Computing Gems Jade, 2011): w = -log(1 - a^2), then a P(w - 2.5) for w < 5 and
//    a Q(sqrt(w) - 3) beyond, P and Q of degree 8 (his decimal constants, rounded to
//    binary64), evaluated in binary64 with log_core. Its relative error eps0 over all float32
//    a in (0, 1) is below 2^-22.9 (scripts/elementwise_ulp.py --erfinv-start measures it
//    against the long double reference; docs/elementwise.md).
//  * Halley's step for f(y) = erf(y) - a, whose f''/f' = -2y is exact and free:
//    y <- y - f / (f' + y f), f' = erf'(y). It triples the number of correct bits:
//    the error after it is (1 + y^2)/3 e0^3 + O(e0^4) (e0 = y eps0 the absolute error
//    before), relative < (1 + y^2)/3 y^2 eps0^3 < 77 eps0^3 < 2^-62 (y <= erfinv(1 - 2^-24)
//    = 3.833, the largest for a float32 a < 1).
//  * the residual f decides the accuracy: an error d in it moves y by d / f'(y).
//    a < 0.53 (y < 0.511): f = erf_core(y) - a, erf_core < 2^-48 relative (y*y rounds,
//    which moves erf's series by < 0.1u): y moves by < 2^-48 erf(y) / (y erf'(y)) <= 1.19 *
//    2^-48 relative (erf(y)/(y erf'(y)) grows from 1 at 0 to 1.19 at 0.511).
//    a >= 0.53 (y >= 0.51 > 0.5, inside erfc_large's range): near 1, erf(y) - a cancels,
//    so f = c - erfc(y) with c = 1 - a (exact, Sterbenz) and erfc(y) = erfc_large(y, y*y):
//    < 2^-48.5, plus y*y's rounding, which multiplies exp(-y^2) by 1 + y^2 u at most.
//    These move y by their relative size times erfc(y) / (y |erfc'(y)|) =
//    sqrt(pi)/2 erfcx(y)/y <= 1.06 (at y = 0.51, decreasing), and y^2 u of it by
//    < (sqrt(pi)/2) y erfcx(y) u < u/2 (y erfcx(y) < 1/sqrt(pi)): < 1.06 * 2^-48.5 + u/2.
//    The correction itself is below 2^-22 y, so its own roundings (a few u of it) and
//    erf'(y)'s error count 2^-22 times; the final subtraction rounds once more (u).
// Total: relative error < 2^-47.5. erfinv(+-1) = +-inf, |x| > 1 (and +-inf) NaN,
// erfinv(+-0) = +-0, NaN stays NaN.
// Derivative: erfinv'(x) = sqrt(pi)/2 e^{y^2}, y = erfinv(x). For a < 0.53 from exp_core:
// y's error 2^-47.5 enters e^{y^2} times 2y^2 < 0.53, y*y rounds (< 0.27u of the
// exponent), exp_core, the constant and the product: < 2^-47.5. Near 1, e^{y^2} would
// multiply y's error by 2y^2 (up to 29), so instead e^{y^2} = erfcx(y) / erfc(y) with
// erfc(y) = c = 1 - a exactly: erfcx_large(y) / c, whose sensitivity to y's relative
// error, |y erfcx'(y)/erfcx(y)| = |2y^2 - 2y/(sqrt(pi) erfcx(y))|, is below 1 (0.40 at
// y = 0.51, tending to 1): < 2^-47.5 + 2^-50 + 3u < 2^-47. +inf at +-1, NaN beyond.
CARBON_HD double erfinv_start(double a) {  // 0 <= a < 1
  constexpr double kCentral[9] = {  // P(w - 2.5), w < 5
      0x1.e2cb0ff8247eap-26,  0x1.70966bff10cbdp-22, -0x1.d8e6adf666a10p-19, -0x1.26b5820448e6fp-18,
      0x1.ca65b60594a34p-13,  -0x1.48a8100213441p-10, -0x1.11c9de0453890p-8, 0x1.f91ec6029d022p-3,
      0x1.805c5df9db4dcp+0,
  };
  constexpr double kTail[9] = {  // Q(sqrt(w) - 3), w >= 5
      -0x1.a3e135f3c6ebep-13, 0x1.a76ad6167e931p-14, 0x1.61b8e40100b9fp-10, -0x1.e17bce072a85dp-9,
      0x1.7824f5fed8615p-8,   -0x1.f38badff9f607p-8, 0x1.354afbfd6b130p-7,  0x1.006db610f3984p+0,
      0x1.6a9efc041cf02p+1,
  };
  const double w = -log_core(fma(-a, a, 1.0));
  const double p = w < 5.0 ? horner(kCentral, w - 2.5) : horner(kTail, sqrt(w) - 3.0);
  return p * a;
}
constexpr double kErfinvSplit = 0.53;  // erfinv(0.53) = 0.5109: erfc_large's range starts at 0.5
CARBON_HD double erfinv_core(double x) {
  const double a = abs_value(x);
  if (!(a < 1.0)) return a == 1.0 ? with_sign_of(bits_to_double(kExpMask), x) : quiet_nan();  // NaN, |x| > 1
  if (a == 0.0) return x;                                                                    // keeps the sign of zero
  const double y = erfinv_start(a);
  const double e = erf_grad_core(y);
  double r;
  if (a < kErfinvSplit) {
    const double f = erf_core(y) - a;
    r = y - f / fma(y, f, e);
  } else {
    const double f = (1.0 - a) - erfc_large(y, y * y);  // = erf(y) - a, without the cancellation
    r = y - f / fma(y, f, e);
  }
  return with_sign_of(r, x);
}
CARBON_HD double erfinv_grad_core(double x) {
  constexpr double kSqrtPiOver2 = 0x1.c5bf891b4ef6ap-1;  // RN(sqrt(pi)/2)
  const double a = abs_value(x);
  if (!(a <= 1.0)) return quiet_nan();  // NaN, |x| > 1
  const double y = erfinv_core(a);
  if (a < kErfinvSplit) return kSqrtPiOver2 * exp_core(y * y);
  return kSqrtPiOver2 * (erfcx_large(y) / (1.0 - a));  // a = 1: y = inf, erfcx held finite, / 0: +inf
}

// ---- asinh, acosh, atanh ----------------------------------------------------------
// All three as log1p of a non-negative argument t, where log1p (< 2^-49.8) has sensitivity
// t / ((1 + t) log1p(t)) <= 1 to t's relative error: the total is log1p's bound plus t's.
//  * asinh a (odd, a = |x|) = log1p(a + a^2 / (1 + sqrt(1 + a^2))) (= log(a + sqrt(1 + a^2))
//    without its cancellation for small a): a^2 exact (float a), 1 + a^2 rounds (u), sqrt
//    halves that and rounds (1.5u), 1 + sqrt (sensitivity < 1, u: 2.5u), the division (3.5u),
//    the sum of two positive terms (4.5u): < 2^-49.8 + 4.5u < 2^-49.2. a^2 <= 1.2e77 does not
//    overflow. asinh(+-inf) = +-inf, asinh(+-0) = +-0, NaN stays NaN.
//  * acosh x (x >= 1) = log1p(d + sqrt(d (x + 1))), d = x - 1 (d (x + 1) = x^2 - 1 without its
//    cancellation near 1): d and x + 1 (exact below 2^53; otherwise one rounding each), the
//    product and the square root: < 2.5u, the positive sum < 3.5u: < 2^-49.3. acosh(1) = +0,
//    acosh(+inf) = +inf, x < 1 (and -inf) NaN.
//  * atanh a (odd, a = |x|) = log1p(2a / (1 - a)) / 2: 1 - a and the division round (2u):
//    < 2^-49.8 + 2u < 2^-49.3. atanh(+-1) = +-inf (2a / 0 = inf), |x| > 1: 1 + t < 0, NaN;
//    atanh(+-0) = +-0.
// Near 0 asinh x and atanh x are x -+ x^3/... : never a rounding midpoint (x is a float),
// and the bound keeps the result on x's side of it.
// Derivatives: asinh' = 1/sqrt(1 + x^2) (fma, sqrt, division: < 2.5u; 0 at +-inf);
// acosh' = 1/sqrt((x - 1)(x + 1)) (< 3.5u; +inf at 1, NaN below 1); atanh' = 1/(1 - x^2)
// (one fma: 1 - x^2 rounds once, no cancellation; < 2u; +inf at +-1, NaN beyond).
CARBON_HD double asinh_core(double x) {
  if (!is_finite(x)) return x;  // NaN, +-inf
  const double a = abs_value(x);
  const double z = a * a;  // exact for float arguments
  return with_sign_of(log1p_core(a + z / (1.0 + sqrt(1.0 + z))), x);
}
CARBON_HD double acosh_core(double x) {
  if (x < 1.0) return quiet_nan();  // NaN passes through below
  const double d = x - 1.0;
  return log1p_core(d + sqrt(d * (x + 1.0)));
}
CARBON_HD double atanh_core(double x) {
  const double a = abs_value(x);
  return with_sign_of(0.5 * log1p_core((2.0 * a) / (1.0 - a)), x);
}
CARBON_HD double asinh_grad_core(double x) { return 1.0 / sqrt(fma(x, x, 1.0)); }
CARBON_HD double acosh_grad_core(double x) {
  if (x < 1.0) return quiet_nan();
  return 1.0 / sqrt((x - 1.0) * (x + 1.0));
}
CARBON_HD double atanh_grad_core(double x) {
  if (abs_value(x) > 1.0) return quiet_nan();
  return 1.0 / fma(-x, x, 1.0);
}

}  // namespace math
}  // namespace carbon
