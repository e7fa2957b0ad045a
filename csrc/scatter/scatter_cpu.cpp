// CPU kernel of the indexed accumulations. Destinations (o, j) are split
// over threads; each destination adds its segment of contributing source
// rows column by column (tier 1, vectorized across a block of columns, one
// sequential chain per column), then every column is decided on its own
// (scatter_kernel.h). The chains' depth is the number of terms whatever the
// thread count, so the bits never depend on it.
//
// Tier 1 also certifies, per column, when its sum is the exact sum (few
// terms of similar magnitude, the common case: see exact_scale); such a
// column is RN_f(sum) directly. Without the certificate every exact tie --
// about one output in seven for sums of a handful of random float32 or
// bfloat16 values -- failed the interval test and took the exact
// accumulator. Three forms of tier 1, each ending in RN_f(exact sum):
//   * portable: fp64 sums into arrays, then decide_columns (branch-free) and
//     the scalar tiers for what it leaves;
//   * AVX-512, fp64: the sums of 32 columns in registers, certified groups
//     of 8 columns rounded there, the rest to decide_columns;
//   * AVX-512, float32 (bfloat16 / float16 segments of at most 32 terms):
//     16 columns a vector, certified groups of 16 rounded, the rest redone
//     by the fp64 form;
//   * AVX2 (no AVX-512): the two AVX-512 forms with 4 doubles / 8 floats a
//     vector, certified groups of 4 / 8 columns rounded in registers.
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/decide_block.h"
#include "../exact/fp_env.h"
#include "../exact/widen_avx2.h"
#include "../exact/widen_avx512.h"
#include "scatter.h"
#include "scatter_kernel.h"

namespace carbon {
namespace {

constexpr int64_t kColumnBlock = 256;  // one bit per group of 8 columns fits in 32 bits
constexpr double kInf = std::numeric_limits<double>::infinity();

// Significand bits of the element type (its values are the terms).
template <typename T>
constexpr int element_precision() {
  return std::is_same<T, c10::BFloat16>::value ? 8 : (std::is_same<T, c10::Half>::value ? 11 : 24);
}

// The exactness certificate of tier 1. Every term is a finite value of a
// format with p significand bits, so each is an integer multiple of
// 2^Q, Q = E(m) - p + 1, where m is the smallest nonzero |term| and E(m) its
// exponent (a term's last significand bit weighs at least 2^(E(term)-p+1),
// and subnormals are multiples of the format's quantum, which is smaller
// still). If the fp64 absolute sum `abs_sum` < m * 2^(52-p) < 2^(Q+52),
// every partial absolute sum was below 2^(Q+52) (fl is monotone and
// 2^(Q+52) is a double), so each was a multiple of 2^Q below 2^(Q+53):
// representable, hence computed exactly; and every partial sum of the terms
// is bounded by one of them, so the fp64 sum is the exact sum too. (Zero
// terms do not count for m; a column of zeros has m = inf and sum 0, which
// the decision never takes.) m * 2^(52-p) is an exact scaling.
template <typename T>
constexpr double exact_scale() {
  return static_cast<double>(int64_t(1) << (52 - element_precision<T>()));
}

// Tier 1 of one block of columns: s[c] = (self) + sum of the rows, a[c] the
// same for absolute values (sequentially, in the segment's order), m[c] the
// smallest nonzero |term| (+inf if none).
template <typename T>
__attribute__((target_clones("avx2", "default"))) void block_sums_portable(
    const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order, int64_t count,
    int64_t inner, int64_t width, double* __restrict__ s, double* __restrict__ a, double* __restrict__ m) {
  if (self) {
    for (int64_t c = 0; c < width; ++c) {
      const double v = element_value(self[c]);
      s[c] = v;
      a[c] = abs_value(v);
      m[c] = v != 0.0 ? abs_value(v) : kInf;
    }
  } else {
    for (int64_t c = 0; c < width; ++c) {
      s[c] = a[c] = 0.0;
      m[c] = kInf;
    }
  }
  for (int64_t p = 0; p < count; ++p) {
    const T* row = source + order[p] * inner;
    for (int64_t c = 0; c < width; ++c) {
      const double v = element_value(row[c]);
      const double av = abs_value(v);
      s[c] = s[c] + v;
      a[c] = a[c] + av;
      m[c] = (v != 0.0 && av < m[c]) ? av : m[c];  // NaN never enters m (its column is not decided here)
    }
  }
}

// ---------------------------------------------------------------- AVX-512 form

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define CARBON_SCATTER_V4 __attribute__((target("arch=x86-64-v4")))

// Lanes of columns [c, c + 8) that lie below `width`.
inline __mmask8 lanes_below(int64_t c, int64_t width) {
  const int64_t n = std::min<int64_t>(8, std::max<int64_t>(0, width - c));
  return static_cast<__mmask8>((1u << n) - 1u);
}

// RN_f of 8 fp64 sums known exact, as f's bits (in 64-bit lanes), in the
// lanes where that result is a normal number of f (the returned mask):
// round_normal_bits, rounds_to_normal and encode_normal of float_format.h.
template <typename F>
CARBON_SCATTER_V4 inline __mmask8 round_fp64_normal(__m512d sum, __m512i* bits) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 53 - f.precision;
  const uint64_t min_bits = normal_min_bits(f), overflow = overflow_bits(f), half = 1ull << (drop - 1);
  const uint64_t rebias = static_cast<uint64_t>(1023 - f.max_exp) << (f.precision - 1);
  const __m512i u = _mm512_castpd_si512(sum);
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi64(static_cast<int64_t>(~kSignBit)));
  const __mmask8 normal = _mm512_cmplt_epu64_mask(_mm512_sub_epi64(mag, _mm512_set1_epi64(min_bits)),
                                                  _mm512_set1_epi64(overflow - half - min_bits));
  const __m512i last = _mm512_and_si512(_mm512_srli_epi64(mag, drop), _mm512_set1_epi64(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi64(_mm512_add_epi64(mag, _mm512_set1_epi64(half - 1)), last),
                                           _mm512_set1_epi64(static_cast<int64_t>(~((1ull << drop) - 1))));
  const __m512i encoded = _mm512_sub_epi64(_mm512_srli_epi64(rounded, drop), _mm512_set1_epi64(rebias));
  const __m512i sign = _mm512_slli_epi64(_mm512_srli_epi64(u, 63), f.total_bits - 1);
  *bits = _mm512_or_si512(encoded, sign);
  return normal;
}

// Stores the lanes `mask` of 8 results (f's bits in 64-bit lanes).
CARBON_SCATTER_V4 inline void store8(uint32_t* out, __mmask8 mask, __m512i bits) {
  _mm256_mask_storeu_epi32(out, mask, _mm512_cvtepi64_epi32(bits));
}
CARBON_SCATTER_V4 inline void store8(uint16_t* out, __mmask8 mask, __m512i bits) {
  _mm_mask_storeu_epi16(out, mask, _mm512_cvtepi64_epi16(bits));
}

// bfloat16 / float16 lanes of `mask` among 16 consecutive elements as
// float32 values (exact), +0 in the others.
CARBON_SCATTER_V4 inline __m512 widen16(const c10::BFloat16* p, __mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}
CARBON_SCATTER_V4 inline __m512 widen16(const c10::Half* p, __mmask16 mask) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}

