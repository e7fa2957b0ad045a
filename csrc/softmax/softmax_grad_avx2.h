// The CPU gradients of softmax, log_softmax and cross-entropy on AVX2 + FMA
// CPUs without AVX-512 (softmax_cpu.cpp only): the row sums D / G in one
// pass, and the float32 outputs with one vector test per row.
//
// Sums: D = RN32(sum g_k y_k) (softmax) and G = RN32(sum g_k) (log_softmax)
// are decided from the fp64 sum and absolute sum by grad_sum_if_decided with
// the tree's depth, or taken from the exact tiers; their bits do not depend on
// the tree, so these eight lanes (two registers of four, the sum and the
// absolute sum in the same pass; the portable loop takes two passes of 32
// chains) give the portable loop's D and G.
//
// Outputs: each output is RN32 of an fp64 value computed by the same IEEE
// operations as softmax_kernel.h's *_unrounded functions, rounded by the
// hardware conversion vcvtpd2ps, which is RN32 for every double but NaN in
// the default MXCSR state every CPU kernel runs in (fp_env.h: no flush to
// zero, round to nearest): so subnormal outputs need no test here, unlike the
// portable loops' round_row_out, which does not assume that state. A row with
// a NaN output returns false (its outputs are rewritten by the general
// rounding, which gives the canonical NaN): one unordered compare per eight
// outputs.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../dtypes.h"
#include "../exact/widen_avx2.h"
#include "softmax_exp_avx2.h"
#include "softmax_kernel.h"

namespace carbon {

// The fp64 sum and absolute sum of the terms g_k y_k (softmax; exact in fp64)
// or g_k (log_softmax) of a row, in eight lanes (at most n / 8 additions
// each), then lo + hi and a 4-lane reduction (3 more), the last n mod 8 terms
// in a sum of their own (at most 7 additions, then 1): no term passes through
// more than grad_sums_avx2_depth(n) additions.
constexpr int64_t grad_sums_avx2_depth(int64_t n) { return n / 8 + 12; }

CARBON_SOFTMAX_AVX2 inline double sum_lanes(__m256d lo, __m256d hi) {
  double l[4];
  _mm256_storeu_pd(l, _mm256_add_pd(lo, hi));
  return (l[0] + l[1]) + (l[2] + l[3]);
}

template <bool kLog, typename T>
CARBON_SOFTMAX_AVX2 void grad_sums_avx2(const T* g, const T* y, int64_t n, double* sum, double* abs_sum) {
  const __m256d sign_off = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) {
    Doubles8 t = widen8x2(g + k);
    if (!kLog) {  // g y: exact in fp64 (two values of at most 24 significant bits)
      const Doubles8 w = widen8x2(y + k);
      t.lo = _mm256_mul_pd(t.lo, w.lo);
      t.hi = _mm256_mul_pd(t.hi, w.hi);
    }
    s0 = _mm256_add_pd(s0, t.lo);
    s1 = _mm256_add_pd(s1, t.hi);
    a0 = _mm256_add_pd(a0, _mm256_and_pd(t.lo, sign_off));
    a1 = _mm256_add_pd(a1, _mm256_and_pd(t.hi, sign_off));
  }
  double ts = 0.0, ta = 0.0;
  for (int64_t k = vec; k < n; ++k) {
    const double t = kLog ? element_value(g[k]) : element_value(g[k]) * element_value(y[k]);
    ts = ts + t;
    ta = ta + std::fabs(t);
  }
  *sum = sum_lanes(s0, s1) + ts;
  *abs_sum = sum_lanes(a0, a1) + ta;
}

// Eight float32 results of v (lanes 0-3 lo, 4-7 hi) into o by vcvtpd2ps;
// ORs their NaN lanes into *nan.
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) void store_rn32x8(__m256d lo, __m256d hi, uint32_t* o,
                                                                           __m256* nan) {
  const __m256 r = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_castps_si256(r));
  *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
}

