// The float32 EXP of the CPU softmax kernels on AVX2 + FMA CPUs without
// AVX-512 (softmax_cpu.cpp only): exp_f32_approx (softmax_exp_cpu.h) four
// lanes at a time, written out with intrinsics.
//
// Why not leave it to the compiler: the x86-64-v3 clone of exp_row_f32 is
// vectorized, but GCC schedules the degree-8 Horner chain of two vectors at a
// time and spills between the evaluation and the rounding loop; this form,
// two vectors per group of eight values, with the rounding and the stores in
// the same pass, measured ~2.5x faster per value on a Zen 3 (a standalone
// loop of 16384 values, the same bits).
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
// these lanes too.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "../cpu_features.h"
#include "../exact/widen_avx2.h"
#include "softmax_exp_cpu.h"

namespace carbon {

#define CARBON_SOFTMAX_AVX2 __attribute__((target("avx2,fma,f16c")))

// exp_f32_approx of four doubles (float32 values or NaN), lane by lane.
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) __m256d exp4_approx(__m256d x) {
  using namespace exp_approx;
  const __m256d shifter = _mm256_set1_pd(kShifter);
  x = _mm256_max_pd(_mm256_set1_pd(kLow), x);   // x < kLow ? kLow : x (NaN: x)
  x = _mm256_min_pd(_mm256_set1_pd(kHigh), x);  // x > kHigh ? kHigh : x (NaN: x)
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

// For k in [0, len), len a multiple of 8: t[k] = exp_f32_approx(RN32(x_k - m))
// and e[k] = round32_decided(t[k]) (the hardware conversion, RN32 in the
// default MXCSR every op runs in).
template <typename T>
CARBON_SOFTMAX_AVX2 inline void exp_approx_groups8(const T* x, float m, int64_t len, double* t, float* e) {
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t k = 0; k < len; k += 8) {
    const __m256 d = _mm256_sub_ps(floats8(x + k), mv);  // RN32(x_k - m)
    const __m256d c0 = exp4_approx(_mm256_cvtps_pd(_mm256_castps256_ps128(d)));
    const __m256d c1 = exp4_approx(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)));
    _mm256_storeu_pd(t + k, c0);
    _mm256_storeu_pd(t + k + 4, c1);
    _mm256_storeu_ps(e + k, _mm256_set_m128(_mm256_cvtpd_ps(c1), _mm256_cvtpd_ps(c0)));
  }
}

// True where the CPU runs the AVX2 exp (and no AVX-512 one); the portable
// switch CARBON_SOFTMAX_PORTABLE selects exp_row_f32's compiled loop instead.
inline bool softmax_avx2_available() {
  static const bool yes = cpu::avx2() && std::getenv("CARBON_SOFTMAX_PORTABLE") == nullptr;
  return yes;
}

}  // namespace carbon
