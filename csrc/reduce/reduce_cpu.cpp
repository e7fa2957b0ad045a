// CPU kernels of the exact reductions. Each output is computed the same way
// whatever the thread count: the summation trees below depend only on the
// sizes (and on the instruction set: AVX-512 or not), and every tree's error
// bound is used as such. Which tree or bound decides never shows in the
// bits: a decided output is RN(exact value), as from the exact tier.
//   * many rows: rows split over threads, each row summed in 32 chains
//     (AVX-512; 8 otherwise), the roundings of 64 rows decided together;
//   * a few long rows: each row cut into fixed chunks summed in parallel
//     (all three tiers), partials combined in chunk order;
//   * reducing leading dimensions ([n, cols] layout): columns summed side by
//     side (vectorized across columns), in fixed chunks of rows.
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/decide_block.h"
#include "../exact/fp_env.h"
#include "../exact/widen_avx2.h"
#include "../exact/widen_avx512.h"
#include "chain_tree.h"
#include "groups16_avx512.h"
#include "reduce.h"
#include "reduce_kernel.h"

namespace carbon {
namespace {

// Tier 1's fp64 sum of a row, an upper bound on the sum of its absolute
// values (their fp64 sum, or n max |x_k|: see chain_sums_v4), and the depth
// of the tree that formed the sum (the bound the rounding test takes).
struct Sums {
  double sum = 0.0, abs_sum = 0.0;
  int64_t depth = 0;
};

// Tier 1's fp64 sums of x[0, n) in kChains interleaved chains: no value
// passes through more than chain_depth(n) additions (chain_tree.h).
template <typename T>
__attribute__((target_clones("avx2", "default"))) Sums chain_sums_portable(const T* x, int64_t n) {
  double s[kChains] = {}, a[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double v = element_value(x[k + l]);
      s[l] = s[l] + v;
      a[l] = a[l] + abs_value(v);
    }
  for (; k < n; ++k) {
    const double v = element_value(x[k]);
    s[0] = s[0] + v;
    a[0] = a[0] + abs_value(v);
  }
  return {fold_chains(s), fold_chains(a), chain_depth(n)};
}

// ---------------------------------------------------------------- AVX-512 forms

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define CARBON_REDUCE_V4 __attribute__((target("arch=x86-64-v4")))

// fold_chains<32> of the chains held in four registers (chain 8j + l in
// lane l of r[j]): the same additions in the same order, lane-wise.
CARBON_REDUCE_V4 inline double fold_registers(__m512d r0, __m512d r1, __m512d r2, __m512d r3) {
  const __m512d w8 = _mm512_add_pd(_mm512_add_pd(r0, r2), _mm512_add_pd(r1, r3));  // widths 16, 8
  const __m256d w4 = _mm256_add_pd(_mm512_castpd512_pd256(w8), _mm512_extractf64x4_pd(w8, 1));
  const __m128d w2 = _mm_add_pd(_mm256_castpd256_pd128(w4), _mm256_extractf128_pd(w4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(w2, _mm_unpackhi_pd(w2, w2)));
}

// Tier 1 needs an upper bound A >= sum |x_k| (beta = gamma_depth A). The
// AVX-512 form takes A = n * max |x_k|: the largest magnitude is found on
// the elements' own bits (an integer maximum of the bits without the sign:
// non-negative floats order like their bit patterns, and NaN patterns lie
// above inf's, so a NaN or an inf gives a non-finite A and the row is left
// to the exact tiers, as its sum is not finite either). Two integer
// operations per 16 or 32 elements instead of an fp64 absolute sum (two
// operations per 8); the bound is looser (n max |x| against sum |x|),
// which only widens the interval of the rounding test. The product n * max
// is rounded once (relative error 2^-53), which kBoundSlack covers.
//
// max_magnitudes keeps, per lane, the largest magnitude of the elements of
// `lanes` among 32 consecutive ones: for float32 elements 0-15 in lo's
// lanes and 16-31 in hi's, for 16-bit formats all 32 in lo's (hi unused),
// so a lane is a column when the 32 elements are 32 columns of a row; for
// doubles (the partial sums of a long row, whose lanes are never columns)
// elements 0-15 fold into lo and 16-31 into hi.
CARBON_REDUCE_V4 inline void max_magnitudes(const float* p, uint32_t lanes, __m512i& lo, __m512i& hi) {
  const __m512i mask = _mm512_set1_epi32(0x7fffffff);
  lo = _mm512_max_epu32(lo, _mm512_and_si512(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(lanes), p), mask));
  hi = _mm512_max_epu32(hi, _mm512_and_si512(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(lanes >> 16), p + 16),
                                               mask));
}
CARBON_REDUCE_V4 inline void max_magnitudes16(const void* p, uint32_t lanes, __m512i& lo) {
  lo = _mm512_max_epu16(lo, _mm512_and_si512(_mm512_maskz_loadu_epi16(lanes, p), _mm512_set1_epi16(0x7fff)));
}
CARBON_REDUCE_V4 inline void max_magnitudes(const c10::BFloat16* p, uint32_t lanes, __m512i& lo, __m512i&) {
  max_magnitudes16(p, lanes, lo);
}
CARBON_REDUCE_V4 inline void max_magnitudes(const c10::Half* p, uint32_t lanes, __m512i& lo, __m512i&) {
  max_magnitudes16(p, lanes, lo);
}
CARBON_REDUCE_V4 inline void max_magnitudes(const double* p, uint32_t lanes, __m512i& lo, __m512i& hi) {
  const __m512i mask = _mm512_set1_epi64(0x7fffffffffffffffll);
  for (int q = 0; q < 4; ++q) {
    const __m512i bits =
        _mm512_and_si512(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(lanes >> (8 * q)), p + 8 * q), mask);
    __m512i& m = q < 2 ? lo : hi;
    m = _mm512_max_epu64(m, bits);
  }
}

