// The compensated dot product of two rows of doubles whose products are
// exact (widened float32 / bfloat16 / float16 values), on AVX-512: tier 2 of
// the CPU matmul (matmul_kernel.h) for the outputs tier 1 leaves.
//
// Why: the scalar tier 2 (compensated_add per term) is one chain of
// dependent TwoSums, ~16 cycles a term. With a long inner dimension tier 1's
// bound gamma_K |a| |b| leaves about 1% of the outputs (K = 8192: a language
// model head's input gradient), and that chain then cost more than the
// fp64 GEMM itself (measured: 1024 x 8192 x 256 took 85 ms, of which the
// GEMM 28). Here 16 lanes run independent chains (two vectors of 8: lane l
// of vector v takes the terms k = 16m + 8v + l), so the loop is bound by
// throughput, not latency.
//
// The bound (rounding_test.h's compensated_bound) holds for any order or
// tree of TwoSums; what it needs is `depth`, the most TwoSums and error
// additions on any path from a term to the result:
//   * a term's lane chain: at most ceil(K / 16) TwoSums, and the error of
//     each is added to the lane's t by one addition each (the same count);
//   * the two vectors merged lane by lane (compensated_merge: one TwoSum,
//     two additions of errors), then the 8 lanes in a fixed tree of 3 such
//     merges: 4 merges, at most 8 error additions on a path;
// so at most ceil(K / 16) + 8 (kDotMergeDepth) -- plus one for a bias added
// afterwards by the caller.
//
// Lanes past K load +0: TwoSum(s, +0) is s with error 0 (the scalar chain
// starts from +0 as well, and the result only reaches the caller's bound
// test, which never decides an interval that touches 0).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "rounding_test.h"

namespace carbon {

#define CARBON_DOT_V4 __attribute__((target("avx512f")))

inline constexpr int64_t kDotLanes = 16;
inline constexpr int64_t kDotMergeDepth = 8;

// The depth bound above, for K terms.
inline int64_t compensated_dot_depth(int64_t K) { return (K + kDotLanes - 1) / kDotLanes + kDotMergeDepth; }

namespace dot_detail {

struct Lanes {
  __m512d s, t;
};

CARBON_DOT_V4 inline void two_sum8(__m512d a, __m512d b, __m512d& s, __m512d& e) {
  s = _mm512_add_pd(a, b);
  const __m512d bb = _mm512_sub_pd(s, a);
  e = _mm512_add_pd(_mm512_sub_pd(a, _mm512_sub_pd(s, bb)), _mm512_sub_pd(b, bb));
}

CARBON_DOT_V4 inline void add8(Lanes& acc, __m512d x) {
  __m512d e;
  two_sum8(acc.s, x, acc.s, e);
  acc.t = _mm512_add_pd(acc.t, e);
}

}  // namespace dot_detail

// sum_k a[k] * b[k] (every product exact) as a compensated sum (s, t) with
// at most compensated_dot_depth(K) TwoSums / error additions on any path.
CARBON_DOT_V4 inline CompensatedSum compensated_dot_avx512(const double* a, const double* b, int64_t K) {
  using dot_detail::Lanes;
  Lanes v0{_mm512_setzero_pd(), _mm512_setzero_pd()}, v1 = v0;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    dot_detail::add8(v0, _mm512_mul_pd(_mm512_loadu_pd(a + k), _mm512_loadu_pd(b + k)));
    dot_detail::add8(v1, _mm512_mul_pd(_mm512_loadu_pd(a + k + 8), _mm512_loadu_pd(b + k + 8)));
  }
  if (k < K) {  // the tail: lanes past K load +0 (nothing past K is read)
    const int64_t left = K - k;
    const __mmask8 m0 = static_cast<__mmask8>(left >= 8 ? 0xFF : (1u << left) - 1);
    const __mmask8 m1 = static_cast<__mmask8>(left > 8 ? (1u << (left - 8)) - 1 : 0);
    dot_detail::add8(v0, _mm512_mul_pd(_mm512_maskz_loadu_pd(m0, a + k), _mm512_maskz_loadu_pd(m0, b + k)));
    dot_detail::add8(v1, _mm512_mul_pd(_mm512_maskz_loadu_pd(m1, a + k + 8), _mm512_maskz_loadu_pd(m1, b + k + 8)));
  }
  // Merge the two vectors lane by lane (compensated_merge on 8 lanes).
  __m512d s, e;
  dot_detail::two_sum8(v0.s, v1.s, s, e);
  const __m512d t = _mm512_add_pd(_mm512_add_pd(v0.t, v1.t), e);
  alignas(64) double ls[8], lt[8];
  _mm512_store_pd(ls, s);
  _mm512_store_pd(lt, t);
  // Then the 8 lanes: (0,4) (1,5) (2,6) (3,7), then (0,2) (1,3), then (0,1).
  CompensatedSum lane[8];
  for (int l = 0; l < 8; ++l) lane[l] = CompensatedSum{ls[l], lt[l]};
  for (int half = 4; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) lane[l] = compensated_merge(lane[l], lane[l + half]);
  return lane[0];
}

}  // namespace carbon
