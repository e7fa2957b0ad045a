// The SGD step for float32 parameters on x86-64 CPUs with AVX2 (and FMA,
// F16C) but no AVX-512, four fp64 lanes at a time: a port of sgd_avx512.h.
// It computes sgd_update's fp64 operations in the same order
// (docs/contract.md §12), rounding into float32 with vcvtpd2ps, which is
// RN32 for every double but NaN under the default MXCSR every Carbon op runs
// in (round-to-nearest-even, no flush-to-zero, no denormals-are-zero;
// csrc/exact/fp_env.h), subnormal results, signed zeros and overflow to
// +-inf included; vcvtps2pd is exact. NaN results become float32's one NaN
// (an unordered compare and a blend), as encode writes them.
//
// Each element is independent and the loop keeps no partial state, so the
// blocking (four lanes; a tail of n mod 4 elements run through a small
// zero-padded copy) plays no role in the bits.
#pragma once

#include "adam_avx2.h"

#ifdef CARBON_ADAM_AVX2
#define CARBON_SGD_AVX2 1

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace carbon {
namespace sgd_avx2 {

#define CARBON_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))


struct Constants {
  __m256d sign, lr, momentum, one_minus_dampening, weight_decay;
  __m128 nan;
};

CARBON_AVX2_TARGET inline Constants broadcast(const SgdConstants& c) {
  Constants v;
  v.sign = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(c.grad_sign)));
  v.lr = _mm256_set1_pd(c.lr);
  v.momentum = _mm256_set1_pd(c.momentum);
  v.one_minus_dampening = _mm256_set1_pd(c.one_minus_dampening);
  v.weight_decay = _mm256_set1_pd(c.weight_decay);
  v.nan = _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(state_format().nan_bits)));
  return v;
}

// NaN lanes of x replaced by float32's one NaN.
CARBON_AVX2_TARGET __attribute__((always_inline)) inline __m128 canonical_nans(__m128 x, __m128 nan) {
  return _mm_blendv_ps(x, nan, _mm_cmpunord_ps(x, x));
}

// sgd_update's operations, one by one, for elements [0, 4). C's flags are
// compile-time (optim.cpp's SgdFlags); kL2 is weight_decay != 0
// (sgd_update's select). g' = -g is the xor with grad_sign (kSignBit or 0),
// as flip_sign.
template <typename C, bool kL2>
CARBON_AVX2_TARGET __attribute__((always_inline)) inline void update4(float* p, const float* g, float* b,
                                                                      const Constants& c) {
  const __m256d pd = widen4(p);
  __m256d gp = _mm256_xor_pd(widen4(g), c.sign);
  if constexpr (kL2) gp = _mm256_add_pd(gp, _mm256_mul_pd(c.weight_decay, pd));  // g' + wd p
  __m256d d = gp;
  if constexpr (C::has_momentum) {
    __m128 b1;
    if constexpr (C::first_step) {
      b1 = _mm256_cvtpd_ps(gp);  // RN32(g')
    } else {
      const __m256d b_a = _mm256_mul_pd(c.momentum, widen4(b));
      const __m256d b_b = _mm256_mul_pd(c.one_minus_dampening, gp);
      b1 = _mm256_cvtpd_ps(_mm256_add_pd(b_a, b_b));  // RN32(mu b + (1 - tau) g')
    }
    const __m256d b1d = _mm256_cvtps_pd(b1);  // exact
    d = C::nesterov ? _mm256_add_pd(gp, _mm256_mul_pd(c.momentum, b1d)) : b1d;
    _mm_storeu_ps(b, canonical_nans(b1, c.nan));
  }
  const __m128 p1 = _mm256_cvtpd_ps(_mm256_sub_pd(pd, _mm256_mul_pd(c.lr, d)));  // RN32(p - lr d)
  _mm_storeu_ps(p, canonical_nans(p1, c.nan));
}

template <typename C, bool kL2>
CARBON_AVX2_TARGET void step_loop(float* p, const float* g, float* b, int64_t n, const SgdConstants& c) {
  const Constants cv = broadcast(c);
  const int64_t full = n & ~int64_t{3};
  for (int64_t i = 0; i < full; i += 4) update4<C, kL2>(p + i, g + i, b ? b + i : nullptr, cv);
  if (full < n) {
    // The last n - full < 4 elements through zero-padded copies.
    const int64_t k = n - full;
    float pb[4] = {}, gb[4] = {}, bb[4] = {};
    std::memcpy(pb, p + full, k * sizeof(float));
    std::memcpy(gb, g + full, k * sizeof(float));
    if (b) std::memcpy(bb, b + full, k * sizeof(float));
    update4<C, kL2>(pb, gb, bb, cv);
    std::memcpy(p + full, pb, k * sizeof(float));
    if (b) std::memcpy(b + full, bb, k * sizeof(float));
  }
}

// The step over n elements (in place; b is null without momentum); only
// where cpu::avx2() holds.
template <typename C>
inline void step(float* p, const float* g, float* b, int64_t n, const C& c) {
  if (c.weight_decay != 0.0) return step_loop<C, true>(p, g, b, n, c);
  return step_loop<C, false>(p, g, b, n, c);
}

#undef CARBON_AVX2_TARGET

}  // namespace sgd_avx2
}  // namespace carbon

#pragma GCC diagnostic pop
#endif
