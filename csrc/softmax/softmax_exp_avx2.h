// The float32 EXP of the CPU softmax kernels on AVX2 + FMA CPUs without
// AVX-512 (softmax_cpu.cpp only): exp_f32_approx (softmax_exp_cpu.h) four
// lanes at a time, written out with intrinsics, and a lighter form of its
// rounding test that runs in registers (exp_group8_tested). No torch headers:
// scripts/softmax_exp_check.cpp includes this file.
//
// Why not leave it to the compiler: the x86-64-v3 clone of exp_row_f32 is
// vectorized, but GCC schedules the degree-8 Horner chain of two vectors at a
// time and spills between the evaluation and the rounding loop; two vectors
// per group of eight values, with the rounding and the stores in the same
// pass, measured ~2.5x faster per value on a Zen 3 (a standalone loop of
// 16384 values, the same bits). Testing in registers as well (no fp64
// scratch written and read again, the row sum in the same pass) took a
// softmax 12288x256 forward from ~2.0x to ~1.7x torch's time (2026-12-03).
//
// The same bits: exp4_approx performs exp_f32_approx's IEEE operations in the
// same order on each lane -- the clamp to [-110, 89] keeping a NaN (vmaxpd /
// vminpd return their second operand when either is a NaN, and x itself
// where it is not beyond the bound), the shifter's fma, the subtraction, the
// reduction's fma, the nine-coefficient Horner chain of fmas, the exponent
// built from the shifter's low bits and the final multiplication -- so each
// lane's double is exp_f32_approx's, and everything after (RN32 by the
// hardware conversion as round32_decided, the rounding test
// exp_f32_approx_decided, exp32 for the undecided) is unchanged. Hence
// scripts/softmax_exp_check.py's exhaustive check of exp_f32_approx covers
// these lanes too; it also runs exp_group8_tested on every float32 argument.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "../cpu_features.h"
#include "softmax_exp_cpu.h"

namespace carbon {

#define CARBON_SOFTMAX_AVX2 __attribute__((target("avx2,fma,f16c")))

// exp_f32_approx of four doubles (float32 values or NaN), lane by lane.
// kClampLow / kClampHigh = false leave out a clamp, for callers whose
// arguments are known not to lie beyond that bound, or whose results there
// are discarded (exp_group8_tested): the same doubles elsewhere.
template <bool kClampLow = true, bool kClampHigh = true>
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) __m256d exp4_approx(__m256d x) {
  using namespace exp_approx;
  const __m256d shifter = _mm256_set1_pd(kShifter);
  if (kClampLow) x = _mm256_max_pd(_mm256_set1_pd(kLow), x);    // x < kLow ? kLow : x (NaN: x)
  if (kClampHigh) x = _mm256_min_pd(_mm256_set1_pd(kHigh), x);  // x > kHigh ? kHigh : x (NaN: x)
  const __m256d shifted = _mm256_fmadd_pd(x, _mm256_set1_pd(kLog2e), shifter);
  const __m256d kd = _mm256_sub_pd(shifted, shifter);
  const __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(-kLn2), x);
  __m256d p = _mm256_set1_pd(kPoly[0]);
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[1]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[2]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[3]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[4]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[5]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[6]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[7]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kPoly[8]));
  static_assert(sizeof(kPoly) / sizeof(kPoly[0]) == 9, "the Horner chain above has nine coefficients");
  // 2^k: (bits(shifted) + 1023) << 52, as in exp_f32_approx.
  const __m256i scale =
      _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(shifted), _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(scale));
}

// A cheaper sufficient condition for exp_f32_approx_decided, tested in
// registers while the values are computed (exp_group8_tested), so that the
// doubles need not be stored and read again: a lane passes when
//  * its c has its 29 dropped bits more than kApproxMargin from the midpoint
//    2^28 (exp_f32_approx_decided's "far", the same integer test), and
//  * its argument d is in [-87, 88] (then c and exp_f32_core(d) are within
//    2^-39.6 of e^d in [2^-125.6, 2^127], so RN32(c) is a normal float32:
//    the rest of exp_f32_approx_decided's condition), or d <= -110 or -inf
//    (the clamp gives c = exp_f32_approx(-110) = 0x1.3bf2cf67233f6p-159 <=
//    2^-151, decided as a zero, and "far": its dropped bits lie 2^26.7 from
//    the midpoint).
// Every passing lane is decided by exp_f32_approx_decided, so its float32
// round32_decided(c) is RN32(exp_f32_core(d)) by scripts/softmax_exp_check.py's
// exhaustive check, which also runs this test on every float32 d (no lane
// passes that exp_f32_approx_decided leaves undecided). A failing lane (d in (-110, -87), above 88 or NaN, or c
// near a midpoint) only sends its block to the full test (softmax_cpu.cpp).
constexpr float kLightLow = -87.0f, kLightHigh = 88.0f, kLightClamp = -110.0f;