// The largest magnitude over all lanes of max_magnitudes' lo and hi.
CARBON_REDUCE_V4 inline double largest_magnitude(__m512i lo, __m512i hi, const float*) {
  const uint32_t bits = _mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi));
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return element_value(value);
}
CARBON_REDUCE_V4 inline double largest_magnitude16(__m512i m) {
  const __m512i hi = _mm512_srli_epi32(m, 16), lo = _mm512_and_si512(m, _mm512_set1_epi32(0xffff));
  return static_cast<double>(_mm512_reduce_max_epu32(_mm512_max_epu32(hi, lo)));
}
CARBON_REDUCE_V4 inline double largest_magnitude(__m512i lo, __m512i, const c10::BFloat16*) {
  return element_value(c10::BFloat16(static_cast<uint16_t>(largest_magnitude16(lo)), c10::BFloat16::from_bits()));
}
CARBON_REDUCE_V4 inline double largest_magnitude(__m512i lo, __m512i, const c10::Half*) {
  return element_value(c10::Half(static_cast<uint16_t>(largest_magnitude16(lo)), c10::Half::from_bits()));
}
CARBON_REDUCE_V4 inline double largest_magnitude(__m512i lo, __m512i hi, const double*) {
  return bits_to_double(_mm512_reduce_max_epu64(_mm512_max_epu64(lo, hi)));
}

// The AVX-512 rows' tree: kRowChains = 32 chains in four registers of 8
// doubles, so consecutive additions are independent (one register's chain
// would wait for each addition's latency). Element k goes into chain
// k mod 32 while 32 remain; the last r < 32 elements go into chains 0 to
// r - 1 (masked loads: each chain adds at most one of them, and adding a
// masked lane's +0 changes nothing: no chain, started at +0, is ever -0); then
// the pairwise fold of the 32 chains. No value passes through more than
// floor(n / 32) + 1 + 5 <= chain_depth<32>(n) additions. The portable form
// keeps its 8 chains (chain_depth<8>); the tier-1 decision takes the depth
// of the tree that ran, and a decided value is RN(exact sum) whichever
// tree decides it.
constexpr int kRowChains = 32;

// bfloat16 and float16 rows: the same 32 chains (in the format's layout,
// groups16_avx512.h), fed by groups of 8 values added exactly in float32:
// elements k + i, k + 32 + i, ..., k + 224 + i share lane i of a
// 256-element group. A chain takes one addition per exact group, at most 8
// per other group and one per 32-element vector of the tail: no more than
// the element-wise chains' floor(n / 32) + 1, so chain_depth<kRowChains>
// still bounds it.
template <typename T>
CARBON_REDUCE_V4 Sums chain_sums16_v4(const T* x, int64_t n) {
  using L = Lanes16<T>;
  constexpr int64_t kGroup = 32 * kGroupValues;
  Chains16 c{_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  __m512i largest = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + kGroup <= n; k += kGroup)
    largest = _mm512_max_epu16(largest, add_group<L>(c, 0xffffffffu, x + k, 32));
  for (; k < n; k += 32) {  // the tail, 32 at a time (masked lanes read nothing and add +0)
    const uint32_t lanes = n - k >= 32 ? 0xffffffffu : static_cast<uint32_t>((1ull << (n - k)) - 1);
    const __m512i bits = bits16(x + k, lanes);
    largest = _mm512_max_epu16(largest, magnitudes16(bits));
    add_values<L>(c, bits);
  }
  const double bound = static_cast<double>(n) * largest_magnitude(largest, largest, x);
  return {fold_registers(c.s0, c.s1, c.s2, c.s3), bound, chain_depth<kRowChains>(n)};
}