// The float32 result of one fp64 value (the rows' last n mod 8 outputs).
inline uint32_t rn32_bits_hw(double v, bool* nan) {
  const float r = static_cast<float>(v);
  *nan = *nan || v != v;
  uint32_t b;
  std::memcpy(&b, &r, sizeof b);
  return b;
}

// log_softmax: o_k = RN32(g_k - p_k G) (log_softmax_grad_unrounded; p_k G is
// exact in fp64, so one fnmadd rounds once, as the subtraction after the
// exact product does). False when some output is NaN.
template <typename T>
CARBON_SOFTMAX_AVX2 bool log_softmax_grad_out_avx2(const T* g, const float* p, double G, int64_t n, uint32_t* o) {
  const __m256d Gv = _mm256_set1_pd(G);
  __m256 nan = _mm256_setzero_ps();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) {
    const Doubles8 gw = widen8x2(g + k), pw = widen8x2(p + k);
    store_rn32x8(_mm256_fnmadd_pd(pw.lo, Gv, gw.lo), _mm256_fnmadd_pd(pw.hi, Gv, gw.hi), o + k, &nan);
  }
  bool tail_nan = false;
  for (int64_t k = vec; k < n; ++k) o[k] = rn32_bits_hw(log_softmax_grad_unrounded(p[k], element_value(g[k]), G), &tail_nan);
  return _mm256_testz_ps(nan, nan) && !tail_nan;
}

// softmax: o_k = RN32(y_k (*) (g_k (-) D)) (softmax_grad_unrounded: two
// roundings, in this order). False when some output is NaN.
template <typename T>
CARBON_SOFTMAX_AVX2 bool softmax_grad_out_avx2(const T* g, const T* y, double D, int64_t n, uint32_t* o) {
  const __m256d Dv = _mm256_set1_pd(D);
  __m256 nan = _mm256_setzero_ps();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) {
    const Doubles8 gw = widen8x2(g + k), yw = widen8x2(y + k);
    store_rn32x8(_mm256_mul_pd(yw.lo, _mm256_sub_pd(gw.lo, Dv)), _mm256_mul_pd(yw.hi, _mm256_sub_pd(gw.hi, Dv)), o + k,
                 &nan);
  }
  bool tail_nan = false;
  for (int64_t k = vec; k < n; ++k)
    o[k] = rn32_bits_hw(softmax_grad_unrounded(element_value(y[k]), element_value(g[k]), D), &tail_nan);
  return _mm256_testz_ps(nan, nan) && !tail_nan;
}

// cross-entropy: o_j = RN32(c (*) (p_j (-) q_j)) (cross_entropy_grad_unrounded),
// q_j = eps (/) C for every j but the target t (0 (+) x = x), whose output is
// recomputed after the loop. False when some output is NaN.
CARBON_SOFTMAX_AVX2 inline bool cross_entropy_grad_out_avx2(double c, const float* p, int64_t t, int64_t C, double eps,
                                                          uint32_t* o) {
  const __m256d cv = _mm256_set1_pd(c), qv = _mm256_set1_pd(eps / static_cast<double>(C));
  __m256 nan = _mm256_setzero_ps();
  const int64_t vec = C & ~int64_t{7};
  for (int64_t j = 0; j < vec; j += 8) {
    const Doubles8 pw = widen8x2(p + j);
    store_rn32x8(_mm256_mul_pd(cv, _mm256_sub_pd(pw.lo, qv)), _mm256_mul_pd(cv, _mm256_sub_pd(pw.hi, qv)), o + j, &nan);
  }
  bool other_nan = false;
  for (int64_t j = vec; j < C; ++j)
    o[j] = rn32_bits_hw(cross_entropy_grad_unrounded(c, p[j], j == t, eps, C), &other_nan);
  o[t] = rn32_bits_hw(cross_entropy_grad_unrounded(c, p[t], true, eps, C), &other_nan);
  return _mm256_testz_ps(nan, nan) && !other_nan;
}

}  // namespace carbon