// Lanes of columns [c, c + 16) that lie below `width`.
inline __mmask16 lanes16_below(int64_t c, int64_t width) {
  const int64_t n = std::min<int64_t>(16, std::max<int64_t>(0, width - c));
  return static_cast<__mmask16>((1u << n) - 1u);
}

// The two lane sets of the AVX-512 tier-1 loops: 8 fp64 lanes (any
// format) and 16 float32 lanes (16-bit formats, short segments), with the
// operations accumulate_group needs.
struct Fp64Lanes {
  using Vec = __m512d;
  using Mask = __mmask8;
  static constexpr int kLanes = 8;
  template <typename T>
  CARBON_SCATTER_V4 static Vec load(const T* p, Mask mask) { return widen8(p, mask); }
  CARBON_SCATTER_V4 static Vec zero() { return _mm512_setzero_pd(); }
  CARBON_SCATTER_V4 static Vec inf() { return _mm512_set1_pd(kInf); }
  CARBON_SCATTER_V4 static Vec abs(Vec x) { return _mm512_abs_pd(x); }
  CARBON_SCATTER_V4 static Vec add(Vec x, Vec y) { return _mm512_add_pd(x, y); }
  CARBON_SCATTER_V4 static Mask nonzero(Vec x) { return _mm512_cmp_pd_mask(x, zero(), _CMP_NEQ_OQ); }
  CARBON_SCATTER_V4 static Vec select(Vec src, Mask k, Vec x) { return _mm512_mask_mov_pd(src, k, x); }
  CARBON_SCATTER_V4 static Vec min_where(Vec src, Mask k, Vec x) { return _mm512_mask_min_pd(src, k, x, src); }
  static Mask below(int64_t c, int64_t width) { return lanes_below(c, width); }
};

struct Fp32Lanes {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  template <typename T>
  CARBON_SCATTER_V4 static Vec load(const T* p, Mask mask) { return widen16(p, mask); }
  CARBON_SCATTER_V4 static Vec zero() { return _mm512_setzero_ps(); }
  CARBON_SCATTER_V4 static Vec inf() { return _mm512_set1_ps(std::numeric_limits<float>::infinity()); }
  CARBON_SCATTER_V4 static Vec abs(Vec x) { return _mm512_abs_ps(x); }
  CARBON_SCATTER_V4 static Vec add(Vec x, Vec y) { return _mm512_add_ps(x, y); }
  CARBON_SCATTER_V4 static Mask nonzero(Vec x) { return _mm512_cmp_ps_mask(x, zero(), _CMP_NEQ_OQ); }
  CARBON_SCATTER_V4 static Vec select(Vec src, Mask k, Vec x) { return _mm512_mask_mov_ps(src, k, x); }
  CARBON_SCATTER_V4 static Vec min_where(Vec src, Mask k, Vec x) { return _mm512_mask_min_ps(src, k, x, src); }
  static Mask below(int64_t c, int64_t width) { return lanes16_below(c, width); }
};