template <typename T>
CARBON_REDUCE_V4 Sums chain_sums_v4(const T* x, int64_t n) {
  if constexpr (sizeof(T) == 2) return chain_sums16_v4(x, n);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m512i lo = _mm512_setzero_si512(), hi = lo;
  int64_t k = 0;
  for (; k + kRowChains <= n; k += kRowChains) {
    s0 = _mm512_add_pd(s0, widen8(x + k));
    s1 = _mm512_add_pd(s1, widen8(x + k + 8));
    s2 = _mm512_add_pd(s2, widen8(x + k + 16));
    s3 = _mm512_add_pd(s3, widen8(x + k + 24));
    max_magnitudes(x + k, 0xffffffffu, lo, hi);
  }
  if (k < n) {  // the last r < 32 elements, masked (lanes past the row read nothing and add +0)
    const uint32_t lanes = static_cast<uint32_t>((1ull << (n - k)) - 1);
    s0 = _mm512_add_pd(s0, widen8(x + k, static_cast<__mmask8>(lanes)));
    s1 = _mm512_add_pd(s1, widen8(x + k + 8, static_cast<__mmask8>(lanes >> 8)));
    s2 = _mm512_add_pd(s2, widen8(x + k + 16, static_cast<__mmask8>(lanes >> 16)));
    s3 = _mm512_add_pd(s3, widen8(x + k + 24, static_cast<__mmask8>(lanes >> 24)));
    max_magnitudes(x + k, lanes, lo, hi);
  }
  const double bound = static_cast<double>(n) * largest_magnitude(lo, hi, x);
  return {fold_registers(s0, s1, s2, s3), bound, chain_depth<kRowChains>(n)};
}

// chain_sums_v4's tree for float32 chunks of a long row, with the fp64 sum
// of |x_k| (in the same 32 chains) as the bound instead of n max |x_k|: a
// long row streams from memory, so the extra additions cost nothing
// measurable (16M values: 2.5 ms either way), and the tighter bound decides
// several times more sums at tier 1 (for random data sum |x| is ~1/7 of
// n max |x|). The fp64 absolute sum's own relative error, gamma_depth, is
// within kBoundSlack, as for the portable form's.
CARBON_REDUCE_V4 Sums chain_sums_abs_v4(const float* x, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, a0 = s0, a1 = s0, a2 = s0, a3 = s0;
  auto step = [](__m512d& s, __m512d& a, __m512d v) CARBON_REDUCE_V4 {
    s = _mm512_add_pd(s, v);
    a = _mm512_add_pd(a, _mm512_abs_pd(v));
  };
  int64_t k = 0;
  for (; k + kRowChains <= n; k += kRowChains) {
    step(s0, a0, widen8(x + k));
    step(s1, a1, widen8(x + k + 8));
    step(s2, a2, widen8(x + k + 16));
    step(s3, a3, widen8(x + k + 24));
  }
  if (k < n) {
    const uint32_t lanes = static_cast<uint32_t>((1ull << (n - k)) - 1);
    step(s0, a0, widen8(x + k, static_cast<__mmask8>(lanes)));
    step(s1, a1, widen8(x + k + 8, static_cast<__mmask8>(lanes >> 8)));
    step(s2, a2, widen8(x + k + 16, static_cast<__mmask8>(lanes >> 16)));
    step(s3, a3, widen8(x + k + 24, static_cast<__mmask8>(lanes >> 24)));
  }
  return {fold_registers(s0, s1, s2, s3), fold_registers(a0, a1, a2, a3), chain_depth<kRowChains>(n)};
}

// two_sum(s, v) lane-wise, its error added into t (compensated_add's steps).
CARBON_REDUCE_V4 inline void compensated_add8(__m512d& s, __m512d& t, __m512d v) {
  const __m512d sum = _mm512_add_pd(s, v);
  const __m512d bb = _mm512_sub_pd(sum, s);
  const __m512d e = _mm512_add_pd(_mm512_sub_pd(s, _mm512_sub_pd(sum, bb)), _mm512_sub_pd(v, bb));
  s = sum;
  t = _mm512_add_pd(t, e);
}