// The lanes of c whose dropped bits are within kApproxMargin of the midpoint
// (all ones), i.e. not exp_f32_approx_decided's "far": (bits(c) - (2^28 -
// kApproxMargin)) mod 2^29 <= 2 kApproxMargin (a signed compare suffices:
// both sides are below 2^29).
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) __m256i exp4_near_midpoint(__m256d c) {
  constexpr uint64_t kHalf = uint64_t{1} << 28;
  const __m256i u = _mm256_and_si256(_mm256_sub_epi64(_mm256_castpd_si256(c), _mm256_set1_epi64x(kHalf - kApproxMargin)),
                                     _mm256_set1_epi64x((uint64_t{1} << 29) - 1));
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(2 * kApproxMargin + 1), u);
}

// Eight values of exp_approx_groups8 without the doubles: for the float32
// arguments d (RN32(x_k - m)), e[k] = round32_decided(exp_f32_approx(d_k)),
// with r0 / r1 the float32 results of lanes 0-3 / 4-7 (for callers that sum
// them); ORs into `near` the lanes exp4_near_midpoint flags and, with kRange,
// into `outside` the lanes whose d is neither in [-87, 88] nor <= -110 (NaN
// included: the unordered predicates). Without kRange the caller knows that
// every d is in [-87, 88].
template <bool kRange>
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) void exp_group8_tested(__m256 d, float* e, __m256i* near,
                                                                                 __m256* outside, __m128* r0,
                                                                                 __m128* r1) {
  if (kRange) {
    const __m256 below = _mm256_and_ps(_mm256_cmp_ps(d, _mm256_set1_ps(kLightLow), _CMP_NGE_UQ),
                                       _mm256_cmp_ps(d, _mm256_set1_ps(kLightClamp), _CMP_NLE_UQ));
    *outside = _mm256_or_ps(*outside, _mm256_or_ps(below, _mm256_cmp_ps(d, _mm256_set1_ps(kLightHigh), _CMP_GT_OQ)));
  }
  // The lanes the result depends on have d in [-87, 88] or d <= -110: only
  // the latter need a clamp, and only with kRange.
  const __m256d c0 = exp4_approx<kRange, false>(_mm256_cvtps_pd(_mm256_castps256_ps128(d)));
  const __m256d c1 = exp4_approx<kRange, false>(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)));
  *r0 = _mm256_cvtpd_ps(c0);
  *r1 = _mm256_cvtpd_ps(c1);
  _mm256_storeu_ps(e, _mm256_set_m128(*r1, *r0));
  *near = _mm256_or_si256(*near, _mm256_or_si256(exp4_near_midpoint(c0), exp4_near_midpoint(c1)));
}

// True when all eight d are <= -110 (or -inf: softmax's masked entries);
// then every e_k is +0 (RN32 of exp_f32_approx(-110) <= 2^-151) and every
// lane passes the light test, so a caller may store zeros instead of calling
// exp_group8_tested (the same bits, and + (+0) changes no sum of values >= +0).
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) bool exp_group8_all_clamped(__m256 d) {
  return _mm256_movemask_ps(_mm256_cmp_ps(d, _mm256_set1_ps(kLightClamp), _CMP_LE_OQ)) == 0xff;
}

// True where the CPU runs the AVX2 exp (and no AVX-512 one); the portable
// switch CARBON_SOFTMAX_PORTABLE selects exp_row_f32's compiled loop instead.
inline bool softmax_avx2_available() {
  static const bool yes = cpu::avx2() && std::getenv("CARBON_SOFTMAX_PORTABLE") == nullptr;
  return yes;
}

}  // namespace carbon