// Tier 1's accumulation for kVectors vectors of columns from c0 of one
// destination, in registers across the whole segment: vs = self (if any)
// then each term added in segment order, va the same for |term|, vm the
// smallest nonzero |term| (+inf if none); mask: the columns below width.
template <typename L, int kVectors, typename T>
CARBON_SCATTER_V4 inline __attribute__((always_inline)) void accumulate_group(
    const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order, int64_t count,
    int64_t inner, int64_t c0, int64_t width, typename L::Mask* mask, typename L::Vec* vs, typename L::Vec* va,
    typename L::Vec* vm) {
  for (int v = 0; v < kVectors; ++v) {
    mask[v] = L::below(c0 + L::kLanes * v, width);
    if (self) {
      const typename L::Vec x = L::load(self + c0 + L::kLanes * v, mask[v]);
      vs[v] = x;
      va[v] = L::abs(x);
      vm[v] = L::select(L::inf(), L::nonzero(x), va[v]);
    } else {
      vs[v] = va[v] = L::zero();
      vm[v] = L::inf();
    }
  }
  for (int64_t p = 0; p < count; ++p) {
    const T* row = source + order[p] * inner + c0;
    for (int v = 0; v < kVectors; ++v) {
      const typename L::Vec x = L::load(row + L::kLanes * v, mask[v]);
      const typename L::Vec ax = L::abs(x);
      vs[v] = L::add(vs[v], x);
      va[v] = L::add(va[v], ax);
      vm[v] = L::min_where(vm[v], L::nonzero(x), ax);
    }
  }
}

// block_sums_portable, the same operations per column (so the same s, a, m),
// with the sums of 32 columns kept in registers across the whole segment
// (per term and 8 columns one widening load and four vector operations, no
// loads or stores of the partial sums); then, still in registers, every
// group of 8 columns whose sums are all certified exact with normal results
// is written to out (RN_f(sum), as decide_columns would). Returns a bit per
// group of 8 columns that is not, left to decide_columns (from s, a, m).
template <typename T, typename F>
CARBON_SCATTER_V4 uint32_t block_sums_v4(const T* __restrict__ self, const T* __restrict__ source,
                                         const int64_t* __restrict__ order, int64_t count, int64_t inner,
                                         int64_t width, double* __restrict__ s, double* __restrict__ a,
                                         double* __restrict__ m, typename F::Bits* __restrict__ out) {
  constexpr int kVectors = 4;
  const __m512d scale = _mm512_set1_pd(exact_scale<T>());
  uint32_t undecided = 0;
  for (int64_t c0 = 0; c0 < width; c0 += 8 * kVectors) {
    __mmask8 mask[kVectors];
    __m512d vs[kVectors], va[kVectors], vm[kVectors];
    accumulate_group<Fp64Lanes, kVectors>(self, source, order, count, inner, c0, width, mask, vs, va, vm);
    for (int v = 0; v < kVectors; ++v) {
      if (!mask[v]) continue;
      __m512i bits;
      const __mmask8 exact = _mm512_cmp_pd_mask(va[v], _mm512_mul_pd(vm[v], scale), _CMP_LT_OQ);
      const __mmask8 ok = exact & round_fp64_normal<F>(vs[v], &bits);
      if ((ok & mask[v]) == mask[v]) {
        store8(out + c0 + 8 * v, mask[v], bits);
        continue;
      }
      undecided |= 1u << ((c0 >> 3) + v);
      _mm512_mask_storeu_pd(s + c0 + 8 * v, mask[v], vs[v]);
      _mm512_mask_storeu_pd(a + c0 + 8 * v, mask[v], va[v]);
      _mm512_mask_storeu_pd(m + c0 + 8 * v, mask[v], vm[v]);
    }
  }
  return undecided;
}

// ---------------------------------------------------------------- float32 tier for 16-bit formats

// bfloat16 and float16 terms have 8 and 11 significand bits, so a short
// segment of them usually sums exactly in float32 too, 16 columns a vector
// instead of 8. The certificate of exact_scale, redone for float32's 24
// bits: abs_sum < m * 2^(23-p) < 2^(Q+23) makes every partial sum a
// multiple of 2^Q below 2^(Q+24) in magnitude, so representable -- including
// float32's subnormal range, whose quantum 2^-149 divides 2^Q, and with the
// same monotonicity argument at the top of the range: were a partial
// absolute sum >= 2^(Q+23), its rounding would be too (a float, or +inf),
// and so would abs_sum. (m * 2^(23-p) is an exact scaling, or +inf where the
// real product exceeds every float.) A certified column is RN_f(sum), by the
// integer rounding of float_format.h transcribed to float32 bits. Columns
// not certified, or whose result is not a normal number of f, make their
// group of 16 columns fall back on the fp64 tier.
template <typename T>
constexpr float exact_scale_fp32() {
  return static_cast<float>(int64_t(1) << (23 - element_precision<T>()));
}

