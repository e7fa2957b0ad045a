// The Adam / AdamW step for float32 parameters on x86-64 CPUs with AVX-512,
// eight fp64 lanes at a time, rounding into float32 with the hardware
// conversion instead of optim_kernel.h's integer rounding. It computes
// adam_update's fp64 operations in the same order (docs/contract.md §12), so
// it gives the same bits wherever the conversion is the exact RN32 --
// which the caller guarantees by taking this path only when
// fp32_conversion_is_rn32() holds on the calling thread:
//
//  * MXCSR's rounding control is round-to-nearest-even, and neither
//    flush-to-zero nor denormals-are-zero is set. Then vcvtpd2ps is IEEE 754's
//    correctly rounded conversion for every double: normal results, gradual
//    underflow to the subnormals and to a signed zero, overflow to +-inf --
//    RN32 as round_double(x, float32) computes it, for all but NaN; and
//    vcvtps2pd of a float (subnormals included) is exact.
//  * NaN results become float32's one NaN (0x7FC00000), as encode writes
//    them (vfpclassps finds them; the conversion keeps other payloads).
//
// Each element is independent and the loop keeps no partial state, so the
// blocking (eight lanes, a masked tail) plays no role in the bits.
// Measured on the 2-core AVX-512 VM (docs/benchmarks.md): ~1.2 ns per
// element on one thread, against ~2.1 ns for the generic branch-free blocks,
// which spend most of their time in the integer roundings and range checks.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define CARBON_ADAM_AVX512 1
#include <immintrin.h>

#include "optim_kernel.h"

namespace carbon {
namespace adam_avx512 {

#define CARBON_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl")))

// The CPU has the instructions (and the OS saves the zmm state).
inline bool available() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// MXCSR (this thread's SSE/AVX control register): round-to-nearest-even
// (RC bits 13-14 = 0), flush-to-zero (bit 15) and denormals-are-zero
// (bit 6) off. Read per call: the register is per thread and can change.
inline bool fp32_conversion_is_rn32() {
  constexpr unsigned kRoundingControl = 0x6000u, kFlushToZero = 0x8000u, kDenormalsAreZero = 0x0040u;
  return (_mm_getcsr() & (kRoundingControl | kFlushToZero | kDenormalsAreZero)) == 0;
}

// Which of the gradient terms of adam_update apply (fixed per step, so each
// is its own loop without selects): AdamW's decay of p, Adam's L2 term
// (wd != 0), or neither.
enum class Mode { kPlain, kL2, kDecoupled };

struct Constants {
  __m512d sign, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, c2s, eps, step_size;
  __m256 nan;
};

CARBON_AVX512_TARGET inline Constants broadcast(const AdamConstants& c) {
  Constants v;
  v.sign = _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(kSignBit)));
  v.weight_decay = _mm512_set1_pd(c.weight_decay);
  v.decay = _mm512_set1_pd(c.decay);
  v.beta1 = _mm512_set1_pd(c.beta1);
  v.one_minus_beta1 = _mm512_set1_pd(c.one_minus_beta1);
  v.beta2 = _mm512_set1_pd(c.beta2);
  v.one_minus_beta2 = _mm512_set1_pd(c.one_minus_beta2);
  v.c2s = _mm512_set1_pd(c.bias_correction2_sqrt);
  v.eps = _mm512_set1_pd(c.eps);
  v.step_size = _mm512_set1_pd(c.step_size);
  v.nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(state_format().nan_bits)));
  return v;
}

// NaN lanes of x replaced by float32's one NaN (vfpclassps 0x81: quiet or
// signalling NaN).
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m256 canonical_nans(__m256 x, __m256 nan) {
  return _mm256_mask_mov_ps(x, _mm256_fpclass_ps_mask(x, 0x81), nan);
}

// Eight floats (or the lanes of `lanes`, zeros elsewhere; a masked load
// touches no other memory), widened exactly to doubles.
template <bool kFull>
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m512d load8(const float* x, __mmask8 lanes) {
  return _mm512_cvtps_pd(kFull ? _mm256_loadu_ps(x) : _mm256_maskz_loadu_ps(lanes, x));
}

