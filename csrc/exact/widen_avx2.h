// Exact widenings of 8 consecutive elements (float32, bfloat16, float16 or
// double) on AVX2 + F16C CPUs, for the CPU kernels' explicit AVX2 loops: as
// eight float32 values in one register (floats8; not for double), or as
// element_value of each in two registers of four doubles (widen8x2: lanes
// 0-3 and 4-7). The hardware conversions are exact in the default MXCSR
// state (no denormals-are-zero), in which every op runs (fp_env.h);
// bfloat16 is the top half of a float32.
//
// Functions in an unnamed namespace: each file that includes this header
// compiles its own (inlined into the callers' AVX2 loops).
#pragma once

#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#define CARBON_WIDEN_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline))

namespace carbon {
namespace {

struct Doubles8 {
  __m256d lo, hi;  // elements 0-3, 4-7
};

CARBON_WIDEN_AVX2 inline __m256 floats8(const float* p) { return _mm256_loadu_ps(p); }
CARBON_WIDEN_AVX2 inline __m256 floats8(const c10::BFloat16* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
CARBON_WIDEN_AVX2 inline __m256 floats8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 4 consecutive elements as doubles (element_value of each).
CARBON_WIDEN_AVX2 inline __m256d widen4(const double* p) { return _mm256_loadu_pd(p); }
CARBON_WIDEN_AVX2 inline __m256d widen4(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
CARBON_WIDEN_AVX2 inline __m256d widen4(const c10::BFloat16* p) {
  const __m128i h = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h, 16)));
}
CARBON_WIDEN_AVX2 inline __m256d widen4(const c10::Half* p) {
  return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

CARBON_WIDEN_AVX2 inline Doubles8 widen8x2(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
template <typename T>
CARBON_WIDEN_AVX2 inline Doubles8 widen8x2(const T* p) {
  const __m256 f = floats8(p);
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))};
}

}  // namespace
}  // namespace carbon