// RN_f of 16 float32 sums known exact, as f's bits, in the lanes where that
// result is a normal number of f (the returned mask): round_normal_bits,
// rounds_to_normal and encode_normal of float_format.h with float32's 24
// significand bits in place of double's 53 (same derivations).
template <typename F>
CARBON_SCATTER_V4 inline __mmask16 round_fp32_normal(__m512 sum, __m256i* bits) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 24 - f.precision;
  constexpr uint32_t min_bits = static_cast<uint32_t>(f.min_normal_exp + 127) << 23;
  constexpr uint32_t overflow = static_cast<uint32_t>(f.max_exp + 128) << 23;
  constexpr uint32_t half = 1u << (drop - 1);
  constexpr uint32_t rebias = static_cast<uint32_t>(127 - f.max_exp) << (f.precision - 1);
  const __m512i u = _mm512_castps_si512(sum);
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 normal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(min_bits)),
                                                   _mm512_set1_epi32(overflow - half - min_bits));
  const __m512i last = _mm512_and_si512(_mm512_srli_epi32(mag, drop), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(mag, _mm512_set1_epi32(half - 1)), last),
                                           _mm512_set1_epi32(~((1u << drop) - 1u)));
  const __m512i encoded = _mm512_sub_epi32(_mm512_srli_epi32(rounded, drop), _mm512_set1_epi32(rebias));
  const __m512i sign = _mm512_srli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80000000u)), 32 - f.total_bits);
  *bits = _mm512_cvtepi32_epi16(_mm512_or_si512(encoded, sign));
  return normal;
}

// The float32 tier for columns [0, width) (width <= 256) of one
// destination: writes every certified group of 16 columns to out and
// returns a bit per group that is not (for the fp64 tier).
template <typename T, typename F>
CARBON_SCATTER_V4 uint32_t block_fp32_v4(const T* __restrict__ self, const T* __restrict__ source,
                                         const int64_t* __restrict__ order, int64_t count, int64_t inner,
                                         int64_t width, typename F::Bits* __restrict__ out) {
  static_assert(sizeof(typename F::Bits) == 2, "16-bit formats only");
  constexpr int kVectors = 4;
  const __m512 scale = _mm512_set1_ps(exact_scale_fp32<T>());
  uint32_t failed = 0;
  for (int64_t c0 = 0; c0 < width; c0 += 16 * kVectors) {
    __mmask16 mask[kVectors];
    __m512 vs[kVectors], va[kVectors], vm[kVectors];
    accumulate_group<Fp32Lanes, kVectors>(self, source, order, count, inner, c0, width, mask, vs, va, vm);
    for (int v = 0; v < kVectors; ++v) {
      if (!mask[v]) continue;
      __m256i bits;
      const __mmask16 exact = _mm512_cmp_ps_mask(va[v], _mm512_mul_ps(vm[v], scale), _CMP_LT_OQ);
      const __mmask16 ok = exact & round_fp32_normal<F>(vs[v], &bits);
      if ((ok & mask[v]) == mask[v])
        _mm256_mask_storeu_epi16(out + c0 + 16 * v, mask[v], bits);
      else
        failed |= 1u << ((c0 >> 4) + v);
    }
  }
  return failed;
}

// For 16-bit terms rounded to a 16-bit format (the dispatch also
// instantiates pairings the ops never use).
template <typename T, typename F>
constexpr bool has_fp32_tier() {
  return element_precision<T>() <= 11 && sizeof(typename F::Bits) == 2;
}

// The float32 tier is tried on segments of at most this many terms: the
// longer a segment, the likelier some column's smallest term is too small
// for its certificate (the fp64 tier then redoes the group). A choice of
// speed only: every tier gives RN_f(exact sum).
constexpr int64_t kFp32MaxTerms = 32;

#pragma GCC diagnostic pop

// AVX-512 present. In the default MXCSR state, in which every op runs
// (csrc/exact/fp_env.h), the widenings above are exact and the fp64
// additions those of the portable form. CARBON_SCATTER_PORTABLE=1 forces
// the portable form (to check that both give the same bits).
bool use_v4() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          std::getenv("CARBON_SCATTER_PORTABLE") == nullptr && cpu::avx512_allowed();
  return yes;
}

// ---------------------------------------------------------------- AVX2 form
//
// The AVX-512 loops above, ported to AVX2 (+FMA, F16C) for CPUs without
// AVX-512 (e.g. Zen 3), where tier 1 otherwise ran block_sums_portable:
// three arrays loaded and stored per term and column, then a separate
// decide_columns pass (the profile's hot spots). Each column still gets the
// same sequential chain as block_sums_portable (self, then the terms in
// segment order), so s and a are the same numbers, the bound argument of
// scatter_bound_factor and the certificate of exact_scale hold unchanged,
// and m is the same minimum. Groups of 4 columns (one __m256d) that are not
// all certified with normal results go to decide_columns from s, a, m, as
// with AVX-512. Only whole groups of 4 columns are vectorized here (no
// masked 16-bit loads in AVX2); the caller hands a block's last width % 4
// columns to block_sums_portable. No fma is used.
#define CARBON_SCATTER_V3 __attribute__((target("avx2,fma,f16c")))

// 4 consecutive elements as doubles: widen4; 8 as floats: floats8
// (csrc/exact/widen_avx2.h).