// Tier 2 of one chunk of a long row on AVX-512: TwoSum in 32 lanes (four
// registers of 8 doubles), element k into lane k mod 32 and the masked tail
// adding +0 to the rest, then the 32 lanes merged in lane order. Every step
// is a TwoSum or an addition of errors, as in the scalar compensated_add:
// no path takes more than n / 32 + 1 + 32 of them. Long rows whose sum lies
// within tier 1's bound of a rounding boundary come here (16-bit rows, whose
// bound is n max |x|, more often than float32 rows, bounded by sum |x|); the
// scalar loop cost ~10x tier 1, these lanes ~2x.
template <typename T>
CARBON_REDUCE_V4 CompensatedSum compensated_sum_v4(const T* x, int64_t n) {
  __m512d s[4], t[4];
  for (int q = 0; q < 4; ++q) s[q] = t[q] = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + kRowChains <= n; k += kRowChains)
    for (int q = 0; q < 4; ++q) compensated_add8(s[q], t[q], widen8(x + k + 8 * q));
  if (k < n) {
    const uint32_t lanes = static_cast<uint32_t>((1ull << (n - k)) - 1);
    for (int q = 0; q < 4; ++q)
      compensated_add8(s[q], t[q], widen8(x + k + 8 * q, static_cast<__mmask8>(lanes >> (8 * q))));
  }
  alignas(64) double ls[kRowChains], lt[kRowChains];
  for (int q = 0; q < 4; ++q) {
    _mm512_store_pd(ls + 8 * q, s[q]);
    _mm512_store_pd(lt + 8 * q, t[q]);
  }
  CompensatedSum acc;
  for (int l = 0; l < kRowChains; ++l) acc = compensated_merge(acc, CompensatedSum{ls[l], lt[l]});
  return acc;
}

// AVX-512 present. The widenings above are exact in the default MXCSR state,
// in which every op runs (csrc/exact/fp_env.h). CARBON_NORM_SCALAR=1 forces
// the portable forms (to check that both give the same bits).
bool use_v4() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          std::getenv("CARBON_NORM_SCALAR") == nullptr && cpu::avx512_allowed();
  return yes;
}

#pragma GCC diagnostic pop

// chain_sums_portable on AVX2 CPUs: chain l in lane l of the pair (s0, s1)
// (lanes 0-3, 4-7), so each chain receives the same elements in the same
// order and the tail and fold are the portable ones: the same sums. Written
// out because GCC's AVX2 clone of the portable loop ran chain 0 as a scalar
// chain beside the vectors (it also takes the tail) and widened bfloat16
// element by element.
template <typename T>
__attribute__((target("avx2,fma,f16c"))) Sums chain_sums_avx2(const T* x, int64_t n) {
  const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(~kSignBit)));
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, a0 = s0, a1 = s0;
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Doubles8 v = widen8x2(x + k);
    s0 = _mm256_add_pd(s0, v.lo);
    s1 = _mm256_add_pd(s1, v.hi);
    a0 = _mm256_add_pd(a0, _mm256_and_pd(v.lo, magnitude));
    a1 = _mm256_add_pd(a1, _mm256_and_pd(v.hi, magnitude));
  }
  static_assert(kChains == 8, "two registers of four chains");
  double s[kChains], a[kChains];
  _mm256_storeu_pd(s, s0);
  _mm256_storeu_pd(s + 4, s1);
  _mm256_storeu_pd(a, a0);
  _mm256_storeu_pd(a + 4, a1);
  for (; k < n; ++k) {
    const double v = element_value(x[k]);
    s[0] = s[0] + v;
    a[0] = a[0] + abs_value(v);
  }
  return {fold_chains(s), fold_chains(a), chain_depth(n)};
}

// AVX2 present and not switched off (CARBON_NORM_SCALAR=1 forces the
// portable forms here too).
bool use_avx2() {
  static const bool yes = cpu::avx2() && std::getenv("CARBON_NORM_SCALAR") == nullptr;
  return yes;
}

template <typename T>
Sums chain_sums(const T* x, int64_t n) {
  if (use_v4()) return chain_sums_v4(x, n);
  if (use_avx2()) return chain_sums_avx2(x, n);
  return chain_sums_portable(x, n);
}

// Tier 2 of x[0, n): a compensated sum (lanes on AVX-512, one chain
// otherwise); no path takes more than n + 33 steps (reduce_long_row's depth
// n + chunks + 2 covers its chunks: each holds 8192 elements, at most
// 8192 / 32 + 33 steps deep, and n > 4 * 8192).
template <typename T>
CompensatedSum compensated_sum(const T* x, int64_t n) {
  if (use_v4()) return compensated_sum_v4(x, n);
  CompensatedSum acc;
  for (int64_t k = 0; k < n; ++k) compensated_add(acc, element_value(x[k]));
  return acc;
}

