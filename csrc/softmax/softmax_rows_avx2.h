// The softmax family's CPU row loops besides the EXP on AVX2 + FMA + F16C
// CPUs without AVX-512 (softmax_cpu.cpp only): the gradients' row sums D / G
// in one pass, and the outputs' roundings into float32, bfloat16 or float16
// with one vector test per row.
//
// Sums: D = RN32(sum g_k y_k) (softmax) and G = RN32(sum g_k) (log_softmax)
// are decided from the fp64 sum and absolute sum by grad_sum_if_decided with
// the tree's depth, or taken from the exact tiers; their bits do not depend on
// the tree, so these eight lanes (two registers of four, the sum and the
// absolute sum in the same pass; the portable loop takes two passes of 32
// chains) give the portable loop's D and G.
//
// Outputs: each output is RN_F of an fp64 value computed by the same IEEE
// operations as softmax_kernel.h's *_unrounded functions (or held in the
// caller's fp64 scratch). float32: the hardware conversion vcvtpd2ps, which
// is RN32 for every double but NaN in the default MXCSR state every CPU
// kernel runs in (fp_env.h: no flush to zero, round to nearest), so
// subnormal outputs need no test here, unlike the portable loops'
// round_row_out, which does not assume that state. bfloat16 / float16:
// csrc/exact/round16_avx2.h. A row with a lane those cannot take (NaN; for
// bfloat16 also results below 2^-126) returns false, and its outputs are
// rewritten by the general rounding (round_double, the canonical NaN). The
// rows' last n mod 8 outputs take the general rounding directly.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../dtypes.h"
#include "../exact/round16_avx2.h"
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

// RN_F of eight doubles (lanes 0-3 lo, 4-7 hi) stored as F's bits; ORs into
// *bad the lanes the general rounding must redo (see above).
template <typename F>
CARBON_SOFTMAX_AVX2 inline __attribute__((always_inline)) void round_store8(__m256d lo, __m256d hi,
                                                                           typename F::Bits* o, __m256d* bad) {
  if constexpr (F::get().precision == 24) {  // float32
    const __m256 r = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
    _mm256_storeu_ps(reinterpret_cast<float*>(o), r);
    *bad = _mm256_or_pd(*bad, _mm256_castps_pd(_mm256_cmp_ps(r, r, _CMP_UNORD_Q)));
  } else if constexpr (F::get().precision == 8) {  // bfloat16
    round_store_bf16x8(o, lo, hi, bad);
  } else {  // float16
    static_assert(F::get().precision == 11);
    round_store_f16x8(o, lo, hi, bad);
  }
}

// RN_F(v) by the general rounding (the rows' tails).
template <typename F>
inline typename F::Bits general_bits(double v) {
  constexpr FloatFormat f = F::get();
  return static_cast<typename F::Bits>(encode(round_double(v, f), f));
}

// o[k] = RN_F(v[k]) for a row of fp64 values (the forward's 16-bit outputs,
// staged in the caller's scratch). False when some lane needs the general
// rounding.
template <typename F>
CARBON_SOFTMAX_AVX2 bool round_row_avx2(const double* v, int64_t n, typename F::Bits* o) {
  __m256d bad = _mm256_setzero_pd();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) round_store8<F>(_mm256_loadu_pd(v + k), _mm256_loadu_pd(v + k + 4), o + k, &bad);
  for (int64_t k = vec; k < n; ++k) o[k] = general_bits<F>(v[k]);
  return _mm256_testz_si256(_mm256_castpd_si256(bad), _mm256_castpd_si256(bad));
}

// log_softmax: o_k = RN_F(g_k - p_k G) (log_softmax_grad_unrounded; p_k G is
// exact in fp64, so one fnmadd rounds once, as the subtraction after the
// exact product does).
template <typename F, typename T>
CARBON_SOFTMAX_AVX2 bool log_softmax_grad_out_avx2(const T* g, const float* p, double G, int64_t n,
                                                   typename F::Bits* o) {
  const __m256d Gv = _mm256_set1_pd(G);
  __m256d bad = _mm256_setzero_pd();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) {
    const Doubles8 gw = widen8x2(g + k), pw = widen8x2(p + k);
    round_store8<F>(_mm256_fnmadd_pd(pw.lo, Gv, gw.lo), _mm256_fnmadd_pd(pw.hi, Gv, gw.hi), o + k, &bad);
  }
  for (int64_t k = vec; k < n; ++k) o[k] = general_bits<F>(log_softmax_grad_unrounded(p[k], element_value(g[k]), G));
  return _mm256_testz_si256(_mm256_castpd_si256(bad), _mm256_castpd_si256(bad));
}

// softmax: o_k = RN_F(y_k (*) (g_k (-) D)) (softmax_grad_unrounded: two
// roundings, in this order).
template <typename F, typename T>
CARBON_SOFTMAX_AVX2 bool softmax_grad_out_avx2(const T* g, const T* y, double D, int64_t n, typename F::Bits* o) {
  const __m256d Dv = _mm256_set1_pd(D);
  __m256d bad = _mm256_setzero_pd();
  const int64_t vec = n & ~int64_t{7};
  for (int64_t k = 0; k < vec; k += 8) {
    const Doubles8 gw = widen8x2(g + k), yw = widen8x2(y + k);
    round_store8<F>(_mm256_mul_pd(yw.lo, _mm256_sub_pd(gw.lo, Dv)), _mm256_mul_pd(yw.hi, _mm256_sub_pd(gw.hi, Dv)),
                    o + k, &bad);
  }
  for (int64_t k = vec; k < n; ++k)
    o[k] = general_bits<F>(softmax_grad_unrounded(element_value(y[k]), element_value(g[k]), D));
  return _mm256_testz_si256(_mm256_castpd_si256(bad), _mm256_castpd_si256(bad));
}

// cross-entropy: o_j = RN_F(c (*) (p_j (-) q_j)) (cross_entropy_grad_unrounded),
// q_j = eps (/) C for every j but the target t (0 (+) x = x), whose output is
// recomputed after the loop (its lane's flag from the loop is kept: at worst
// the row takes the general rounding, which gives the same bits).
template <typename F>
CARBON_SOFTMAX_AVX2 bool cross_entropy_grad_out_avx2(double c, const float* p, int64_t t, int64_t C, double eps,
                                                     typename F::Bits* o) {
  const __m256d cv = _mm256_set1_pd(c), qv = _mm256_set1_pd(eps / static_cast<double>(C));
  __m256d bad = _mm256_setzero_pd();
  const int64_t vec = C & ~int64_t{7};
  for (int64_t j = 0; j < vec; j += 8) {
    const Doubles8 pw = widen8x2(p + j);
    round_store8<F>(_mm256_mul_pd(cv, _mm256_sub_pd(pw.lo, qv)), _mm256_mul_pd(cv, _mm256_sub_pd(pw.hi, qv)), o + j,
                    &bad);
  }
  for (int64_t j = vec; j < C; ++j) o[j] = general_bits<F>(cross_entropy_grad_unrounded(c, p[j], j == t, eps, C));
  o[t] = general_bits<F>(cross_entropy_grad_unrounded(c, p[t], true, eps, C));
  return _mm256_testz_si256(_mm256_castpd_si256(bad), _mm256_castpd_si256(bad));
}

}  // namespace carbon
