// compensated_dot_avx512 on AVX2 CPUs (no AVX-512): the compensated dot
// product of two rows of doubles whose products are exact, tier 2 of the
// CPU matmul for the outputs tier 1 leaves (compensated_dot_avx512.h says
// why the scalar chain is too slow with a long inner dimension).
//
// The same 16 lanes, as four vectors of 4 (lane l of vector v takes the
// terms k = 16m + 4v + l), so the same chains of at most ceil(K / 16)
// TwoSums; then the vectors merged lane by lane in a tree, (0, 1) (2, 3),
// then the two results (two merges on any path), and the 4 lanes in a
// tree, (0, 2) (1, 3), then (0, 1) (two more): 4 merges on a path, each
// one TwoSum and two error additions, as on AVX-512. So
// compensated_dot_depth(K) (ceil(K / 16) + kDotMergeDepth) bounds this
// tree too. The sum differs from the AVX-512 one (another order), but tier 2
// only returns RN_f(c) when the bound proves it, so the output bits are the
// same. Lanes past K load +0 (TwoSum(s, +0) = s, error 0).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "compensated_dot_avx512.h"  // kDotLanes, compensated_dot_depth
#include "rounding_test.h"

namespace carbon {

#define CARBON_DOT_V3 __attribute__((target("avx2,fma")))

namespace dot_detail {

struct Lanes4 {
  __m256d s, t;
};

CARBON_DOT_V3 inline void two_sum4(__m256d a, __m256d b, __m256d& s, __m256d& e) {
  s = _mm256_add_pd(a, b);
  const __m256d bb = _mm256_sub_pd(s, a);
  e = _mm256_add_pd(_mm256_sub_pd(a, _mm256_sub_pd(s, bb)), _mm256_sub_pd(b, bb));
}

CARBON_DOT_V3 inline void add4(Lanes4& acc, __m256d x) {
  __m256d e;
  two_sum4(acc.s, x, acc.s, e);
  acc.t = _mm256_add_pd(acc.t, e);
}

// compensated_merge lane by lane: s = TwoSum(x.s, y.s), t = x.t + y.t + e.
CARBON_DOT_V3 inline Lanes4 merge4(const Lanes4& x, const Lanes4& y) {
  Lanes4 out;
  __m256d e;
  two_sum4(x.s, y.s, out.s, e);
  out.t = _mm256_add_pd(_mm256_add_pd(x.t, y.t), e);
  return out;
}

}  // namespace dot_detail

// sum_k a[k] * b[k] (every product exact) as a compensated sum (s, t) with
// at most compensated_dot_depth(K) TwoSums / error additions on any path.
CARBON_DOT_V3 inline CompensatedSum compensated_dot_avx2(const double* a, const double* b, int64_t K) {
  using dot_detail::Lanes4;
  Lanes4 v[4];
  for (auto& x : v) x = Lanes4{_mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t k = 0;
  for (; k + kDotLanes <= K; k += kDotLanes)
    for (int q = 0; q < 4; ++q)
      dot_detail::add4(v[q], _mm256_mul_pd(_mm256_loadu_pd(a + k + 4 * q), _mm256_loadu_pd(b + k + 4 * q)));
  if (k < K) {  // the tail: lanes past K load +0 (nothing past K is read)
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
    for (int q = 0; q < 4; ++q) {
      const __m256i m = _mm256_cmpgt_epi64(_mm256_set1_epi64x(K - k - 4 * q), lane);
      dot_detail::add4(v[q], _mm256_mul_pd(_mm256_maskload_pd(a + k + 4 * q, m), _mm256_maskload_pd(b + k + 4 * q, m)));
    }
  }
  const Lanes4 all = dot_detail::merge4(dot_detail::merge4(v[0], v[1]), dot_detail::merge4(v[2], v[3]));
  alignas(32) double ls[4], lt[4];
  _mm256_store_pd(ls, all.s);
  _mm256_store_pd(lt, all.t);
  // Then the 4 lanes: (0, 2) (1, 3), then (0, 1).
  CompensatedSum lane[4];
  for (int l = 0; l < 4; ++l) lane[l] = CompensatedSum{ls[l], lt[l]};
  for (int half = 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) lane[l] = compensated_merge(lane[l], lane[l + half]);
  return lane[0];
}

}  // namespace carbon