// Elements [0, 8) of p, g, m, v (kFull), or the lanes of `lanes` only (the
// tail). adam_update's operations, one by one; RN32 is the conversion to
// float, and the rounded m' and v' continue as exact doubles.
template <Mode kMode, bool kMaximize, bool kFull>
CARBON_AVX512_TARGET __attribute__((always_inline)) inline void update8(float* p, const float* g, float* m, float* v,
                                                                         __mmask8 lanes, const Constants& c) {
  const __m512d pd = load8<kFull>(p, lanes);
  __m512d gp = load8<kFull>(g, lanes);
  const __m512d md = load8<kFull>(m, lanes);
  const __m512d vd = load8<kFull>(v, lanes);
  if constexpr (kMaximize) gp = _mm512_xor_pd(gp, c.sign);                                  // g' = -g
  if constexpr (kMode == Mode::kL2) gp = _mm512_add_pd(gp, _mm512_mul_pd(c.weight_decay, pd));  // g' + wd p
  __m512d p0 = pd;
  if constexpr (kMode == Mode::kDecoupled) p0 = _mm512_mul_pd(pd, c.decay);
  const __m512d m_sum = _mm512_add_pd(_mm512_mul_pd(c.beta1, md), _mm512_mul_pd(c.one_minus_beta1, gp));
  const __m512d g2 = _mm512_mul_pd(gp, gp);
  const __m512d v_sum = _mm512_add_pd(_mm512_mul_pd(c.beta2, vd), _mm512_mul_pd(c.one_minus_beta2, g2));
  const __m256 m1 = _mm512_cvtpd_ps(m_sum);  // RN32
  const __m256 v1 = _mm512_cvtpd_ps(v_sum);
  const __m512d root = _mm512_sqrt_pd(_mm512_cvtps_pd(v1));
  const __m512d denom = _mm512_add_pd(_mm512_div_pd(root, c.c2s), c.eps);
  const __m512d num = _mm512_mul_pd(c.step_size, _mm512_cvtps_pd(m1));
  const __m256 p1 = _mm512_cvtpd_ps(_mm512_sub_pd(p0, _mm512_div_pd(num, denom)));
  const __m256 out_p = canonical_nans(p1, c.nan), out_m = canonical_nans(m1, c.nan), out_v = canonical_nans(v1, c.nan);
  if constexpr (kFull) {
    _mm256_storeu_ps(p, out_p);
    _mm256_storeu_ps(m, out_m);
    _mm256_storeu_ps(v, out_v);
  } else {
    _mm256_mask_storeu_ps(p, lanes, out_p);
    _mm256_mask_storeu_ps(m, lanes, out_m);
    _mm256_mask_storeu_ps(v, lanes, out_v);
  }
}

template <Mode kMode, bool kMaximize>
CARBON_AVX512_TARGET void step_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamConstants& c) {
  const Constants cv = broadcast(c);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) update8<kMode, kMaximize, true>(p + i, g + i, m + i, v + i, 0xFF, cv);
  if (i < n) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (n - i)) - 1u);
    update8<kMode, kMaximize, false>(p + i, g + i, m + i, v + i, tail, cv);
  }
}

// The step over n elements (in place); only where available() and
// fp32_conversion_is_rn32() hold.
inline void step(float* p, const float* g, float* m, float* v, int64_t n, const AdamConstants& c) {
  const bool maximize = c.grad_sign != 0;
  const Mode mode = c.decoupled_mask ? Mode::kDecoupled : (c.l2_mask ? Mode::kL2 : Mode::kPlain);
  switch (mode) {
    case Mode::kDecoupled:
      return maximize ? step_loop<Mode::kDecoupled, true>(p, g, m, v, n, c)
                      : step_loop<Mode::kDecoupled, false>(p, g, m, v, n, c);
    case Mode::kL2:
      return maximize ? step_loop<Mode::kL2, true>(p, g, m, v, n, c) : step_loop<Mode::kL2, false>(p, g, m, v, n, c);
    case Mode::kPlain:
      return maximize ? step_loop<Mode::kPlain, true>(p, g, m, v, n, c)
                      : step_loop<Mode::kPlain, false>(p, g, m, v, n, c);
  }
}

#undef CARBON_AVX512_TARGET

}  // namespace adam_avx512
}  // namespace carbon
#endif
