// bfloat16 and float16 sums on AVX-512: groups of 8 values added in
// float32 first, exactly, for carbon.sum's rows and columns (reduce_cpu.cpp).
//
// The fp64 chains cost a widening and an addition per 8 elements, and those
// two pipes bound the loops. A bfloat16 value has an 8-bit significand and a
// float16 value an 11-bit one, so up to 8 of them with close exponents add
// exactly in float32's 24 bits; one fp64 addition then takes the exact sum
// of 8 values. A chain of exact terms keeps tier 1's error bound (sum
// |terms| <= sum |x|, in no more additions than before), and a decided
// output is RN(exact sum) whatever the terms, so no output bit depends on
// which groups were exact.
//
// Why exact: with e_max the largest and e_min the smallest nonzero exponent
// field among the 8 (e_min = 0 for subnormals, which only understates their
// quantum), every value is a multiple of q and below 2^s q in magnitude,
// so every partial sum of at most 8 of them is a multiple of q below
// 2^(s + 3) q; float32 represents it exactly when s + 3 <= 24 (q is far
// above float32's own quantum 2^-149, and the sums far below its overflow).
//   bfloat16 (8 bits, bias 127): q = 2^(e_min - 134), |x| < 2^(e_max - 126),
//     s = e_max - e_min + 8: exact for e_max - e_min <= 13.
//   float16 (11 bits, bias 15): q = 2^(e_min - 25), |x| < 2^(e_max - 14),
//     s = e_max - e_min + 11: exact for e_max - e_min <= 10.
// An infinity or NaN (or a bfloat16 overflow of the sum, possible only near
// the top of its range) leaves a non-finite sum, which tier 1 never decides
// (the exact tiers re-read the elements). The test is per lane, on the
// elements' bits, before anything is added: a group in which any lane fails
// is added value by value instead (add_group).
//
// Lanes: 32 loaded 16-bit values become two vectors of 16 float32 values
// (`first`, `second`) and four fp64 chains s0..s3 of 8. bfloat16: a 32-bit
// lane holds elements 2i and 2i + 1, and a shift / mask gives both as
// float32 (no shuffle), so the chains hold the elements 0, 2, ..., 14 |
// 16, ..., 30 | 1, 3, ..., 15 | 17, ..., 31 of each 32 ("parity layout").
// float16: vcvtph2ps widens the low and the high 16 elements, so the chains
// hold 0-7 | 8-15 | 16-23 | 24-31 (natural layout).
//
// Functions in an unnamed namespace: each file that includes this header
// compiles its own (AVX-512 code, inlined into the callers' AVX-512 loops).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#define CARBON_GROUPS16_V4 __attribute__((target("arch=x86-64-v4")))

namespace carbon {
namespace {

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int kGroupValues = 8;  // values per lane added in float32

// 32 16-bit values (+0 outside `lanes`).
CARBON_GROUPS16_V4 inline __m512i bits16(const void* p, uint32_t lanes) { return _mm512_maskz_loadu_epi16(lanes, p); }
CARBON_GROUPS16_V4 inline __m512i bits16(const void* p) { return _mm512_loadu_si512(p); }

// Their magnitudes' bits (the sign cleared).
CARBON_GROUPS16_V4 inline __m512i magnitudes16(__m512i bits) {
  return _mm512_and_si512(bits, _mm512_set1_epi16(0x7fff));
}

// The format's lanes: its 32 values as two vectors of 16 float32 values
// (exact), the largest exponent-field span that keeps a group exact, and
// where the exponent field starts.
struct Bf16Lanes {
  static constexpr bool kParity = true;  // the parity layout above
  static constexpr int kExponentShift = 7, kSpan = 13;
  CARBON_GROUPS16_V4 static __m512 first(__m512i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)); }
  CARBON_GROUPS16_V4 static __m512 second(__m512i bits) {
    return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
struct F16Lanes {
  static constexpr bool kParity = false;  // the natural layout
  static constexpr int kExponentShift = 10, kSpan = 10;
  CARBON_GROUPS16_V4 static __m512 first(__m512i bits) { return _mm512_cvtph_ps(_mm512_castsi512_si256(bits)); }
  CARBON_GROUPS16_V4 static __m512 second(__m512i bits) {
    return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1));
  }
};

template <typename T>
using Lanes16 = std::conditional_t<std::is_same_v<T, c10::BFloat16>, Bf16Lanes, F16Lanes>;

// Four fp64 chains in the format's layout.
struct Chains16 {
  __m512d s0, s1, s2, s3;
};

