// Exact widenings of 8 consecutive elements (float32, bfloat16, float16 or
// double) to a vector of 8 doubles on AVX-512: element_value of each, for
// the CPU kernels' explicit 8-lane loops (carbon.sum's rows and columns,
// the indexed accumulations). The hardware conversions are exact in the
// default MXCSR state (no denormals-are-zero), in which every op runs
// (fp_env.h); bfloat16 is the top half of a float32. Written with intrinsics because
// GCC widened bfloat16 element by element (and split 8-lane forms in two
// for AVX2).
//
// Functions in an unnamed namespace: each file that includes this header
// compiles its own (AVX-512 code, inlined into the callers' AVX-512 loops).
#pragma once

#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#define CARBON_WIDEN_V4 __attribute__((target("arch=x86-64-v4")))

namespace carbon {
namespace {

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

CARBON_WIDEN_V4 inline __m512d widen8(const double* p) { return _mm512_loadu_pd(p); }
CARBON_WIDEN_V4 inline __m512d widen8(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
CARBON_WIDEN_V4 inline __m512d widen8(const c10::BFloat16* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
}
CARBON_WIDEN_V4 inline __m512d widen8(const c10::Half* p) {
  return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The lanes of `mask` among 8 consecutive elements, +0 in the others
// (masked loads: nothing outside the mask is read, so a row's tail never
// reads past its end).
CARBON_WIDEN_V4 inline __m512d widen8(const double* p, __mmask8 mask) { return _mm512_maskz_loadu_pd(mask, p); }
CARBON_WIDEN_V4 inline __m512d widen8(const float* p, __mmask8 mask) {
  return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, p));
}
CARBON_WIDEN_V4 inline __m512d widen8(const c10::BFloat16* p, __mmask8 mask) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(mask, p));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
}
CARBON_WIDEN_V4 inline __m512d widen8(const c10::Half* p, __mmask8 mask) {
  return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(mask, p)));
}

#pragma GCC diagnostic pop

}  // namespace
}  // namespace carbon
