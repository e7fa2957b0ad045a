// bfloat16 sums on AVX-512: groups of 8 values added in float32 first,
// exactly, for carbon.sum's rows and columns (reduce_cpu.cpp).
//
// The fp64 chains cost a widening and an addition per 8 elements, and those
// two pipes bound the loops. A bfloat16 value has an 8-bit significand, so
// up to 8 of them with close exponents add exactly in float32's 24 bits; one
// fp64 addition then takes the exact sum of 8 values. A chain of exact terms
// keeps tier 1's error bound (sum |terms| <= sum |x|, in no more additions
// than before), and a decided output is RN(exact sum) whatever the terms, so
// no output bit depends on which groups were exact.
//
// Why exact: with e_max the largest and e_min the smallest nonzero exponent
// field among the 8 (e_min = 0 for subnormals, which only understates their
// quantum 2^(1 - 134)), every value is a multiple of q = 2^(e_min - 134) and
// below 2^(e_max - 126) in magnitude, so every partial sum of at most 8 of
// them is a multiple of q below 8 * 2^(e_max - 126) = 2^(e_max - e_min + 11) q.
// With e_max - e_min <= 13 that is an integer multiple of q below 2^24 q,
// which float32 represents (q >= 2^-149, float32's own quantum). An overflow
// to inf or NaN, possible only for values near the top of the range, leaves
// a non-finite sum, which tier 1 never decides (the exact tiers re-read the
// elements). The test is per lane, on the elements' bits, before anything
// is added: a group in which any lane fails is added value by value instead
// (randn-like data: ~3% of groups).
//
// Lanes: a 32-bit lane of 32 loaded bfloat16 values holds elements 2i and
// 2i + 1; shifting / masking it gives both as float32 (`even` and `odd`
// halves, no shuffle). The fp64 chains s0..s3 then hold the elements
// 0, 2, ..., 14 | 16, ..., 30 | 1, 3, ..., 15 | 17, ..., 31 of each 32.
//
// Functions in an unnamed namespace: each file that includes this header
// compiles its own (AVX-512 code, inlined into the callers' AVX-512 loops).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include <c10/util/BFloat16.h>

#define CARBON_BF16_GROUPS_V4 __attribute__((target("arch=x86-64-v4")))

namespace carbon {
namespace {

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int kGroupValues = 8;  // values per lane added in float32
constexpr int kGroupSpan = 13;   // the largest e_max - e_min that keeps them exact (above)

// 32 bfloat16 values (+0 outside `lanes`).
CARBON_BF16_GROUPS_V4 inline __m512i bf16_bits(const c10::BFloat16* p, uint32_t lanes) {
  return _mm512_maskz_loadu_epi16(lanes, p);
}
CARBON_BF16_GROUPS_V4 inline __m512i bf16_bits(const c10::BFloat16* p) { return _mm512_loadu_si512(p); }

// Their magnitudes' bits (the sign cleared).
CARBON_BF16_GROUPS_V4 inline __m512i bf16_magnitudes(__m512i bits) {
  return _mm512_and_si512(bits, _mm512_set1_epi16(0x7fff));
}

// The even- and odd-numbered values of the 32 as float32 (exact).
CARBON_BF16_GROUPS_V4 inline __m512 even_halves(__m512i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)); }
CARBON_BF16_GROUPS_V4 inline __m512 odd_halves(__m512i bits) {
  return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Four fp64 chains in the parity layout above.
struct ParityChains {
  __m512d s0, s1, s2, s3;
};

// The chains += 32 float32 values in parity layout (exact widening: the
// callers run in the default MXCSR state).
CARBON_BF16_GROUPS_V4 inline void add_parity(ParityChains& c, __m512 even, __m512 odd) {
  c.s0 = _mm512_add_pd(c.s0, _mm512_cvtps_pd(_mm512_castps512_ps256(even)));
  c.s1 = _mm512_add_pd(c.s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(even, 1)));
  c.s2 = _mm512_add_pd(c.s2, _mm512_cvtps_pd(_mm512_castps512_ps256(odd)));
  c.s3 = _mm512_add_pd(c.s3, _mm512_cvtps_pd(_mm512_extractf32x8_ps(odd, 1)));
}
CARBON_BF16_GROUPS_V4 inline void add_parity(ParityChains& c, __m512i bits) {
  add_parity(c, even_halves(bits), odd_halves(bits));
}

// Chains in natural order (elements 0-7, 8-15, 16-23, 24-31 of `part`,
// masked) to parity layout, and back.
CARBON_BF16_GROUPS_V4 inline ParityChains load_parity_chains(const double* part, uint32_t lanes) {
  const __m512d n0 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes), part),
                n1 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 8), part + 8),
                n2 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 16), part + 16),
                n3 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 24), part + 24);
  const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  return {_mm512_permutex2var_pd(n0, even, n1), _mm512_permutex2var_pd(n2, even, n3),
          _mm512_permutex2var_pd(n0, odd, n1), _mm512_permutex2var_pd(n2, odd, n3)};
}
CARBON_BF16_GROUPS_V4 inline void store_parity_chains(const ParityChains& c, uint32_t lanes, double* part) {
  const __m512i low = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), high = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  _mm512_mask_storeu_pd(part, static_cast<__mmask8>(lanes), _mm512_permutex2var_pd(c.s0, low, c.s2));
  _mm512_mask_storeu_pd(part + 8, static_cast<__mmask8>(lanes >> 8), _mm512_permutex2var_pd(c.s0, high, c.s2));
  _mm512_mask_storeu_pd(part + 16, static_cast<__mmask8>(lanes >> 16), _mm512_permutex2var_pd(c.s1, low, c.s3));
  _mm512_mask_storeu_pd(part + 24, static_cast<__mmask8>(lanes >> 24), _mm512_permutex2var_pd(c.s1, high, c.s3));
}

// A group of up to kGroupValues vectors of 32 values, summed lane-wise in
// float32, with each lane's largest magnitude and smallest nonzero
// magnitude minus 1 (a zero wraps to 0xffff, above every other).
struct Bf16Group {
  __m512 even, odd;
  __m512i largest, smallest_minus_1;

  CARBON_BF16_GROUPS_V4 Bf16Group()
      : even(_mm512_setzero_ps()),
        odd(_mm512_setzero_ps()),
        largest(_mm512_setzero_si512()),
        smallest_minus_1(_mm512_set1_epi16(-1)) {}

  CARBON_BF16_GROUPS_V4 void add(__m512i bits) {
    const __m512i a = bf16_magnitudes(bits);
    largest = _mm512_max_epu16(largest, a);
    smallest_minus_1 = _mm512_min_epu16(smallest_minus_1, _mm512_sub_epi16(a, _mm512_set1_epi16(1)));
    even = _mm512_add_ps(even, even_halves(bits));
    odd = _mm512_add_ps(odd, odd_halves(bits));
  }

  // Whether every lane's float32 sum is exact: e_max - e_min <= kGroupSpan
  // (exponent fields: the bits >> 7; a lane of zeros gives 0 - 0).
  CARBON_BF16_GROUPS_V4 bool exact() const {
    const __m512i smallest = _mm512_add_epi16(smallest_minus_1, _mm512_set1_epi16(1));
    const __m512i span = _mm512_sub_epi16(_mm512_srli_epi16(largest, 7), _mm512_srli_epi16(smallest, 7));
    return _mm512_cmpgt_epi16_mask(span, _mm512_set1_epi16(kGroupSpan)) == 0;
  }
};

#pragma GCC diagnostic pop

}  // namespace
}  // namespace carbon