template <typename F>
void store(double value, typename F::Bits* out) {
  *out = static_cast<typename F::Bits>(encode(value, F::get()));
}

// ---------------------------------------------------------------- rows

constexpr int64_t kRowBlock = 64;  // rows whose tier-1 decisions are taken together

template <typename T, typename F>
void reduce_many_rows(const T* x, int64_t rows, int64_t n, bool mean, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  // The general path of one row: tier 1's test over the whole range (zeros,
  // subnormals, overflow), then tiers 2 and 3.
  auto finish = [&](int64_t r, double sum, double abs_sum, int64_t depth) {
    double value;
    if (n == 0) {
      value = empty_reduction(mean);
    } else if (!reduce_round_fast(sum, abs_sum, n, depth, mean, f, &value)) {
      value = reduce_exact(x + r * n, n, 1, abs_sum, mean, f);
    }
    store<F>(value, out + r);
  };
  carbon::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    const bool v4 = use_v4(), avx2 = use_avx2();  // chain_sums_avx2's tree is the portable one
    const int64_t depth = v4 ? chain_depth<kRowChains>(n) : chain_depth(n);
    const double factor = gamma_n(depth) * kBoundSlack;  // reduce_round_fast's beta / abs_sum
    double sum[kRowBlock], abs_sum[kRowBlock];
    uint8_t pending[kRowBlock];
    for (int64_t r0 = begin; r0 < end; r0 += kRowBlock) {
      const int64_t width = std::min(kRowBlock, end - r0);
      for (int64_t i = 0; i < width; ++i) {
        const T* row = x + (r0 + i) * n;
        const Sums t1 = v4 ? chain_sums_v4(row, n) : (avx2 ? chain_sums_avx2(row, n) : chain_sums_portable(row, n));
        sum[i] = t1.sum;
        abs_sum[i] = t1.abs_sum;
      }
      const uint32_t all = mean ? decide_quotient_block<F>(sum, abs_sum, factor, static_cast<double>(n), width,
                                                           out + r0, pending)
                                : decide_block<F>(sum, abs_sum, factor, width, out + r0, pending);
      if (all) continue;
      for (int64_t i = 0; i < width; ++i)
        if (pending[i]) finish(r0 + i, sum[i], abs_sum[i], depth);
    }
  });
}

constexpr int64_t kChunk = 8192;

// One long row, every tier split into fixed chunks of kChunk elements.
template <typename T, typename F>
double reduce_long_row(const T* row, int64_t n, bool mean) {
  constexpr FloatFormat f = F::get();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  auto chunk_len = [&](int64_t c) { return std::min(kChunk, n - c * kChunk); };
  std::vector<double> sums(chunks), abs_sums(chunks);
  carbon::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      Sums s;
      if constexpr (std::is_same_v<T, float>)
        s = use_v4() ? chain_sums_abs_v4(row + c * kChunk, chunk_len(c)) : chain_sums(row + c * kChunk, chunk_len(c));
      else
        s = chain_sums(row + c * kChunk, chunk_len(c));
      sums[c] = s.sum;
      abs_sums[c] = s.abs_sum;
    }
  });
  const Sums of_sums = chain_sums(sums.data(), chunks);
  const double sum = of_sums.sum;
  const double abs_sum = chain_sums(abs_sums.data(), chunks).sum;
  // A chunk's tree (either form, at most kChunk elements) is at most
  // chunk_depth deep; the chunks' sums add of_sums.depth.
  const int64_t chunk_depth = std::max(chain_depth<kChains>(kChunk), chain_depth<kRowChains>(kChunk));
  double value;
  if (reduce_round_fast(sum, abs_sum, n, chunk_depth + of_sums.depth, mean, f, &value)) return value;

  std::vector<CompensatedSum> parts(chunks);
  carbon::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) parts[c] = compensated_sum(row + c * kChunk, chunk_len(c));
  });
  CompensatedSum acc;
  for (const CompensatedSum& part : parts) acc = compensated_merge(acc, part);
  if (reduce_round_compensated(acc, abs_sum * kBoundSlack, n, n + chunks + 2, mean, f, &value)) return value;

  std::vector<std::array<int64_t, kLimbs>> limbs(chunks);
  std::vector<uint32_t> flags(chunks);
  carbon::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      exact_sum_clear(limbs[c].data(), flags[c]);
      for (int64_t k = 0; k < chunk_len(c); ++k)
        exact_sum_add(limbs[c].data(), flags[c], element_value(row[c * kChunk + k]));
    }
  });
  int64_t total[kLimbs];
  uint32_t all_flags;
  exact_sum_clear(total, all_flags);
  for (int64_t c = 0; c < chunks; ++c) {  // integer sums: exact in any order
    for (int i = 0; i < kLimbs; ++i) total[i] += limbs[c][i];
    all_flags |= flags[c];
  }
  return reduce_round_exact_sum(total, all_flags, n, mean, f);
}

