// Round to nearest-even of doubles into bfloat16 and float16 on AVX2 + F16C
// CPUs, which have no conversion with an embedded rounding mode (AVX-512's
// vcvtpd2ps {rz} + vcvtneps2bf16): eight doubles (lanes 0-3 and 4-7) to eight
// 16-bit encodings, the lanes this path cannot take OR-ed into a mask for the
// caller's general rounding (round_double + encode). Shared by the AVX2 loops
// of the norm and softmax kernels; the arguments for each step are here. The
// float32 conversions are IEEE round-to-nearest-even in the default MXCSR
// state in which every op runs (fp_env.h).
//
// Functions in an unnamed namespace: each file that includes this header
// compiles its own (inlined into the callers' AVX2 loops).
#pragma once

#include <immintrin.h>

#include <cstdint>

#define CARBON_ROUND16_AVX2 inline __attribute__((target("avx2,fma,f16c"), always_inline))

namespace carbon {
namespace {

// Round to odd into float32 of 4 doubles, for bfloat16 / float16 outputs
// (see round_to_odd32: the result rounded to nearest-even in either format
// is RN of the double). Without a truncating conversion: z = RN32(y) by the
// hardware; y is exact in float32 iff widening z gives y back, and then z is
// the answer; otherwise the truncation is z when RN32 rounded toward zero
// and the float32 next to z toward zero (its bits minus one: same sign,
// magnitudes are ordered as their bits) when it rounded away, and round to
// odd sets its last bit. This is exact on the whole range, float32
// subnormals included (z and the test are IEEE there); above float32's
// range z = +-inf rounded away, so the result is the largest finite value
// (odd), which rounds to infinity in both formats as RN does; +-inf stay
// themselves. NaN lanes give garbage and are flagged by the callers.
// Returns 4 float32 bit patterns.
CARBON_ROUND16_AVX2 __m128i round_to_odd32_avx2(__m256d y) {
  const __m128 z = _mm256_cvtpd_ps(y);
  const __m256d back = _mm256_cvtps_pd(z);
  const __m256d inexact = _mm256_cmp_pd(back, y, _CMP_NEQ_OQ);
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d away = _mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, y), _CMP_GT_OQ);
  // The 64-bit masks narrowed to 32 bits (each lane all ones or all zeros).
  const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m128i inexact32 =
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), idx));
  const __m128i away32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), idx));
  const __m128i t = _mm_add_epi32(_mm_castps_si128(z), away32);  // minus one where rounded away
  return _mm_or_si128(t, _mm_and_si128(inexact32, _mm_set1_epi32(1)));
}

// RN of 4 doubles to 8 significant bits (bfloat16's precision), ties to
// even, by Veltkamp's splitting with C = 2^45 + 1 (three IEEE double ops,
// no conversion with its own rounding mode needed): g = y (x) C,
// hi = g (-) (g (-) y). Why it is RNE: take y > 0 scaled to [1, 2)
// (powers of two commute with every step while nothing under- or
// overflows), y = Y 2^-52 with Y an integer. Unless y is within 2^-44 of 2,
// y C = Y 2^-7 + y lies in [2^45, 2^46), where doubles are the multiples
// of 2^-7 and Y 2^-7 is one, so g = Y 2^-7 + k 2^-7 with k 2^-7 the
// nearest multiple of 2^-7 to y -- on a tie the one making Y + k even.
// A tie means y = (2j + 1) 2^-8, so Y = (2j + 1) 2^44 is even and k is
// even: RNE. Then g - y = Y 2^-7 - e with e = y - k 2^-7, |e| <= 2^-8,
// half a unit of Y 2^-7, so g (-) y = Y 2^-7 (when |e| = 2^-8 the tie goes
// to Y, even), and hi = g (-) Y 2^-7 = k 2^-7 exactly. Within 2^-44 of 2
// RNE gives 2; the steps give 2 there too (checked exhaustively for the
// 2^22 doubles below 2, at several exponents). For
// y = +-0 every step keeps the zero and its sign (g (-) y = +0, g (-) +0 =
// g). Callers pass values of magnitude 0 or above 2^-300 (sums, products
// and differences of float32 and 16-bit values: the norm outputs, the
// softmax family's outputs and gradients), far from double underflow; an overflowing
// y C (|y| > 2^978) or an infinite or NaN y gives NaN, which the caller
// flags. Relies on -ffp-contract=off (no fused y C - y). Also checked
// against an exact scalar rounding on 10^8 random and 8 10^7 structured
// doubles (every 8-bit head with tie, near-tie and sticky tails at 16
// exponents, 2^-126 and overflow edges, double subnormals).
CARBON_ROUND16_AVX2 __m256d round_to_8_bits(__m256d y) {
  const __m256d g = _mm256_mul_pd(y, _mm256_set1_pd(0x1p45 + 1.0));
  return _mm256_sub_pd(g, _mm256_sub_pd(g, y));
}