// The lane sets of the AVX2 tier-1 loops, as Fp64Lanes / Fp32Lanes without
// masks. The smallest nonzero |term| is kept branch-free: a zero term's
// |x| is replaced by +inf (or-ing inf's bits into +0), then min(candidate,
// m) -- vminpd returns its second operand when either is NaN, so a NaN term
// leaves m as it was, as in block_sums_portable.
struct Fp64Lanes2 {
  using Vec = __m256d;
  static constexpr int kLanes = 4;
  template <typename T>
  CARBON_SCATTER_V3 static Vec load(const T* p) { return widen4(p); }
  CARBON_SCATTER_V3 static Vec inf() { return _mm256_set1_pd(kInf); }
  CARBON_SCATTER_V3 static Vec abs(Vec x) {
    return _mm256_and_pd(x, _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<int64_t>(~kSignBit))));
  }
  CARBON_SCATTER_V3 static Vec add(Vec x, Vec y) { return _mm256_add_pd(x, y); }
  CARBON_SCATTER_V3 static Vec zero_to_inf(Vec x, Vec ax) {
    return _mm256_or_pd(ax, _mm256_and_pd(_mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_EQ_OQ), inf()));
  }
  CARBON_SCATTER_V3 static Vec min(Vec candidate, Vec m) { return _mm256_min_pd(candidate, m); }
};

struct Fp32Lanes2 {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  template <typename T>
  CARBON_SCATTER_V3 static Vec load(const T* p) { return floats8(p); }
  CARBON_SCATTER_V3 static Vec inf() { return _mm256_set1_ps(std::numeric_limits<float>::infinity()); }
  CARBON_SCATTER_V3 static Vec abs(Vec x) { return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }
  CARBON_SCATTER_V3 static Vec add(Vec x, Vec y) { return _mm256_add_ps(x, y); }
  CARBON_SCATTER_V3 static Vec zero_to_inf(Vec x, Vec ax) {
    return _mm256_or_ps(ax, _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ), inf()));
  }
  CARBON_SCATTER_V3 static Vec min(Vec candidate, Vec m) { return _mm256_min_ps(candidate, m); }
};

// accumulate_group for kVectors whole vectors of columns from c0: vs, va,
// vm as there (self first, when present, then the terms in segment order).
template <typename L, int kVectors, typename T>
CARBON_SCATTER_V3 inline __attribute__((always_inline)) void accumulate_group_avx2(
    const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order, int64_t count,
    int64_t inner, int64_t c0, typename L::Vec* vs, typename L::Vec* va, typename L::Vec* vm) {
  for (int v = 0; v < kVectors; ++v) {
    vm[v] = L::inf();
    if (self) {
      const typename L::Vec x = L::load(self + c0 + L::kLanes * v);
      vs[v] = x;
      va[v] = L::abs(x);
      vm[v] = L::min(L::zero_to_inf(x, va[v]), vm[v]);
    } else {
      vs[v] = va[v] = typename L::Vec{};
    }
  }
  // The segment's rows are scattered through source (one cache line or two
  // of each per group), and the whole segment is walked again for the next
  // group: the loads wait on L2/L3 unless fetched ahead. (Speed only.)
  constexpr int64_t kAhead = 8;
  for (int64_t p = 0; p < count; ++p) {
    if (p + kAhead < count) {
      const char* next = reinterpret_cast<const char*>(source + order[p + kAhead] * inner + c0);
      _mm_prefetch(next, _MM_HINT_T0);
      _mm_prefetch(next + sizeof(T) * L::kLanes * kVectors - 1, _MM_HINT_T0);
    }
    const T* row = source + order[p] * inner + c0;
    for (int v = 0; v < kVectors; ++v) {
      const typename L::Vec x = L::load(row + L::kLanes * v);
      const typename L::Vec ax = L::abs(x);
      vs[v] = L::add(vs[v], x);
      va[v] = L::add(va[v], ax);
      vm[v] = L::min(L::zero_to_inf(x, ax), vm[v]);
    }
  }
}

// round_fp64_normal for 4 lanes: f's bits in 64-bit lanes, and all-ones in
// the lanes whose result is a normal number of f. AVX2 has no unsigned
// 64-bit compare; mag < 2^63, so min_bits <= mag < overflow - half (what the
// unsigned compare of mag - min_bits tests) is two signed compares.
template <typename F>
CARBON_SCATTER_V3 inline __m256i round_fp64_normal_avx2(__m256d sum, __m256i* bits) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 53 - f.precision;
  const uint64_t min_bits = normal_min_bits(f), overflow = overflow_bits(f), half = 1ull << (drop - 1);
  const uint64_t rebias = static_cast<uint64_t>(1023 - f.max_exp) << (f.precision - 1);
  const __m256i u = _mm256_castpd_si256(sum);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi64x(static_cast<int64_t>(~kSignBit)));
  const __m256i normal =
      _mm256_and_si256(_mm256_cmpgt_epi64(mag, _mm256_set1_epi64x(static_cast<int64_t>(min_bits - 1))),
                       _mm256_cmpgt_epi64(_mm256_set1_epi64x(static_cast<int64_t>(overflow - half)), mag));
  const __m256i last = _mm256_and_si256(_mm256_srli_epi64(mag, drop), _mm256_set1_epi64x(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi64(_mm256_add_epi64(mag, _mm256_set1_epi64x(static_cast<int64_t>(half - 1))), last),
                       _mm256_set1_epi64x(static_cast<int64_t>(~((1ull << drop) - 1))));
  const __m256i encoded = _mm256_sub_epi64(_mm256_srli_epi64(rounded, drop), _mm256_set1_epi64x(static_cast<int64_t>(rebias)));
  const __m256i sign = _mm256_slli_epi64(_mm256_srli_epi64(u, 63), f.total_bits - 1);
  *bits = _mm256_or_si256(encoded, sign);
  return normal;
}

