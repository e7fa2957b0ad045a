// The float32 EXP of the CPU softmax kernels on AVX-512 (softmax_cpu.cpp
// only): sixteen values at a time, the same float32 bits as carbon.exp,
// RN32(exp_f32_core(d)) (elementwise_math.h, docs/contract.md §6), for every
// float32 d, from a table-driven fp64 evaluation plus a rounding test, as
// softmax_exp_cpu.h does with its degree-8 polynomial (whose argument this
// file follows; that header stays the path of CPUs without AVX-512).
//
// exp16_table(d) = 2^k T_j p(r), for d clamped to [-110, 89] as in
// exp_f32_approx:
//   N = round(d 16/ln2) by the shifter's fma (N = 16k + j, 0 <= j < 16),
//   r = d - N C in ONE fma, C = RN64(ln2/16) (|r| <= ln2/32 + 2^-40),
//   T_j = RN64(2^(j/16)) from a 16-entry table (one two-register permute,
//   vpermt2pd, which reads the low 4 bits of the shifter's bits: j),
//   2^k T_j by adding k to T_j's exponent field (k = N >> 4 in [-159, 128],
//   so 2^k T_j is a normal double), and
//   p(r) = 1 + r q(r), q of degree 4 fitted to (e^r - 1)/r on
//   [-0.0217, 0.0217] (Chebyshev interpolation, mpmath, coefficients rounded
//   to double): 5 fmas, against 9 for the degree-8 polynomial on the
//   16x wider interval of exp_f32_approx. With the shifter's and the
//   reduction's fmas and the final multiplication, 8 operations on the fma
//   pipes per 8 values instead of 11.
// Relative error against e^d, for d in [-110, 89]:
//   polynomial   |p(r)/e^r - 1| < 2^-46.6 (dense grid, 50-digit arithmetic)
//   reduction    |N| <= 2541: |N (ln2/16 - C)| < 2^-47.9, plus ulp(r)/2 <= 2^-59
//   table        2^-53; evaluation (Horner with fma, |r| < 2^-5.5, then one
//                multiplication) < 2^-51.5
// so < 2^-45.8 against e^d; exp_f32_core is within 2^-49.5 of e^d, so the two
// doubles differ by less than 2^-45.7 of either (the exhaustive run of
// scripts/softmax_exp_check.py measures the actual maximum).
//
// The rounding test is exp_f32_approx_decided's argument with the margin
// kTableMargin = 2^9: for c = exp8_table(d) in [2^e, 2^(e+1)),
// |c - exp_f32_core(d)| < 2^-45.7 * 2^(e+1) = 2^7.3 of c's double ulps, less
// than the margin; so when c's 29 dropped bits lie at least 2^9 from the
// midpoint 2^28 (exp8_table_far) and both doubles are normal with a normal
// float32 rounding (tested on the argument: d in [-87, 88]), no float32
// rounding boundary lies between them; d <= -105 gives c <= 2^-151 and +0
// as before. 1,017 float32 arguments in [-87, 88] (about 2^-21 of them) are
// undecided (exp32 for those; likewise for results in float32's subnormal
// range, overflow and NaN).
//
// scripts/softmax_exp_check.py runs exp16_table_round over all 2^32 float32
// patterns (with and without FTZ/DAZ): every decided lane's float32 bits
// equal RN32(exp_f32_core(d)); and the kNonPositive variant's bits and
// decisions equal the general one's for every d <= 0 and NaN.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "../cpu_features.h"
#include "../exact/float_format.h"

namespace carbon {

#define CARBON_SOFTMAX_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))

// True where the CPU runs the AVX-512 kernels (checked once). The
// environment variable CARBON_SOFTMAX_PORTABLE selects the portable kernels
// instead (to compare the two paths' bits on one machine).
inline bool softmax_avx512_available() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                          std::getenv("CARBON_SOFTMAX_PORTABLE") == nullptr && cpu::avx512_allowed();
  return yes;
}

constexpr uint64_t kTableMargin = uint64_t{1} << 9;

// The bits of RN64(2^(j/16)) minus j << 48, j = 0..15 (see exp8_table).
constexpr uint64_t kExp2SixteenthsAdjusted[16] = {
    0x3ff0000000000000 - (uint64_t{0} << 48),  0x3ff0b5586cf9890f - (uint64_t{1} << 48),
    0x3ff172b83c7d517b - (uint64_t{2} << 48),  0x3ff2387a6e756238 - (uint64_t{3} << 48),
    0x3ff306fe0a31b715 - (uint64_t{4} << 48),  0x3ff3dea64c123422 - (uint64_t{5} << 48),
    0x3ff4bfdad5362a27 - (uint64_t{6} << 48),  0x3ff5ab07dd485429 - (uint64_t{7} << 48),
    0x3ff6a09e667f3bcd - (uint64_t{8} << 48),  0x3ff7a11473eb0187 - (uint64_t{9} << 48),
    0x3ff8ace5422aa0db - (uint64_t{10} << 48), 0x3ff9c49182a3f090 - (uint64_t{11} << 48),
    0x3ffae89f995ad3ad - (uint64_t{12} << 48), 0x3ffc199bdd85529c - (uint64_t{13} << 48),
    0x3ffd5818dcfba487 - (uint64_t{14} << 48), 0x3ffea4afa2a490da - (uint64_t{15} << 48),
};

