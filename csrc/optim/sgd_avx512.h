// The SGD step for float32 parameters on x86-64 CPUs with AVX-512, eight
// fp64 lanes at a time, rounding into float32 with the hardware conversion
// instead of optim_kernel.h's integer rounding (as adam_avx512.h does for
// Adam, whose comment gives the argument in full). It computes sgd_update's
// fp64 operations in the same order (docs/contract.md §12), so it gives the
// same bits wherever the conversion is the exact RN32 -- which holds in
// every Carbon op, since each runs in the default MXCSR state (MXCSR
// round-to-nearest-even, no flush-to-zero, no denormals-are-zero;
// csrc/exact/fp_env.h): then
// vcvtpd2ps is RN32 for every double but NaN (subnormal results, signed
// zeros and overflow to +-inf included) and vcvtps2pd is exact. NaN results
// become float32's one NaN, as encode writes them.
//
// Each element is independent and the loop keeps no partial state, so the
// blocking (eight lanes, a masked tail) plays no role in the bits.
//
// Why: the generic blocks (optim.cpp) spend most of their time in the
// integer roundings and range checks; this loop is bound by memory traffic.
#pragma once

#include "adam_avx512.h"

#ifdef CARBON_ADAM_AVX512
#define CARBON_SGD_AVX512 1

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace carbon {
namespace sgd_avx512 {

#define CARBON_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl")))

using adam_avx512::canonical_nans;
using adam_avx512::load8;
using adam_avx512::store8;

struct Constants {
  __m512d sign, lr, momentum, one_minus_dampening, weight_decay;
  __m256 nan;
};

CARBON_AVX512_TARGET inline Constants broadcast(const SgdConstants& c) {
  Constants v;
  v.sign = _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(c.grad_sign)));
  v.lr = _mm512_set1_pd(c.lr);
  v.momentum = _mm512_set1_pd(c.momentum);
  v.one_minus_dampening = _mm512_set1_pd(c.one_minus_dampening);
  v.weight_decay = _mm512_set1_pd(c.weight_decay);
  v.nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(state_format().nan_bits)));
  return v;
}

// sgd_update's operations, one by one, for elements [0, 8) (kFull) or the
// lanes of `lanes` (the tail). C's flags are compile-time (optim.cpp's
// SgdFlags); kL2 is weight_decay != 0 (sgd_update's select). g' = -g is
// the xor with grad_sign (kSignBit or 0), as flip_sign.
template <typename C, bool kL2, bool kFull>
CARBON_AVX512_TARGET __attribute__((always_inline)) inline void update8(float* p, const float* g, float* b,
                                                                         __mmask8 lanes, const Constants& c) {
  const __m512d pd = load8<kFull>(p, lanes);
  __m512d gp = _mm512_xor_pd(load8<kFull>(g, lanes), c.sign);
  if constexpr (kL2) gp = _mm512_add_pd(gp, _mm512_mul_pd(c.weight_decay, pd));  // g' + wd p
  __m512d d = gp;
  if constexpr (C::has_momentum) {
    __m256 b1;
    if constexpr (C::first_step) {
      b1 = _mm512_cvtpd_ps(gp);  // RN32(g')
    } else {
      const __m512d b_a = _mm512_mul_pd(c.momentum, load8<kFull>(b, lanes));
      const __m512d b_b = _mm512_mul_pd(c.one_minus_dampening, gp);
      b1 = _mm512_cvtpd_ps(_mm512_add_pd(b_a, b_b));  // RN32(mu b + (1 - tau) g')
    }
    const __m512d b1d = _mm512_cvtps_pd(b1);  // exact
    d = C::nesterov ? _mm512_add_pd(gp, _mm512_mul_pd(c.momentum, b1d)) : b1d;
    store8<kFull>(b, lanes, canonical_nans(b1, c.nan));
  }
  const __m256 p1 = _mm512_cvtpd_ps(_mm512_sub_pd(pd, _mm512_mul_pd(c.lr, d)));  // RN32(p - lr d)
  store8<kFull>(p, lanes, canonical_nans(p1, c.nan));
}

template <typename C, bool kL2>
CARBON_AVX512_TARGET void step_loop(float* p, const float* g, float* b, int64_t n, const SgdConstants& c) {
  const Constants cv = broadcast(c);
  const int64_t full = n & ~int64_t{7};
  for (int64_t i = 0; i < full; i += 8) update8<C, kL2, true>(p + i, g + i, b ? b + i : nullptr, 0xFF, cv);
  if (full < n) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (n - full)) - 1u);
    update8<C, kL2, false>(p + full, g + full, b ? b + full : nullptr, tail, cv);
  }
}

// The step over n elements (in place; b is null without momentum); only
// where adam_avx512::available() holds.
template <typename C>
inline void step(float* p, const float* g, float* b, int64_t n, const C& c) {
  if (c.weight_decay != 0.0) return step_loop<C, true>(p, g, b, n, c);
  return step_loop<C, false>(p, g, b, n, c);
}

#undef CARBON_AVX512_TARGET

}  // namespace sgd_avx512
}  // namespace carbon

#pragma GCC diagnostic pop
#endif