// Stores 4 results (f's bits in 64-bit lanes; each fits its width).
CARBON_SCATTER_V3 inline void store4(uint32_t* out, __m256i bits) {
  const __m256i packed = _mm256_permutevar8x32_epi32(bits, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}
CARBON_SCATTER_V3 inline void store4(uint16_t* out, __m256i bits) {
  const __m128i lanes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bits, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi32(lanes, lanes));  // values < 2^16: no saturation
}

// kVectors vectors (4 columns each) of block_sums_avx2 from c0.
template <int kVectors, typename T, typename F>
CARBON_SCATTER_V3 inline __attribute__((always_inline)) uint64_t sums_group_avx2(
    const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order, int64_t count,
    int64_t inner, int64_t c0, double* __restrict__ s, double* __restrict__ a, double* __restrict__ m,
    typename F::Bits* __restrict__ out) {
  const __m256d scale = _mm256_set1_pd(exact_scale<T>());
  __m256d vs[kVectors], va[kVectors], vm[kVectors];
  accumulate_group_avx2<Fp64Lanes2, kVectors>(self, source, order, count, inner, c0, vs, va, vm);
  uint64_t undecided = 0;
  for (int v = 0; v < kVectors; ++v) {
    const int64_t c = c0 + 4 * v;
    __m256i bits;
    const __m256d exact = _mm256_cmp_pd(va[v], _mm256_mul_pd(vm[v], scale), _CMP_LT_OQ);
    const __m256d ok = _mm256_and_pd(exact, _mm256_castsi256_pd(round_fp64_normal_avx2<F>(vs[v], &bits)));
    if (_mm256_movemask_pd(ok) == 0xF) {
      store4(out + c, bits);
      continue;
    }
    undecided |= uint64_t(1) << (c >> 2);
    _mm256_storeu_pd(s + c, vs[v]);
    _mm256_storeu_pd(a + c, va[v]);
    _mm256_storeu_pd(m + c, vm[v]);
  }
  return undecided;
}

// block_sums_v4 on AVX2 for columns [0, width), width a multiple of 4 and
// <= 256: 16 columns at a time in registers (12 accumulators), then 4.
// Returns a bit per group of 4 columns left to decide_columns (s, a, m
// written for those columns only).
template <typename T, typename F>
CARBON_SCATTER_V3 uint64_t block_sums_avx2(const T* __restrict__ self, const T* __restrict__ source,
                                           const int64_t* __restrict__ order, int64_t count, int64_t inner,
                                           int64_t width, double* __restrict__ s, double* __restrict__ a,
                                           double* __restrict__ m, typename F::Bits* __restrict__ out) {
  uint64_t undecided = 0;
  int64_t c0 = 0;
  for (; c0 + 16 <= width; c0 += 16)
    undecided |= sums_group_avx2<4, T, F>(self, source, order, count, inner, c0, s, a, m, out);
  for (; c0 + 4 <= width; c0 += 4)
    undecided |= sums_group_avx2<1, T, F>(self, source, order, count, inner, c0, s, a, m, out);
  return undecided;
}

// round_fp32_normal for 8 lanes: f's (16-bit) bits in 32-bit lanes, and
// all-ones in the lanes whose result is a normal number of f. mag < 2^31
// and the bounds are below 2^31, so signed compares test the range.
template <typename F>
CARBON_SCATTER_V3 inline __m256i round_fp32_normal_avx2(__m256 sum, __m256i* bits) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 24 - f.precision;
  constexpr uint32_t min_bits = static_cast<uint32_t>(f.min_normal_exp + 127) << 23;
  constexpr uint32_t overflow = static_cast<uint32_t>(f.max_exp + 128) << 23;
  constexpr uint32_t half = 1u << (drop - 1);
  constexpr uint32_t rebias = static_cast<uint32_t>(127 - f.max_exp) << (f.precision - 1);
  static_assert(overflow - half <= 0x7FFFFFFFu, "signed compares");
  const __m256i u = _mm256_castps_si256(sum);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i normal =
      _mm256_and_si256(_mm256_cmpgt_epi32(mag, _mm256_set1_epi32(static_cast<int32_t>(min_bits - 1))),
                       _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(overflow - half)), mag));
  const __m256i last = _mm256_and_si256(_mm256_srli_epi32(mag, drop), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(mag, _mm256_set1_epi32(static_cast<int32_t>(half - 1))), last),
                       _mm256_set1_epi32(static_cast<int32_t>(~((1u << drop) - 1u))));
  const __m256i encoded = _mm256_sub_epi32(_mm256_srli_epi32(rounded, drop), _mm256_set1_epi32(static_cast<int32_t>(rebias)));
  const __m256i sign =
      _mm256_srli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int32_t>(0x80000000u))), 32 - f.total_bits);
  *bits = _mm256_or_si256(encoded, sign);
  return normal;
}