// The chains += 32 values as two vectors of 16 float32 values (exact
// widening: the callers run in the default MXCSR state).
CARBON_GROUPS16_V4 inline void add_halves(Chains16& c, __m512 first, __m512 second) {
  c.s0 = _mm512_add_pd(c.s0, _mm512_cvtps_pd(_mm512_castps512_ps256(first)));
  c.s1 = _mm512_add_pd(c.s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(first, 1)));
  c.s2 = _mm512_add_pd(c.s2, _mm512_cvtps_pd(_mm512_castps512_ps256(second)));
  c.s3 = _mm512_add_pd(c.s3, _mm512_cvtps_pd(_mm512_extractf32x8_ps(second, 1)));
}
template <typename L>
CARBON_GROUPS16_V4 inline void add_values(Chains16& c, __m512i bits) {
  add_halves(c, L::first(bits), L::second(bits));
}

// Chains in natural order (elements 0-7, 8-15, 16-23, 24-31 of `part`,
// masked) to the format's layout, and back.
template <typename L>
CARBON_GROUPS16_V4 inline Chains16 load_chains(const double* part, uint32_t lanes) {
  const __m512d n0 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes), part),
                n1 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 8), part + 8),
                n2 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 16), part + 16),
                n3 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 24), part + 24);
  if constexpr (!L::kParity) return {n0, n1, n2, n3};
  const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  return {_mm512_permutex2var_pd(n0, even, n1), _mm512_permutex2var_pd(n2, even, n3),
          _mm512_permutex2var_pd(n0, odd, n1), _mm512_permutex2var_pd(n2, odd, n3)};
}
template <typename L>
CARBON_GROUPS16_V4 inline void store_chains(const Chains16& c, uint32_t lanes, double* part) {
  __m512d n[4] = {c.s0, c.s1, c.s2, c.s3};
  if constexpr (L::kParity) {
    const __m512i low = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), high = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    n[0] = _mm512_permutex2var_pd(c.s0, low, c.s2);
    n[1] = _mm512_permutex2var_pd(c.s0, high, c.s2);
    n[2] = _mm512_permutex2var_pd(c.s1, low, c.s3);
    n[3] = _mm512_permutex2var_pd(c.s1, high, c.s3);
  }
  for (int i = 0; i < 4; ++i) _mm512_mask_storeu_pd(part + 8 * i, static_cast<__mmask8>(lanes >> (8 * i)), n[i]);
}

// A group of up to kGroupValues vectors of 32 values, summed lane-wise in
// float32, with each lane's largest magnitude and smallest nonzero
// magnitude minus 1 (a zero wraps to 0xffff, above every other).
template <typename L>
struct Group16 {
  __m512 first, second;
  __m512i largest, smallest_minus_1;

  CARBON_GROUPS16_V4 Group16()
      : first(_mm512_setzero_ps()),
        second(_mm512_setzero_ps()),
        largest(_mm512_setzero_si512()),
        smallest_minus_1(_mm512_set1_epi16(-1)) {}

  CARBON_GROUPS16_V4 void add(__m512i bits) {
    const __m512i a = magnitudes16(bits);
    largest = _mm512_max_epu16(largest, a);
    smallest_minus_1 = _mm512_min_epu16(smallest_minus_1, _mm512_sub_epi16(a, _mm512_set1_epi16(1)));
    first = _mm512_add_ps(first, L::first(bits));
    second = _mm512_add_ps(second, L::second(bits));
  }

  // Whether every lane's float32 sum is exact: e_max - e_min <= L::kSpan
  // (exponent fields: the magnitude bits >> L::kExponentShift; a lane of
  // zeros gives 0 - 0).
  CARBON_GROUPS16_V4 bool exact() const {
    const __m512i smallest = _mm512_add_epi16(smallest_minus_1, _mm512_set1_epi16(1));
    const __m512i span = _mm512_sub_epi16(_mm512_srli_epi16(largest, L::kExponentShift),
                                          _mm512_srli_epi16(smallest, L::kExponentShift));
    return _mm512_cmpgt_epi16_mask(span, _mm512_set1_epi16(L::kSpan)) == 0;
  }
};

// The chains += a group of kGroupValues vectors at x + q * stride (q < 8,
// each 32 values, +0 outside `lanes`): its float32 sums when every lane's is
// exact (one fp64 addition per lane), else the values one by one (at most 8
// additions per lane; float16 randn-like data: ~0.8% of lanes are inexact,
// so ~22% of groups of 32 lanes have one. Adding only those lanes' values
// and the other lanes' float32 sums measured slower: the group's eight
// vectors are read and widened again either way). Returns the group's
// largest magnitudes.
template <typename L, typename T>
CARBON_GROUPS16_V4 inline __m512i add_group(Chains16& c, uint32_t lanes, const T* x, int64_t stride) {
  Group16<L> group;
  for (int q = 0; q < kGroupValues; ++q) group.add(bits16(x + q * stride, lanes));
  if (__builtin_expect(group.exact(), 1)) {
    add_halves(c, group.first, group.second);
  } else {
    for (int q = 0; q < kGroupValues; ++q) add_values<L>(c, bits16(x + q * stride, lanes));
  }
  return group.largest;
}

#pragma GCC diagnostic pop

}  // namespace
}  // namespace carbon