template <typename T, typename F>
void reduce_rows(const T* x, int64_t rows, int64_t n, bool mean, typename F::Bits* out) {
  // A few long rows: each row in chunks (also on one thread, where the
  // chunked tree's shallower depth decides far more sums at tier 1 than
  // one row's eight chains of n / 8 additions).
  if (rows < std::max(2, at::get_num_threads()) && n > 4 * kChunk) {
    for (int64_t r = 0; r < rows; ++r) store<F>(reduce_long_row<T, F>(x + r * n, n, mean), out + r);
    return;
  }
  reduce_many_rows<T, F>(x, rows, n, mean, out);
}

// ---------------------------------------------------------------- columns

constexpr int64_t kColumnBlock = 256;  // columns summed side by side
constexpr int64_t kRowChunk = 1024;    // rows per partial sum

// part[j] = sum of x[r * cols + j] over r < rows, one chain per column (the
// columns are independent, so the loop over j vectorizes).
template <typename T>
__attribute__((target_clones("avx2", "default"))) void column_chunk_sums(const T* __restrict__ x, int64_t rows,
                                                                          int64_t cols, int64_t width,
                                                                          double* __restrict__ part,
                                                                          double* __restrict__ abs_part) {
  for (int64_t j = 0; j < width; ++j) part[j] = abs_part[j] = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    for (int64_t j = 0; j < width; ++j) {
      const double v = element_value(row[j]);
      part[j] = part[j] + v;
      abs_part[j] = abs_part[j] + abs_value(v);
    }
  }
}

constexpr int64_t kRowStep = 64;       // rows per pass over the block's column groups
constexpr int64_t kPrefetchRows = 8;   // how far ahead the column walk fetches

// column_chunk_sums on AVX2 CPUs: 16 columns at a time held in registers
// (sums and absolute sums, four of each) while kRowStep rows stream past,
// then the next 16; the last width mod 16 columns as the portable loop does.
// Each column's two chains take its elements in row order, exactly the
// portable loop's additions (which keeps both in memory and loads and
// stores them for every element): the same part[] and abs_part[].
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void column_chunk_sums_avx2(const T* x, int64_t rows, int64_t cols,
                                                                     int64_t width, double* part,
                                                                     double* abs_part) {
  const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(~kSignBit)));
  const int64_t full = width & ~int64_t{15};
  for (int64_t j = 0; j < width; ++j) part[j] = abs_part[j] = 0.0;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowStep) {
    const int64_t r1 = std::min(rows, r0 + kRowStep);
    for (int64_t j = 0; j < full; j += 16) {
      __m256d s[4], a[4];
      for (int i = 0; i < 4; ++i) {
        s[i] = _mm256_loadu_pd(part + j + 4 * i);
        a[i] = _mm256_loadu_pd(abs_part + j + 4 * i);
      }
      for (int64_t r = r0; r < r1; ++r) {
        const T* p = x + r * cols + j;
        // Rows a stride apart: fetch a few ahead, as column_chunk_sums_v4.
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchRows * cols), _MM_HINT_T0);
        const Doubles8 v = widen8x2(p), w = widen8x2(p + 8);
        const __m256d e[4] = {v.lo, v.hi, w.lo, w.hi};
        for (int i = 0; i < 4; ++i) {
          s[i] = _mm256_add_pd(s[i], e[i]);
          a[i] = _mm256_add_pd(a[i], _mm256_and_pd(e[i], magnitude));
        }
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_pd(part + j + 4 * i, s[i]);
        _mm256_storeu_pd(abs_part + j + 4 * i, a[i]);
      }
    }
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = full; j < width; ++j) {
        const double v = element_value(x[r * cols + j]);
        part[j] = part[j] + v;
        abs_part[j] = abs_part[j] + abs_value(v);
      }
  }
}