// kVectors vectors (8 columns each) of block_fp32_avx2 from c0.
template <int kVectors, typename T, typename F>
CARBON_SCATTER_V3 inline __attribute__((always_inline)) uint32_t fp32_group_avx2(
    const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order, int64_t count,
    int64_t inner, int64_t c0, typename F::Bits* __restrict__ out) {
  const __m256 scale = _mm256_set1_ps(exact_scale_fp32<T>());
  __m256 vs[kVectors], va[kVectors], vm[kVectors];
  accumulate_group_avx2<Fp32Lanes2, kVectors>(self, source, order, count, inner, c0, vs, va, vm);
  uint32_t failed = 0;
  for (int v = 0; v < kVectors; ++v) {
    const int64_t c = c0 + 8 * v;
    __m256i bits;
    const __m256 exact = _mm256_cmp_ps(va[v], _mm256_mul_ps(vm[v], scale), _CMP_LT_OQ);
    const __m256 ok = _mm256_and_ps(exact, _mm256_castsi256_ps(round_fp32_normal_avx2<F>(vs[v], &bits)));
    if (_mm256_movemask_ps(ok) == 0xFF) {
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), packed);  // values < 2^16: no saturation
    } else {
      failed |= 1u << (c >> 3);
    }
  }
  return failed;
}

// block_fp32_v4 on AVX2 (the same float32 certificate and rounding) for
// columns [0, width), width a multiple of 8 and <= 256: 32 columns at a
// time, then 8. Returns a bit per group of 8 columns not written (for the
// fp64 tier).
template <typename T, typename F>
CARBON_SCATTER_V3 uint32_t block_fp32_avx2(const T* __restrict__ self, const T* __restrict__ source,
                                           const int64_t* __restrict__ order, int64_t count, int64_t inner,
                                           int64_t width, typename F::Bits* __restrict__ out) {
  static_assert(sizeof(typename F::Bits) == 2, "16-bit formats only");
  uint32_t failed = 0;
  int64_t c0 = 0;
  for (; c0 + 32 <= width; c0 += 32) failed |= fp32_group_avx2<4, T, F>(self, source, order, count, inner, c0, out);
  for (; c0 + 8 <= width; c0 += 8) failed |= fp32_group_avx2<1, T, F>(self, source, order, count, inner, c0, out);
  return failed;
}

// AVX2 with FMA and F16C (cpu::avx2(), so CARBON_CPU_NO_AVX2=1 turns it off),
// taken where the AVX-512 form is not; CARBON_SCATTER_PORTABLE=1 forces the
// portable form here too.
bool use_avx2() {
  static const bool yes = cpu::avx2() && std::getenv("CARBON_SCATTER_PORTABLE") == nullptr;
  return yes;
}

// Tier 1's decision for a block of columns, without branches (so the loop
// vectorizes), restricted to results in f's normal range
// (csrc/exact/decide_block.h). A column whose sum is certified exact
// (a[c] < m[c] * scale, see exact_scale) is RN_f(s[c]): beta = 0 and no
// outward step, so ties round to even. Otherwise it is
// round_if_decided(s, factor * a). Every other column (zeros, subnormals,
// overflow, non-finite sums, undecided intervals) is flagged in `pending`
// for scatter_finish. A decided column is RN_f(exact sum), as from
// scatter_finish, so the tier that decides never shows in the bits.
template <typename F>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) uint32_t decide_columns(
    const double* __restrict__ s, const double* __restrict__ a, const double* __restrict__ m, double factor,
    double scale, int64_t width, typename F::Bits* __restrict__ out, uint8_t* __restrict__ pending) {
  uint32_t all_decided = 1;
  for (int64_t c = 0; c < width; ++c) {
    const bool exact = a[c] < m[c] * scale;
    const uint32_t decided = decide_sum<F>(s[c], exact ? 0.0 : factor * a[c], exact ? 0 : 1, out + c);
    pending[c] = static_cast<uint8_t>(decided ^ 1u);
    all_decided &= decided;
  }
  return all_decided;
}