// exp(x) of eight doubles x in [-110, 89] (or NaN) within 2^-45.8 (above).
// The shifter 1.5*2^48 rounds x log2e to a multiple of 1/16, N/16 (the
// same N as round(x 16/ln2): scaling by 16 is exact), so its bits are those
// of 1.5*2^48 plus N (two's complement; the constant's low 44 bits are zero):
// the low 4 bits are j (the permute's index), and bits << 48 is
// N << 48 = (k << 52) + (j << 48) modulo 2^64 (|N| < 2^15), which added to
// the table's RN64(2^(j/16)) - (j << 48) gives 2^k RN64(2^(j/16)) in one
// integer addition. (N/16) RN64(ln2) = N RN64(ln2/16) exactly.
CARBON_SOFTMAX_AVX512 inline __m512d exp8_table(__m512d x) {
  const __m512d shifter = _mm512_set1_pd(0x1.8p48);
  const __m512d shifted = _mm512_fmadd_pd(x, _mm512_set1_pd(0x1.71547652b82fep+0), shifter);  // 1.5*2^48 + N/16
  const __m512d nd = _mm512_sub_pd(shifted, shifter);
  const __m512d r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(0x1.62e42fefa39efp-1), x);  // RN(x - N C)
  __m512d q = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.11120bde79b84p-7), _mm512_set1_pd(0x1.55570c3d02399p-5));
  q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.55555554dc660p-3));
  q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.fffffffe58ba1p-2));
  q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(1.0));
  const __m512d p = _mm512_fmadd_pd(q, r, _mm512_set1_pd(1.0));
  const __m512i n = _mm512_castpd_si512(shifted);
  const __m512i table = _mm512_permutex2var_epi64(
      _mm512_loadu_si512(kExp2SixteenthsAdjusted), n, _mm512_loadu_si512(kExp2SixteenthsAdjusted + 8));
  const __m512i scale = _mm512_add_epi64(table, _mm512_slli_epi64(n, 48));
  return _mm512_mul_pd(p, _mm512_castsi512_pd(scale));
}

// The lanes of `normal` whose c (>= 2^-126, < 2^128) has its 29 dropped bits
// at least kTableMargin from the midpoint 2^28: bits 28..10 of
// bits(c) - (2^28 - kTableMargin) are not all zero (kTableMargin = 2^9).
CARBON_SOFTMAX_AVX512 inline __mmask8 exp8_table_far(__m512d c, __mmask8 normal) {
  static_assert(kTableMargin == 512, "the bit test below assumes the margin 2^9");
  constexpr uint64_t kHalf = uint64_t{1} << 28;  // half a float32 ulp, in c's double ulps
  const __m512i u = _mm512_sub_epi64(_mm512_castpd_si512(c), _mm512_set1_epi64(kHalf - kTableMargin));
  return _mm512_mask_test_epi64_mask(normal, u, _mm512_set1_epi64(((uint64_t{1} << 29) - 1) & ~uint64_t{1023}));
}

// EXP of sixteen float32 values d: the float32 results by the hardware
// conversion (RN32, the mode every carbon kernel computes in) into e[k] for
// the lanes of `lanes`; returns the lanes whose result is RN32(exp_f32_core
// (d)) for sure (the others' e[k] must be rewritten with exp32):
//  * d in [-87, 88] (so c and exp_f32_core(d) are normal doubles whose RN32
//    is a normal float32: e^-87 > 2^-126, e^88 < 2^127.9) and c's dropped
//    bits far from the midpoint (exp8_table_far);
//  * d <= -105 (also -inf): c <= e^-105 (1 + 2^-45) < 2^-151, RN32 gives +0
//    as RN32(exp_f32_core(d)) < 2^-150 does.
// A NaN is neither. The clamp keeps a NaN (vmaxps and vminps return their
// second operand when either is a NaN).
// (r0, r1: the two halves' float32 results, for callers that sum them.
// kNonPositive: every d is <= 0 or NaN, as the forward's RN32(x_j - m); then
// d <= 88 and min(89, d) = d hold, and the two operations are left out: the
// same results.)
template <bool kNonPositive = false>
CARBON_SOFTMAX_AVX512 inline __mmask16 exp16_table_round(__m512 d, __mmask16 lanes, float* e, __m256* r0,
                                                         __m256* r1) {
  const __mmask16 above = _mm512_cmp_ps_mask(d, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __mmask16 normal =
      kNonPositive ? above : _mm512_mask_cmp_ps_mask(above, d, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
  const __mmask16 tiny = _mm512_cmp_ps_mask(d, _mm512_set1_ps(-105.0f), _CMP_LE_OQ);
  d = _mm512_max_ps(_mm512_set1_ps(-110.0f), d);
  if (!kNonPositive) d = _mm512_min_ps(_mm512_set1_ps(89.0f), d);
  const __m512d c0 = exp8_table(_mm512_cvtps_pd(_mm512_castps512_ps256(d)));
  const __m512d c1 = exp8_table(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1))));
  *r0 = _mm512_cvtpd_ps(c0);
  *r1 = _mm512_cvtpd_ps(c1);
  _mm256_mask_storeu_ps(e, static_cast<__mmask8>(lanes), *r0);
  _mm256_mask_storeu_ps(e + 8, static_cast<__mmask8>(lanes >> 8), *r1);
  const __mmask8 far0 = exp8_table_far(c0, static_cast<__mmask8>(normal));
  const __mmask8 far1 = exp8_table_far(c1, static_cast<__mmask8>(normal >> 8));
  return static_cast<__mmask16>(_mm512_kunpackb(far1, far0) | tiny);
}

CARBON_SOFTMAX_AVX512 inline __mmask16 exp16_table_round(__m512 d, __mmask16 lanes, float* e) {
  __m256 r0, r1;
  return exp16_table_round(d, lanes, e, &r0, &r1);
}

}  // namespace carbon