// column_chunk_sums on AVX-512, 32 columns at a time held in registers
// while the rows stream past: each column's sum is the same one chain in
// row order (so the same depth), and abs_part[j] is the bound
// rows * max_r |x[r][j]| >= sum_r |x[r][j]| (as chain_sums_v4's: the
// largest magnitude from the elements' bits, non-finite for a NaN or inf;
// max_magnitudes' lanes are the columns).
template <typename T>
CARBON_REDUCE_V4 void column_chunk_sums_v4(const T* x, int64_t rows, int64_t cols, int64_t width, double* part,
                                           double* abs_part) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "float32, bfloat16 or float16 columns");
  // Passes of kRowStep rows over every 32-column group (not all rows of one
  // group, then the next: a group's rows lie a row stride apart, often one
  // page each, and the pages of one pass stay in the TLB). Between passes a
  // group's chains wait in part[] and its maxima in `largest` (a store and a
  // load of a double change nothing).
  alignas(64) T largest[kColumnBlock + 32];  // the columns' largest magnitudes, as elements
  std::memset(largest, 0, sizeof largest);
  for (int64_t j = 0; j < width; ++j) part[j] = 0.0;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowStep) {
    const int64_t r1 = std::min(rows, r0 + kRowStep);
    for (int64_t j = 0; j < width; j += 32) {
      const uint32_t lanes = width - j >= 32 ? 0xffffffffu : static_cast<uint32_t>((1ull << (width - j)) - 1);
      const __mmask8 l0 = static_cast<__mmask8>(lanes), l1 = static_cast<__mmask8>(lanes >> 8),
                     l2 = static_cast<__mmask8>(lanes >> 16), l3 = static_cast<__mmask8>(lanes >> 24);
      __m512d s0 = _mm512_maskz_loadu_pd(l0, part + j), s1 = _mm512_maskz_loadu_pd(l1, part + j + 8),
              s2 = _mm512_maskz_loadu_pd(l2, part + j + 16), s3 = _mm512_maskz_loadu_pd(l3, part + j + 24);
      __m512i lo = _mm512_load_si512(largest + j), hi = _mm512_load_si512(reinterpret_cast<char*>(largest + j) + 64);
      for (int64_t r = r0; r < r1; ++r) {
        const T* p = x + r * cols + j;
        // The group's rows are a stride apart: fetch a few rows ahead (the
        // hardware's prefetchers follow the contiguous walk of the portable
        // form, not this one). Prefetches never fault.
        const char* ahead = reinterpret_cast<const char*>(p + kPrefetchRows * cols);
        _mm_prefetch(ahead, _MM_HINT_T0);
        if (sizeof(T) == 4) _mm_prefetch(ahead + 64, _MM_HINT_T0);
        s0 = _mm512_add_pd(s0, widen8(p, l0));
        s1 = _mm512_add_pd(s1, widen8(p + 8, l1));
        s2 = _mm512_add_pd(s2, widen8(p + 16, l2));
        s3 = _mm512_add_pd(s3, widen8(p + 24, l3));
        max_magnitudes(p, lanes, lo, hi);
      }
      _mm512_mask_storeu_pd(part + j, l0, s0);
      _mm512_mask_storeu_pd(part + j + 8, l1, s1);
      _mm512_mask_storeu_pd(part + j + 16, l2, s2);
      _mm512_mask_storeu_pd(part + j + 24, l3, s3);
      _mm512_store_si512(largest + j, lo);
      if (sizeof(T) == 4) _mm512_store_si512(reinterpret_cast<char*>(largest + j) + 64, hi);
    }
  }
  const __m512d count = _mm512_set1_pd(static_cast<double>(rows));
  for (int64_t j = 0; j < width; j += 8) {
    const __mmask8 lanes = width - j >= 8 ? 0xff : static_cast<__mmask8>((1u << (width - j)) - 1);
    _mm512_mask_storeu_pd(abs_part + j, lanes, _mm512_mul_pd(count, widen8(largest + j)));
  }
}