template <typename T, typename F>
void scatter_rows(const T* self, const T* source, const int64_t* order, const int64_t* offsets, int64_t outer,
                  int64_t N, int64_t S, int64_t inner, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  auto destinations = [&](int64_t begin, int64_t end) {
    double s[kColumnBlock], a[kColumnBlock], m[kColumnBlock];
    uint8_t pending[kColumnBlock];
    const bool v4 = use_v4();
    const bool avx2 = !v4 && use_avx2();
    for (int64_t d = begin; d < end; ++d) {
      const int64_t o = d / S, j = d % S;
      const int64_t* seg = order + offsets[j];
      const int64_t count = offsets[j + 1] - offsets[j];
      typename F::Bits* dst = out + d * inner;
      if (count == 0 && !self) continue;  // +0, from the zero fill in scatter_rows_cpu
      const double factor = scatter_bound_factor(count + (self ? 1 : 0));
      // The fp64 tier for columns [c0, c0 + width), width <= kColumnBlock.
      auto fp64_tier = [&](int64_t c0, int64_t width) {
        const T* self_row = self ? self + d * inner + c0 : nullptr;
        const T* src = source + o * N * inner + c0;
        // decide_columns, then the scalar tiers, for columns [c1, c1 + w) of s, a, m.
        auto decide = [&](int64_t c1, int64_t w) {
          if (decide_columns<F>(s + c1, a + c1, m + c1, factor, exact_scale<T>(), w, dst + c0 + c1, pending)) return;
          for (int64_t c = 0; c < w; ++c) {
            if (!pending[c]) continue;
            const int64_t col = c1 + c;
            const DestinationTerms<T> terms{self_row ? self_row + col : nullptr, src + col, seg, count, inner};
            dst[c0 + col] = static_cast<typename F::Bits>(encode(scatter_finish(terms, s[col], a[col], factor, f), f));
          }
        };
        if (v4) {
          for (uint32_t undecided = block_sums_v4<T, F>(self_row, src, seg, count, inner, width, s, a, m, dst + c0);
               undecided; undecided &= undecided - 1) {
            const int64_t g = __builtin_ctz(undecided) * 8;
            decide(g, std::min<int64_t>(8, width - g));
          }
        } else if (avx2) {
          // Whole groups of 4 columns vectorized, the last width % 4 portable.
          const int64_t whole = width & ~int64_t(3);
          for (uint64_t undecided = block_sums_avx2<T, F>(self_row, src, seg, count, inner, whole, s, a, m, dst + c0);
               undecided; undecided &= undecided - 1) {
            decide(__builtin_ctzll(undecided) * 4, 4);
          }
          if (whole < width) {
            block_sums_portable(self_row ? self_row + whole : nullptr, src + whole, seg, count, inner, width - whole,
                                s + whole, a + whole, m + whole);
            decide(whole, width - whole);
          }
        } else {
          block_sums_portable(self_row, src, seg, count, inner, width, s, a, m);
          decide(0, width);
        }
      };
      for (int64_t c0 = 0; c0 < inner; c0 += kColumnBlock) {
        const int64_t width = std::min(kColumnBlock, inner - c0);
        if constexpr (has_fp32_tier<T, F>()) {
          if (v4 && count <= kFp32MaxTerms) {
            uint32_t failed = block_fp32_v4<T, F>(self ? self + d * inner + c0 : nullptr, source + o * N * inner + c0,
                                                  seg, count, inner, width, dst + c0);
            for (; failed; failed &= failed - 1) {
              const int64_t g = __builtin_ctz(failed) * 16;
              fp64_tier(c0 + g, std::min<int64_t>(16, width - g));
            }
            continue;
          }
          if (avx2 && count <= kFp32MaxTerms && width >= 8) {
            // Whole groups of 8 columns in float32, the rest (failed groups,
            // the last width % 8 columns) by the fp64 tier.
            const int64_t whole = width & ~int64_t(7);
            uint32_t failed = block_fp32_avx2<T, F>(self ? self + d * inner + c0 : nullptr, source + o * N * inner + c0,
                                                    seg, count, inner, whole, dst + c0);
            for (; failed; failed &= failed - 1) fp64_tier(c0 + __builtin_ctz(failed) * 8, 8);
            if (whole < width) fp64_tier(c0 + whole, width - whole);
            continue;
          }
        }
        fp64_tier(c0, width);
      }
    }
  };
  // Destinations are split between threads by their work, not their number:
  // with Zipf-like tokens (embedding backward) nearly all contributions go to
  // the first rows, and an even split of the rows left one thread with ~95%
  // of the work. Work before destination d = o * S + j is counted as
  // o * (N * inner + S) + offsets[j] * inner + j (a term costs its row's
  // columns, a destination a little), and each of `parts` chunks starts at
  // the first destination whose work before it reaches its share. Each
  // destination is computed alone, in the same way whichever thread takes
  // it, so the split never shows in the bits.
  const int64_t per_outer = N * inner + S, total = outer * per_outer, D = outer * S;
  const int64_t parts = std::clamp<int64_t>(total / 16384, 1, at::get_num_threads());
  auto first_destination = [&](int64_t part) -> int64_t {
    if (part >= parts) return D;
    const int64_t w = static_cast<int64_t>(static_cast<__int128>(total) * part / parts);
    const int64_t o = w / per_outer, rem = w % per_outer;
    int64_t lo = 0, hi = S;  // the first j with offsets[j] * inner + j >= rem (j = S qualifies)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (offsets[mid] * inner + mid >= rem)
        hi = mid;
      else
        lo = mid + 1;
    }
    return o * S + lo;
  };
  carbon::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    destinations(first_destination(begin), first_destination(end));
  });
}

}  // namespace

void scatter_rows_cpu(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                      const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner, at::Tensor& out) {
  const int64_t N = order.numel();
  // Destinations with nothing to add (no self, no contribution) are +0: one
  // zero fill of the whole output (torch's, at memset speed), then the kernel
  // writes only the destinations that have terms.
  if (!self.defined()) out.zero_();
  with_element_type(source.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      scatter_rows<T, F>(self.defined() ? self.const_data_ptr<T>() : nullptr, source.const_data_ptr<T>(),
                         order.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(), outer, N, S, inner,
                         static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
}

}  // namespace carbon