// bfloat16: round_to_8_bits, then the hardware float32 conversion, exact
// for a value of 8 bits in float32's normal range, and the top half of the
// float32 bits is the bfloat16 encoding (bits below 16 are zero). That is
// RN_bf16 of y when the float32 is a normal number, +-0 (then |y| is below
// 2^-142, under half of bfloat16's smallest subnormal, and the zero keeps
// y's sign), or +-inf (the conversion of an 8-bit value >= 2^128; RN
// overflows exactly when the 8-bit rounding reaches 2^128, since
// bfloat16's largest finite value is 2^128 - 2^120). Lanes whose float32 is
// subnormal (bfloat16 subnormals have fewer than 8 bits) or NaN are OR-ed
// into *bad as 32-bit lane masks (the callers test all the bits) for the
// general path. This replaced a round-to-odd float32 built from the
// nearest-even conversion and fixed up lane by lane (about half the
// instructions here).
CARBON_ROUND16_AVX2 void round_store_bf16x8(uint16_t* out, __m256d lo, __m256d hi, __m256d* bad) {
  const __m128 flo = _mm256_cvtpd_ps(round_to_8_bits(lo)), fhi = _mm256_cvtpd_ps(round_to_8_bits(hi));
  const __m256i f = _mm256_castps_si256(_mm256_set_m128(fhi, flo));
  const __m256i mag = _mm256_and_si256(f, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
  // 0 < mag < 2^23 (subnormal): mag + (2^31 - 1) wraps, as a signed
  // integer, to below INT_MIN + 2^23 - 1 exactly then (0 goes to INT_MAX,
  // normal and larger magnitudes to INT_MIN + 2^23 - 1 or above).
  const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(0x807FFFFFu)),
                                         _mm256_add_epi32(mag, _mm256_set1_epi32(0x7FFFFFFF)));
  *bad = _mm256_or_pd(*bad, _mm256_castsi256_pd(_mm256_or_si256(nan, sub)));
  // The high 16 bits of each float32, gathered into the low 8 bytes of each
  // 128-bit half, then the two halves' low quadwords side by side.
  const __m256i take = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(f, take), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(r));
}

// float16: the F16C conversion of the round-to-odd float32, to nearest-even
// (float16 subnormals included; a float32-subnormal or zero input is below
// half float16's smallest subnormal and gives a zero of its sign either way).
// NaN lanes are OR-ed into *bad (64-bit masks).
CARBON_ROUND16_AVX2 void round_store_f16x8(uint16_t* out, __m256d lo, __m256d hi, __m256d* bad) {
  const __m256i u = _mm256_set_m128i(round_to_odd32_avx2(hi), round_to_odd32_avx2(lo));
  const __m256d nan = _mm256_or_pd(_mm256_cmp_pd(lo, lo, _CMP_UNORD_Q), _mm256_cmp_pd(hi, hi, _CMP_UNORD_Q));
  *bad = _mm256_or_pd(*bad, nan);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace
}  // namespace carbon