// bfloat16 and float16 columns on AVX-512: groups of 8 rows added exactly
// in float32 first (groups16_avx512.h), 32 columns at a time in passes of
// kRowStep rows, as column_chunk_sums_v4. Each column is one chain of at
// most `rows` additions, as there. part[] keeps the columns' natural order;
// the chains hold them in the format's layout.
template <typename T>
CARBON_REDUCE_V4 void column_chunk_sums16_v4(const T* x, int64_t rows, int64_t cols, int64_t width, double* part,
                                             double* abs_part) {
  using L = Lanes16<T>;
  alignas(64) uint16_t largest[kColumnBlock];  // each column's largest magnitude, as bits
  std::memset(largest, 0, sizeof largest);
  for (int64_t j = 0; j < width; ++j) part[j] = 0.0;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowStep) {
    const int64_t r1 = std::min(rows, r0 + kRowStep);
    for (int64_t j = 0; j < width; j += 32) {
      const uint32_t lanes = width - j >= 32 ? 0xffffffffu : static_cast<uint32_t>((1ull << (width - j)) - 1);
      Chains16 c = load_chains<L>(part + j, lanes);
      __m512i largest_bits = _mm512_load_si512(largest + j);
      int64_t r = r0;
      for (; r + kGroupValues <= r1; r += kGroupValues) {
        // The rows lie a stride apart: fetch kPrefetchRows ahead (the
        // hardware follows contiguous walks only; prefetches never fault).
        for (int q = 0; q < kGroupValues; ++q)
          _mm_prefetch(reinterpret_cast<const char*>(x + (r + q + kPrefetchRows) * cols + j), _MM_HINT_T0);
        const __m512i group_largest = add_group<L>(c, lanes, x + r * cols + j, cols);
        largest_bits = _mm512_max_epu16(largest_bits, group_largest);
      }
      for (; r < r1; ++r) {
        const __m512i bits = bits16(x + r * cols + j, lanes);
        largest_bits = _mm512_max_epu16(largest_bits, magnitudes16(bits));
        add_values<L>(c, bits);
      }
      store_chains<L>(c, lanes, part + j);
      _mm512_store_si512(largest + j, largest_bits);
    }
  }
  const __m512d count = _mm512_set1_pd(static_cast<double>(rows));
  const T* largest_values = reinterpret_cast<const T*>(largest);
  for (int64_t j = 0; j < width; j += 8) {
    const __mmask8 lanes = width - j >= 8 ? 0xff : static_cast<__mmask8>((1u << (width - j)) - 1);
    _mm512_mask_storeu_pd(abs_part + j, lanes, _mm512_mul_pd(count, widen8(largest_values + j)));
  }
}

// out[j] = reduction of x[0..n)[j] for the columns of a contiguous [n, cols]
// tensor. Tiles of kRowChunk rows x kColumnBlock columns are summed in
// parallel (one chain per column), then each column adds its tiles' partials
// in row order: depth kRowChunk + n / kRowChunk + 1.
template <typename T, typename F>
void reduce_columns(const T* x, int64_t n, int64_t cols, bool mean, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const int64_t chunks = std::max<int64_t>(1, (n + kRowChunk - 1) / kRowChunk);
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  const int64_t depth = kRowChunk + chunks + 1;
  std::vector<double> sums(chunks * cols), abs_sums(chunks * cols);
  carbon::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) {
    const bool v4 = use_v4();
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t c = tile / blocks, j0 = (tile % blocks) * kColumnBlock;
      const int64_t rows = std::max<int64_t>(0, std::min(kRowChunk, n - c * kRowChunk));
      const int64_t width = std::min(kColumnBlock, cols - j0);
      auto* chunk_sums = v4 ? column_chunk_sums_v4<T> : (use_avx2() ? column_chunk_sums_avx2<T> : column_chunk_sums<T>);
      if constexpr (sizeof(T) == 2)
        if (v4) chunk_sums = column_chunk_sums16_v4<T>;
      chunk_sums(x + c * kRowChunk * cols + j0, rows, cols, width,
                                                            sums.data() + c * cols + j0,
                                                            abs_sums.data() + c * cols + j0);
    }
  });
  carbon::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
        sum = sum + sums[c * cols + j];
        abs_sum = abs_sum + abs_sums[c * cols + j];
      }
      double value;
      if (n == 0)
        value = empty_reduction(mean);
      else if (!reduce_round_fast(sum, abs_sum, n, depth, mean, f, &value))
        value = reduce_exact(x + j, n, cols, abs_sum, mean, f);
      store<F>(value, out + j);
    }
  });
}

template <typename Kernel>
void dispatch(const at::Tensor& x, FormatId format, at::Tensor& out, Kernel&& kernel) {
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      kernel(x.const_data_ptr<T>(), static_cast<typename F::Bits*>(out.mutable_data_ptr()), F{});
    });
  });
}

}  // namespace

void reduce_rows_cpu(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  dispatch(x, format, out, [&](const auto* data, auto* bits, auto fmt) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
    reduce_rows<T, decltype(fmt)>(data, rows, n, mean, bits);
  });
}

void reduce_columns_cpu(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const int64_t n = x.size(0), cols = x.size(1);
  dispatch(x, format, out, [&](const auto* data, auto* bits, auto fmt) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
    reduce_columns<T, decltype(fmt)>(data, n, cols, mean, bits);
  });
}

}  // namespace carbon
