// CPU kernels of the correctly rounded matmul. Work is split over rows with
// at::parallel_for; each output is computed independently of the split, so
// the bits do not depend on the thread count.
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <type_traits>
#include <vector>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/compensated_dot_avx2.h"
#include "../exact/compensated_dot_avx512.h"
#include "../exact/widen_avx2.h"
#include "../exact/fp_env.h"
#include "../reduce/reduce_kernel.h"
#include "matmul.h"
#include "matmul_cpu.h"

namespace carbon {

namespace {

// The statistics of one row from its accumulators: part, the eight lanes'
// partial sums of squares; set / clear, the OR of the elements' bits and of
// their complements (sign bits seen, in bit 63); e, the smallest biased
// exponent of a nonzero element (0x7FF when none: zeros count as 0x7FF;
// infinities and NaNs make the norm non-finite, and then the quantum is
// never used); [nonzero_first, nonzero_end), the nonzero elements' span
// (nonzero_end == 0 when none).
inline void finish_row_stats(const double part[8], uint64_t set, uint64_t clear, int64_t e, int64_t nonzero_first,
                             int64_t nonzero_end, int precision, double scale, double* norm, uint8_t* sign,
                             double* quantum, int32_t* span) {
  const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  *norm = std::sqrt(sum);
  *sign = static_cast<uint8_t>(((clear >> 63) ? kSomePositive : 0) | ((set >> 63) ? kSomeNegative : 0));
  // Every element is a value of a format of `precision` bits, exact in
  // double; one with exponent E (unbiased, >= e - 1023) is a multiple of
  // 2^(E - precision + 1) (its last significand bit; a subnormal value of
  // the format is a multiple of the format's quantum, which is a multiple
  // of that power for every E below the format's normal range). So
  // 2^(e - 1023 - precision + 1) divides the whole row. Double values
  // of a supported format are never subnormal doubles (e >= 1).
  *quantum = e == 0x7FF ? 0.0 : scale * std::ldexp(1.0, static_cast<int>(e) - 1023 - precision + 1);
  // The GEMM skips the zero ends of the rows (triangular in causal attention).
  span[0] = static_cast<int32_t>(nonzero_end == 0 ? 0 : nonzero_first);
  span[1] = static_cast<int32_t>(nonzero_end);
}

// The statistics of one row of K doubles (see widen_operand_cpu), and the
// span [first, end) of its nonzero elements ({0, 0} when every element is a
// zero; NaNs and infinities count as nonzero). Eight lanes of independent
// partial sums and minima (the bound allows any order of the sum of
// squares; lane l sums the elements k = l mod 8 of the whole 8-blocks, lane
// 0 then the rest in order), branch-free, so the loop vectorizes.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void stats_of_row_generic(
    const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign, double* quantum,
    int32_t* span) {
  constexpr int kLanes = 8;
  double part[kLanes] = {};
  int64_t emin[kLanes];
  uint64_t any_set[kLanes] = {}, any_clear[kLanes] = {};
  // The first index of a nonzero element and one past the last one.
  int64_t first[kLanes], end[kLanes] = {};
  for (int l = 0; l < kLanes; ++l) emin[l] = 0x7FF, first[l] = K;
  auto add = [&](int l, int64_t k) {
    const double x = row[k];
    part[l] = part[l] + x * x;
    const uint64_t u = double_to_bits(x);
    any_set[l] |= u;
    any_clear[l] |= ~u;
    const int64_t e = static_cast<int64_t>((u >> 52) & 0x7FF);
    const int64_t e_nonzero = e == 0 ? int64_t{0x7FF} : e;
    emin[l] = e_nonzero < emin[l] ? e_nonzero : emin[l];
    const bool nonzero = (u & ~kSignBit) != 0;
    const int64_t k_first = nonzero ? k : K, k_end = nonzero ? k + 1 : 0;
    first[l] = k_first < first[l] ? k_first : first[l];
    end[l] = k_end > end[l] ? k_end : end[l];
  };
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes)
    for (int l = 0; l < kLanes; ++l) add(l, k + l);
  for (; k < K; ++k) add(0, k);
  uint64_t set = 0, clear = 0;
  int64_t e = 0x7FF, nonzero_first = K, nonzero_end = 0;
  for (int l = 0; l < kLanes; ++l) {
    set |= any_set[l];
    clear |= any_clear[l];
    e = std::min(e, emin[l]);
    nonzero_first = std::min(nonzero_first, first[l]);
    nonzero_end = std::max(nonzero_end, end[l]);
  }
  finish_row_stats(part, set, clear, e, nonzero_first, nonzero_end, precision, scale, norm, sign, quantum, span);
}

template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void widen_row(const T* x, int64_t K, double* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = element_value(x[k]);
}

// Rows per task of the transposing copy.
constexpr int64_t kPanelRows = 256;

// dst[r * K + k] = x[r * sr + k * sk] for rows [r0, r1), exactly, in 8 x 8
// blocks: eight source lines at a time (contiguous when sr == 1: the rows of
// x are the columns of a contiguous tensor) are read across the panel, and
// every store fills 8 consecutive doubles of a row of dst.
// kUnitRowStride: sr == 1 known to the compiler, so that the loads of a
// block are vector loads.
template <typename T, bool kUnitRowStride>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void transpose_panel(
    const T* x, int64_t row_stride, int64_t sk, int64_t r0, int64_t r1, int64_t K, double* dst) {
  constexpr int64_t kB = 8;
  const int64_t sr = kUnitRowStride ? 1 : row_stride;
  int64_t k = 0;
  for (; k + kB <= K; k += kB) {
    int64_t r = r0;
    for (; r + kB <= r1; r += kB) {
      double block[kB][kB];  // [k][r]
      for (int64_t kk = 0; kk < kB; ++kk)
        for (int64_t rr = 0; rr < kB; ++rr) block[kk][rr] = element_value(x[(r + rr) * sr + (k + kk) * sk]);
      for (int64_t rr = 0; rr < kB; ++rr)
        for (int64_t kk = 0; kk < kB; ++kk) dst[(r + rr) * K + k + kk] = block[kk][rr];
    }
    for (; r < r1; ++r)
      for (int64_t kk = 0; kk < kB; ++kk) dst[r * K + k + kk] = element_value(x[r * sr + (k + kk) * sk]);
  }
  for (; k < K; ++k)
    for (int64_t r = r0; r < r1; ++r) dst[r * K + k] = element_value(x[r * sr + k * sk]);
}

// CARBON_MATMUL_PORTABLE set: no hand-written AVX-512 kernel at all (the
// compiled loops and the BLAS's GEMM instead; to compare, as every path must
// give the same bits).
bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && std::getenv("CARBON_MATMUL_PORTABLE") == nullptr &&
                          cpu::avx512_allowed();
  return yes;
}

// AVX-512 with its byte/word, doubleword/quadword and 128/256-bit forms
// (the rounding rows' kernel; every AVX-512 CPU since Skylake-X has them).
bool has_avx512_bw() {
  static const bool yes = has_avx512() && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw");
  return yes;
}

// The AVX2 loops (CPUs without AVX-512: Zen 1-3, Haswell to Alder Lake),
// where no AVX-512 kernel runs; off with CARBON_MATMUL_PORTABLE or
// CARBON_CPU_NO_AVX2 (cpu_features.h).
bool has_avx2() {
  static const bool yes = !has_avx512() && cpu::avx2() && std::getenv("CARBON_MATMUL_PORTABLE") == nullptr;
  return yes;
}

void stats_of_row_avx512(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                         double* quantum, int32_t* span);
void stats_of_row_avx2(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                       double* quantum, int32_t* span);

void stats_of_row(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                  double* quantum, int32_t* span) {
  (has_avx512() ? stats_of_row_avx512
   : has_avx2() ? stats_of_row_avx2
                : stats_of_row_generic)(row, K, precision, scale, norm, sign, quantum, span);
}

// Eight consecutive elements as doubles, exactly (as element_value: the
// hardware float -> double conversion; bfloat16 is the top half of a float).
__attribute__((target("avx512f"))) inline __m512d widen8(const float* x) {
  return _mm512_cvtps_pd(_mm256_loadu_ps(x));
}
__attribute__((target("avx512f"))) inline __m512d widen8(const c10::BFloat16* x) {
  const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))), 16);
  return _mm512_cvtps_pd(_mm256_castsi256_ps(bits));
}

// The vector loops' end: elements [k, K) in lane 0 of the statistics, as
// stats_of_row_generic's tail (widened from src into row first unless
// T = double), then finish_row_stats.
template <typename T>
inline void finish_widened_row(const T* src, double* row, int64_t k, int64_t K, double part[8], uint64_t any_set,
                               uint64_t any_clear, int64_t e, int64_t nonzero_first, int64_t nonzero_end,
                               int precision, double scale, double* norm, uint8_t* sign, double* quantum,
                               int32_t* span) {
  for (; k < K; ++k) {
    if constexpr (!std::is_same_v<T, double>) row[k] = element_value(src[k]);
    const double x = row[k];
    part[0] = part[0] + x * x;
    const uint64_t u = double_to_bits(x);
    any_set |= u;
    any_clear |= ~u;
    const int64_t ek = static_cast<int64_t>((u >> 52) & 0x7FF);
    e = std::min(e, ek == 0 ? int64_t{0x7FF} : ek);
    if ((u & ~kSignBit) != 0) {
      nonzero_first = std::min(nonzero_first, k);
      nonzero_end = k + 1;
    }
  }
  finish_row_stats(part, any_set, any_clear, e, nonzero_first, nonzero_end, precision, scale, norm, sign, quantum,
                   span);
}

// stats_of_row_generic on AVX-512 with the same lanes (so the same sums:
// a product, then an addition, per element, no fma), 512-bit vectors, and
// the span from each 8-block's mask of nonzero elements (the compiler's
// version tracks it per lane with blends, in 256-bit vectors).
// T = double: the statistics of `row` (src == row). T = float or bfloat16:
// also widens src into row on the way (widen_row, exactly: each vector of 8
// elements is converted, stored and summarized from the register), with the
// same statistics as widen_row then stats_of_row.
template <typename T>
__attribute__((target("avx512f"))) void widen_stats_row_avx512(const T* src, double* row, int64_t K, int precision,
                                                              double scale, double* norm, uint8_t* sign,
                                                              double* quantum, int32_t* span) {
  __m512d acc = _mm512_setzero_pd();
  __m512i set = _mm512_setzero_si512(), clear = _mm512_setzero_si512();
  const __m512i exp_mask = _mm512_set1_epi64(0x7FF), magnitude = _mm512_set1_epi64(static_cast<int64_t>(~kSignBit));
  __m512i emin = exp_mask;
  int64_t nonzero_first = K, nonzero_end = 0;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m512d x;
    if constexpr (std::is_same_v<T, double>) {
      x = _mm512_loadu_pd(row + k);
    } else {
      x = widen8(src + k);
      _mm512_storeu_pd(row + k, x);
    }
    acc = _mm512_add_pd(acc, _mm512_mul_pd(x, x));
    const __m512i u = _mm512_castpd_si512(x);
    set = _mm512_or_si512(set, u);
    clear = _mm512_or_si512(clear, _mm512_xor_si512(u, _mm512_set1_epi64(-1)));
    const __m512i e = _mm512_and_si512(_mm512_srli_epi64(u, 52), exp_mask);
    const __m512i e_nonzero = _mm512_mask_mov_epi64(e, _mm512_cmpeq_epi64_mask(e, _mm512_setzero_si512()), exp_mask);
    emin = _mm512_min_epu64(emin, e_nonzero);
    const unsigned nonzero = _mm512_test_epi64_mask(u, magnitude);
    if (nonzero != 0) {
      if (nonzero_first == K) nonzero_first = k + __builtin_ctz(nonzero);
      nonzero_end = k + 32 - __builtin_clz(nonzero);
    }
  }
  alignas(64) double part[8];
  alignas(64) uint64_t sets[8], clears[8], emins[8];
  _mm512_store_pd(part, acc);
  _mm512_store_si512(sets, set);
  _mm512_store_si512(clears, clear);
  _mm512_store_si512(emins, emin);
  uint64_t any_set = 0, any_clear = 0;
  int64_t e = 0x7FF;
  for (int l = 0; l < 8; ++l) any_set |= sets[l], any_clear |= clears[l], e = std::min<int64_t>(e, emins[l]);
  finish_widened_row(src, row, k, K, part, any_set, any_clear, e, nonzero_first, nonzero_end, precision, scale, norm,
                     sign, quantum, span);
}

void stats_of_row_avx512(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                         double* quantum, int32_t* span) {
  widen_stats_row_avx512<double>(row, const_cast<double*>(row), K, precision, scale, norm, sign, quantum, span);
}

// stats_of_row_generic on AVX2 with the same eight lanes, as two registers
// of four (lanes 0-3, 4-7): the same products and additions per lane, so
// the same sums. The other statistics are exact whatever the order:
// - sign bits: only bit 63 of the ORs is read, so `clear` (the OR of the
//   complements) is kept as the AND of the elements (its complement).
// - the smallest nonzero exponent field: the exponent field of the smallest
//   magnitude among the elements whose field is not 0 (magnitudes order as
//   their fields); those with field 0 (zeros; subnormal doubles, which no
//   widened element is) are replaced by +inf, whose field 0x7FF is the
//   generic loop's "none", as is a NaN's or an infinity's (vminpd returns
//   its second operand, the running minimum, for a NaN first operand).
// - the span, from each 8-block's compare x != 0 (unordered: NaN counts as
//   nonzero, as in the generic loop).
// T = double: the statistics of `row`; float, bfloat16, float16: also widens
// src into row (widen8x2: element_value's exact conversions).
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void widen_stats_row_avx2(const T* src, double* row, int64_t K,
                                                                 int precision, double scale, double* norm,
                                                                 uint8_t* sign, double* quantum, int32_t* span) {
  __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
  __m256d set = _mm256_setzero_pd(), all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  const __m256d sign_bit = _mm256_set1_pd(-0.0), smallest_normal = _mm256_set1_pd(0x1p-1022);
  const __m256d inf = _mm256_set1_pd(INFINITY), zero = _mm256_setzero_pd();
  __m256d least = inf;
  int64_t nonzero_first = K, nonzero_end = 0;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    Doubles8 x;
    if constexpr (std::is_same_v<T, double>) {
      x = widen8x2(row + k);
    } else {
      x = widen8x2(src + k);
      _mm256_storeu_pd(row + k, x.lo);
      _mm256_storeu_pd(row + k + 4, x.hi);
    }
    acc_lo = _mm256_add_pd(acc_lo, _mm256_mul_pd(x.lo, x.lo));
    acc_hi = _mm256_add_pd(acc_hi, _mm256_mul_pd(x.hi, x.hi));
    set = _mm256_or_pd(set, _mm256_or_pd(x.lo, x.hi));
    all = _mm256_and_pd(all, _mm256_and_pd(x.lo, x.hi));
    for (const __m256d h : {x.lo, x.hi}) {
      const __m256d mag = _mm256_andnot_pd(sign_bit, h);
      const __m256d candidate = _mm256_blendv_pd(mag, inf, _mm256_cmp_pd(mag, smallest_normal, _CMP_LT_OQ));
      least = _mm256_min_pd(candidate, least);
    }
    const unsigned nonzero = static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(x.lo, zero, _CMP_NEQ_UQ))) |
                             (static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(x.hi, zero, _CMP_NEQ_UQ))) << 4);
    if (nonzero != 0) {
      if (nonzero_first == K) nonzero_first = k + __builtin_ctz(nonzero);
      nonzero_end = k + 32 - __builtin_clz(nonzero);
    }
  }
  alignas(32) double part[8], leasts[4];
  alignas(32) uint64_t sets[4], alls[4];
  _mm256_store_pd(part, acc_lo);
  _mm256_store_pd(part + 4, acc_hi);
  _mm256_store_pd(leasts, least);
  _mm256_store_pd(reinterpret_cast<double*>(sets), set);
  _mm256_store_pd(reinterpret_cast<double*>(alls), all);
  uint64_t any_set = 0, any_clear = 0;
  int64_t e = 0x7FF;
  for (int l = 0; l < 4; ++l) {
    any_set |= sets[l], any_clear |= ~alls[l];
    e = std::min<int64_t>(e, static_cast<int64_t>(double_to_bits(leasts[l]) >> 52));
  }
  finish_widened_row(src, row, k, K, part, any_set, any_clear, e, nonzero_first, nonzero_end, precision, scale, norm,
                     sign, quantum, span);
}

void stats_of_row_avx2(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                       double* quantum, int32_t* span) {
  widen_stats_row_avx2<double>(row, const_cast<double*>(row), K, precision, scale, norm, sign, quantum, span);
}

// transpose_panel for a unit row stride (x's rows are the columns of a
// contiguous tensor) on AVX-512: each 8 x 8 block is eight vector loads of
// eight consecutive rows at one k, transposed in registers (unpack, then
// two rounds of lane permutes), and eight vector stores of eight
// consecutive k of one row. A plain copy: the same doubles as
// transpose_panel (the compiler's version went through the stack).
template <typename T>
__attribute__((target("avx512f"))) void transpose_panel_avx512(const T* x, int64_t sk, int64_t r0, int64_t r1,
                                                               int64_t K, double* dst) {
  constexpr int64_t kB = 8;
  const __m512i pick_even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i pick_odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  const int64_t kv = K / kB * kB;
  // Blocks of eight rows in turn, each along all of k: the stores fill the
  // eight rows of dst in order, and the loads walk down the columns.
  int64_t r = r0;
  for (; r + kB <= r1; r += kB) {
    for (int64_t k = 0; k < kv; k += kB) {
      __m512d v[kB];  // v[kk] = the eight rows r.. at k + kk
      for (int64_t kk = 0; kk < kB; ++kk) v[kk] = widen8(x + r + (k + kk) * sk);
      __m512d u[kB];  // u[2i] = (v[2i][0], v[2i+1][0], v[2i][2], v[2i+1][2], ...), u[2i+1] the odd elements
      for (int i = 0; i < 4; ++i) {
        u[2 * i] = _mm512_unpacklo_pd(v[2 * i], v[2 * i + 1]);
        u[2 * i + 1] = _mm512_unpackhi_pd(v[2 * i], v[2 * i + 1]);
      }
      // w[..]: four consecutive k of rows (0, 4), (1, 5), (2, 6), (3, 7),
      // for k.. k + 3 (w[0..3]) and k + 4.. k + 7 (w[4..7]).
      __m512d w[kB];
      for (int h = 0; h < 2; ++h) {
        w[4 * h + 0] = _mm512_permutex2var_pd(u[4 * h + 0], pick_even, u[4 * h + 2]);  // rows 0, 4
        w[4 * h + 1] = _mm512_permutex2var_pd(u[4 * h + 1], pick_even, u[4 * h + 3]);  // rows 1, 5
        w[4 * h + 2] = _mm512_permutex2var_pd(u[4 * h + 0], pick_odd, u[4 * h + 2]);   // rows 2, 6
        w[4 * h + 3] = _mm512_permutex2var_pd(u[4 * h + 1], pick_odd, u[4 * h + 3]);   // rows 3, 7
      }
      for (int j = 0; j < 4; ++j) {
        // Row j: lanes 0-1 of w[j] (k.. k + 3) then of w[4 + j] (k + 4..);
        // row j + 4: lanes 2-3 of each.
        _mm512_storeu_pd(dst + (r + j) * K + k, _mm512_shuffle_f64x2(w[j], w[4 + j], _MM_SHUFFLE(1, 0, 1, 0)));
        _mm512_storeu_pd(dst + (r + j + 4) * K + k, _mm512_shuffle_f64x2(w[j], w[4 + j], _MM_SHUFFLE(3, 2, 3, 2)));
      }
    }
  }
  for (; r < r1; ++r)
    for (int64_t k = 0; k < kv; ++k) dst[r * K + k] = element_value(x[r + k * sk]);
  for (int64_t k = kv; k < K; ++k)
    for (int64_t rr = r0; rr < r1; ++rr) dst[rr * K + k] = element_value(x[rr + k * sk]);
}

// transpose_panel for a unit row stride on AVX2: blocks of eight rows by
// eight k, as four 4 x 4 transposes in registers (unpack, then swaps of
// 128-bit halves), each row of the block getting its eight k as two
// consecutive stores of four. A plain copy, exact (widen4).
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void transpose_panel_avx2(const T* x, int64_t sk, int64_t r0, int64_t r1,
                                                                  int64_t K, double* dst) {
  constexpr int64_t kB = 8;
  const int64_t kv = K / kB * kB;
  int64_t r = r0;
  for (; r + kB <= r1; r += kB) {
    for (int64_t k = 0; k < kv; k += kB) {
      for (int64_t r4 = r; r4 < r + kB; r4 += 4) {      // rows r.. r + 3, then r + 4.. r + 7
        for (int64_t k4 = k; k4 < k + kB; k4 += 4) {   // k.. k + 3, then k + 4.. k + 7
          __m256d a[4];  // a[i] = rows r4.. r4 + 3 at k4 + i
          for (int i = 0; i < 4; ++i) a[i] = widen4(x + r4 + (k4 + i) * sk);
          // t0 = (a0[0], a1[0], a0[2], a1[2]), t1 = (a0[1], a1[1], a0[3], a1[3]); t2, t3 of a2, a3.
          const __m256d t0 = _mm256_unpacklo_pd(a[0], a[1]), t1 = _mm256_unpackhi_pd(a[0], a[1]);
          const __m256d t2 = _mm256_unpacklo_pd(a[2], a[3]), t3 = _mm256_unpackhi_pd(a[2], a[3]);
          double* row = dst + r4 * K + k4;
          _mm256_storeu_pd(row, _mm256_permute2f128_pd(t0, t2, 0x20));          // row r4: (a0[0], .., a3[0])
          _mm256_storeu_pd(row + K, _mm256_permute2f128_pd(t1, t3, 0x20));      // row r4 + 1
          _mm256_storeu_pd(row + 2 * K, _mm256_permute2f128_pd(t0, t2, 0x31));  // row r4 + 2
          _mm256_storeu_pd(row + 3 * K, _mm256_permute2f128_pd(t1, t3, 0x31));  // row r4 + 3
        }
      }
    }
  }
  for (; r < r1; ++r)
    for (int64_t k = 0; k < kv; ++k) dst[r * K + k] = element_value(x[r + k * sk]);
  for (int64_t k = kv; k < K; ++k)
    for (int64_t rr = r0; rr < r1; ++rr) dst[rr * K + k] = element_value(x[rr + k * sk]);
}

template <typename T>
void transpose_panel_unit(const T* x, int64_t sk, int64_t r0, int64_t r1, int64_t K, double* dst) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    if (has_avx512()) return transpose_panel_avx512(x, sk, r0, r1, K, dst);
  }
  if (has_avx2()) return transpose_panel_avx2(x, sk, r0, r1, K, dst);
  transpose_panel<T, true>(x, 1, sk, r0, r1, K, dst);
}

}  // namespace

void widen_operand_cpu(const at::Tensor& x, at::Tensor& out, at::Tensor& norms, at::Tensor& signs,
                       int precision, double scale, at::Tensor& quanta, at::Tensor& spans) {
  const int64_t B = x.size(0), R = x.size(1), K = x.size(2);
  const int64_t sb = x.stride(0), sr = x.stride(1), sk = x.stride(2);
  double* o = out.mutable_data_ptr<double>();
  double* norm = norms.mutable_data_ptr<double>();
  uint8_t* sign = signs.mutable_data_ptr<uint8_t>();
  double* quantum = quanta.mutable_data_ptr<double>();
  int32_t* span = spans.mutable_data_ptr<int32_t>();
  auto summarize = [&](int64_t r) {
    stats_of_row(o + r * K, K, precision, scale, norm + r, sign + r, quantum + r, span + 2 * r);
  };
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* in = x.const_data_ptr<T>();
    if (K <= 1 || sk == 1) {  // rows contiguous: widen and summarize row by row
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));
      carbon::parallel_for(0, B * R, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* src = in + (r / R) * sb + (r % R) * sr;
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
            if (has_avx512()) {
              widen_stats_row_avx512(src, o + r * K, K, precision, scale, norm + r, sign + r, quantum + r,
                                     span + 2 * r);
              continue;
            }
          }
          if (has_avx2()) {
            widen_stats_row_avx2(src, o + r * K, K, precision, scale, norm + r, sign + r, quantum + r, span + 2 * r);
            continue;
          }
          widen_row(src, K, o + r * K);  // exact (element_value)
          summarize(r);
        }
      });
      return;
    }
    // Rows strided (typically the columns of a contiguous tensor): a
    // transposing copy of panels of kPanelRows rows, then their statistics
    // (the panel is still in cache, at least in part).
    const int64_t panels = (R + kPanelRows - 1) / kPanelRows;
    carbon::parallel_for(0, B * panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / panels, r0 = (t % panels) * kPanelRows, r1 = std::min(R, r0 + kPanelRows);
        if (sr == 1) {
          transpose_panel_unit(in + b * sb, sk, r0, r1, K, o + b * R * K);
        } else {
          transpose_panel<T, false>(in + b * sb, sr, sk, r0, r1, K, o + b * R * K);
        }
        for (int64_t r = r0; r < r1; ++r) summarize(b * R + r);
      }
    });
  });
}

namespace {

// The fp64 GEMM's blocks (see fp64_gemm_cpu).
constexpr int64_t kGemmBlock = 64;

struct KRange {
  int32_t begin, end;  // empty when begin >= end
};

// The union of the nonzero spans of rows [r0, r1) (empty if all are empty).
KRange block_span(const int32_t* spans, int64_t r0, int64_t r1) {
  KRange k{INT32_MAX, 0};
  for (int64_t r = r0; r < r1; ++r)
    if (spans[2 * r] < spans[2 * r + 1]) {
      k.begin = std::min(k.begin, spans[2 * r]);
      k.end = std::max(k.end, spans[2 * r + 1]);
    }
  return k;
}

KRange intersect(KRange x, KRange y) { return {std::max(x.begin, y.begin), std::min(x.end, y.end)}; }

// c[r * ldc + j] = sum_{kb <= k < ke} a[r * ld + k] * bt[j * ld + k] for
// r < rows, j < cols (gemm_nt_avx512, below): the fp64 GEMM of one block on
// AVX-512, for operands already laid out as dot products (rows of a and of
// bt contiguous, as widening writes them), so nothing is packed and C is
// written once. Tiles of 4 x 4 outputs, each a sum of 8-lane fma chains over
// k (zero-filled lanes past the tile's last k) folded at the end. Any fp64
// evaluation order is fine for tier 1 (its bound covers every order and the
// fused multiply-adds, whose products are exact here anyway); a tile at an
// edge repeats the last row or column and
// stores only the outputs that exist.
// The vector of the sums of the lanes of v0, ..., v7, in that order: pair
// sums within 128-bit lanes, then two rounds of adding 128-bit lanes (a
// tree of adds; which one does not matter for tier 1's bound).
// 128-bit lane i of the result: (x's pair i summed, y's pair i summed).
__attribute__((target("avx512f"))) inline __m512d sum_pairs(__m512d x, __m512d y) {
  return _mm512_add_pd(_mm512_unpacklo_pd(x, y), _mm512_unpackhi_pd(x, y));
}

// 128-bit lanes (x0 + x1, x2 + x3, y0 + y1, y2 + y3) of x's and y's lanes.
__attribute__((target("avx512f"))) inline __m512d sum_lanes(__m512d x, __m512d y) {
  return _mm512_add_pd(_mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

__attribute__((target("avx512f"))) inline __m512d sum8(__m512d v0, __m512d v1, __m512d v2, __m512d v3, __m512d v4,
                                                      __m512d v5, __m512d v6, __m512d v7) {
  return sum_lanes(sum_lanes(sum_pairs(v0, v1), sum_pairs(v2, v3)), sum_lanes(sum_pairs(v4, v5), sum_pairs(v6, v7)));
}

// The union of the nonzero spans of n rows (spans as widen_operand_cpu
// writes them; an empty span {0, 0} only widens the union, which is safe).
inline KRange span_union(const int32_t* spans, int n) {
  KRange k{spans[0], spans[1]};
  for (int i = 1; i < n; ++i) k.begin = std::min(k.begin, spans[2 * i]), k.end = std::max(k.end, spans[2 * i + 1]);
  return k;
}

// a_spans, b_spans: the nonzero spans of the block's rows of a and of bt
// (first row r0, c0). Each tile sums only over k in [kb, ke) intersected
// with the union of its rows' spans and of its columns' spans: the products
// left out are exact zeros, or the output is never decided by tier 1 (a NaN
// or infinity is inside its row's span and makes that row's norm
// non-finite), as for the blocks (fp64_gemm_cpu). Causal attention's
// triangular operands then cost about half of a dense product instead of
// ~5/8 with 64-wide blocks. lower_only: tiles whose outputs all have
// j > i (row r0 + i, column c0 + j, here diag = c0 - r0 of the whole
// product) are not computed; their C entries are left as they are and never
// read (round_rows rounds j <= i only).
__attribute__((target("avx512f"))) void gemm_nt_avx512(const double* a, const double* bt, int64_t ld, int64_t rows,
                                                      int64_t cols, int64_t kb, int64_t ke, const int32_t* a_spans,
                                                      const int32_t* b_spans, bool lower_only, int64_t diag,
                                                      double* c, int64_t ldc) {
  constexpr int kR = 4;
  // Columns in chunks of ~128 KiB of bt, which stay in the L2 cache while
  // every row of the block passes over them.
  const int64_t chunk = std::max<int64_t>(kR, (16384 / std::max<int64_t>(ke - kb, 1)) / kR * kR);
  for (int64_t cc = 0; cc < cols; cc += chunk)
  for (int64_t r0 = 0; r0 < rows; r0 += kR) {
    const double* ar[kR];
    for (int i = 0; i < kR; ++i) ar[i] = a + std::min(r0 + i, rows - 1) * ld;
    const KRange a_k = span_union(a_spans + 2 * r0, static_cast<int>(std::min<int64_t>(kR, rows - r0)));
    for (int64_t c0 = cc; c0 < std::min(cols, cc + chunk); c0 += kR) {
      if (lower_only && c0 + diag > r0 + kR - 1) break;  // this tile and the rest of the row: all j > i
      const double* bc[kR];
      for (int j = 0; j < kR; ++j) bc[j] = bt + std::min(c0 + j, cols - 1) * ld;
      const KRange b_k = span_union(b_spans + 2 * c0, static_cast<int>(std::min<int64_t>(kR, cols - c0)));
      const int64_t k0 = std::max<int64_t>(kb, std::max(a_k.begin, b_k.begin));
      const int64_t k1 = std::min<int64_t>(ke, std::min(a_k.end, b_k.end));
      const int64_t kv = k0 + std::max<int64_t>(0, k1 - k0) / 8 * 8;
      __m512d acc[kR][kR];
      for (int i = 0; i < kR; ++i)
        for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_setzero_pd();
      for (int64_t k = k0; k < kv; k += 8) {
        __m512d x[kR], y[kR];
        for (int i = 0; i < kR; ++i) x[i] = _mm512_loadu_pd(ar[i] + k);
        for (int j = 0; j < kR; ++j) y[j] = _mm512_loadu_pd(bc[j] + k);
        for (int i = 0; i < kR; ++i)
          for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_fmadd_pd(x[i], y[j], acc[i][j]);
      }
      if (kv < k1) {
        const __mmask8 tail = static_cast<__mmask8>((1u << (k1 - kv)) - 1);
        __m512d x[kR], y[kR];
        for (int i = 0; i < kR; ++i) x[i] = _mm512_maskz_loadu_pd(tail, ar[i] + kv);
        for (int j = 0; j < kR; ++j) y[j] = _mm512_maskz_loadu_pd(tail, bc[j] + kv);
        for (int i = 0; i < kR; ++i)
          for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_fmadd_pd(x[i], y[j], acc[i][j]);
      }
      // The 16 sums: two vectors of 8 (rows r0, r0 + 1 and r0 + 2, r0 + 3).
      const __m512d sums[2] = {sum8(acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2], acc[1][3]),
                               sum8(acc[2][0], acc[2][1], acc[2][2], acc[2][3], acc[3][0], acc[3][1], acc[3][2], acc[3][3])};
      if (r0 + kR <= rows && c0 + kR <= cols) {
        for (int h = 0; h < 2; ++h) {
          _mm256_storeu_pd(c + (r0 + 2 * h) * ldc + c0, _mm512_castpd512_pd256(sums[h]));
          _mm256_storeu_pd(c + (r0 + 2 * h + 1) * ldc + c0, _mm512_extractf64x4_pd(sums[h], 1));
        }
      } else {
        alignas(64) double tile[kR * kR];
        _mm512_store_pd(tile, sums[0]);
        _mm512_store_pd(tile + 8, sums[1]);
        for (int i = 0; i < kR && r0 + i < rows; ++i)
          for (int j = 0; j < kR && c0 + j < cols; ++j) c[(r0 + i) * ldc + c0 + j] = tile[i * kR + j];
      }
    }
  }
}

// The blocked GEMM's calls use gemm_nt_avx512 for an inner dimension up to
// this (four rows of a then stay in the L1 cache; measured, one thread,
// causal attention at T = 256: 2-3 ms less per product than the BLAS's
// dgemm_ calls, which pack the operands anew for each block row and scale
// C by beta = 0 before adding to it).
constexpr int64_t kOwnKernelMaxK = 1024;

// Whether C = A Bt^T (M x N, row-major) is faster as its transpose Bt A^T
// (N x M, into scratch) plus a transposing copy. ATen's BLAS (MKL) is up to
// 2x slower on a tall, narrow C than on its transpose: measured, one thread,
// 8192 x 576 x 64 (a 3x3 convolution with 64 channels) 27.7 ms against
// 14.4 + 0.4 ms for the copy; 8192 x 576 x 128 46 against 26 + 2; 8192 x 768
// x 256 81 against 65 + 4; no gain from N = 384 on (8192 x 768 x 768: 196
// against 193 + 13) nor for small K (65536 x 9 x 16: 1.5 against 1.1 + 1.5).
// Any fp64 evaluation of the products is fine for tier 1, so either way
// gives the same output bits.
inline bool transposed_gemm_is_faster(int64_t M, int64_t N, int64_t K) {
  return K >= 64 && M >= 2 * N && (N <= 128 || M >= 32 * N);
}

}  // namespace
}  // namespace carbon

// The BLAS's double GEMM (Fortran interface, 32-bit integers), the one ATen
// itself calls; weak, so that a torch built without it falls back to at::bmm.
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
                       const double* beta, double* c, const int* ldc) __attribute__((weak));

namespace carbon {

bool fp64_gemm_cpu(const at::Tensor& a64, const at::Tensor& bt64, const at::Tensor& a_spans,
                   const at::Tensor& b_spans, at::Tensor& approx, bool lower_only,
                   const std::function<void(int64_t, int64_t)>& rows_done) {
  const int64_t B = a64.size(0), M = a64.size(1), K = a64.size(2), N = bt64.size(1);
  const int64_t mb = (M + kGemmBlock - 1) / kGemmBlock, nb = (N + kGemmBlock - 1) / kGemmBlock;
  const int32_t* as = a_spans.const_data_ptr<int32_t>();
  const int32_t* bs = b_spans.const_data_ptr<int32_t>();
  std::vector<KRange> a_block(B * mb), b_block(B * nb);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < mb; ++i)
      a_block[b * mb + i] = block_span(as + 2 * b * M, i * kGemmBlock, std::min(M, (i + 1) * kGemmBlock));
    for (int64_t j = 0; j < nb; ++j)
      b_block[b * nb + j] = block_span(bs + 2 * b * N, j * kGemmBlock, std::min(N, (j + 1) * kGemmBlock));
  }
  // The column blocks that block row i computes: those holding an output
  // j <= i (j < r1) when lower_only, all of them otherwise.
  auto blocks_of_row = [&](int64_t i) {
    return lower_only ? std::min(nb, (std::min(M, (i + 1) * kGemmBlock) + kGemmBlock - 1) / kGemmBlock) : nb;
  };
  double blocked_work = 0.0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < blocks_of_row(i); ++j) {
        const KRange k = intersect(a_block[b * mb + i], b_block[b * nb + j]);
        if (k.begin < k.end) blocked_work += static_cast<double>(k.end - k.begin);
      }
  const double full_work = static_cast<double>(B) * mb * nb * K;
  const bool fits_int = std::max({M, N, K}) < INT32_MAX;
  const bool use_own_kernel = has_avx512() && K <= kOwnKernelMaxK;
  // Dense operands go to the BLAS whole. (The own kernel used to take dense
  // products with K <= 256 and 16 <= N <= 1024 too; measured 2026-12-02,
  // whole carbon.bmm, ms at 1 / 2 threads, own kernel -> BLAS: 1024 x 256 x
  // 768 7.6 -> 5.8 / 4.1 -> 3.2, 1024 x 64 x 1024 3.6 -> 2.8 / 1.9 -> 1.6,
  // 48 x 256 x 64 x 256 12.3 -> 9.5 / 6.7 -> 5.5, 12 x 1024 x 64 x 1024
  // 63 -> 53 / 35 -> 32; the own kernel ahead only at 4096 x 64 x 1024,
  // 16.2 against 19.0 / 8.2 against 9.2.)
  if (dgemm_ == nullptr || !fits_int || (!lower_only && blocked_work > 0.75 * full_work)) {
    // Dense operands: one (batched) GEMM, multithreaded by the BLAS.
    if (B == 1 && transposed_gemm_is_faster(M, N, K)) {
      at::Tensor ct = scratch_doubles({N, M});
      at::mm_out(ct, bt64[0], a64[0].t());
      approx[0].copy_(ct.t());
    } else if (B == 1) {
      at::Tensor c0 = approx[0];
      at::mm_out(c0, a64[0], bt64[0].t());
    } else {
      at::bmm_out(approx, a64, bt64.transpose(1, 2));
    }
    return false;
  }

  const double* a = a64.const_data_ptr<double>();
  const double* bt = bt64.const_data_ptr<double>();
  double* c = approx.mutable_data_ptr<double>();
  // One task per block row of one batch matrix; the BLAS runs on one
  // thread inside the parallel region.
  carbon::parallel_for(0, B * mb, 1, [&](int64_t begin, int64_t end) {
    const double one = 1.0, zero = 0.0;
    const int ld = static_cast<int>(K), ldc = static_cast<int>(N);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / mb, i = t % mb;
      const int64_t r0 = i * kGemmBlock, rows = std::min(M, r0 + kGemmBlock) - r0;
      const KRange a_k = a_block[b * mb + i];
      const int64_t blocks = blocks_of_row(i);
      for (int64_t j = 0; j < blocks;) {
        // Consecutive column blocks with the same span: one call.
        const KRange k = intersect(a_k, b_block[b * nb + j]);
        int64_t j_end = j + 1;
        while (j_end < blocks) {
          const KRange next = intersect(a_k, b_block[b * nb + j_end]);
          if (next.begin != k.begin || next.end != k.end) break;
          ++j_end;
        }
        const int64_t c0 = j * kGemmBlock, cols = std::min(N, j_end * kGemmBlock) - c0;
        double* out = c + (b * M + r0) * N + c0;
        if (k.begin >= k.end) {  // every product is an exact zero
          for (int64_t r = 0; r < rows; ++r) std::fill(out + r * N, out + r * N + cols, 0.0);
        } else {
          // Row-major C = A Bt^T is, to the column-major BLAS, C^T = Bt^T A^T
          // with Bt stored as its transpose: ("T", "N").
          const int m = static_cast<int>(cols), n = static_cast<int>(rows), kk = k.end - k.begin;
          const double* a_block = a + (b * M + r0) * K + k.begin;
          const double* bt_block = bt + (b * N + c0) * K + k.begin;
          if (use_own_kernel) {
            gemm_nt_avx512(a + (b * M + r0) * K, bt + (b * N + c0) * K, K, rows, cols, k.begin, k.end,
                           as + 2 * (b * M + r0), bs + 2 * (b * N + c0), lower_only, c0 - r0, out, N);
          } else {
            dgemm_("T", "N", &m, &n, &kk, &one, bt_block, &ld, a_block, &ld, &zero, out, &ldc);
          }
        }
        j = j_end;
      }
      if (rows_done) rows_done(b * M + r0, b * M + r0 + rows);
    }
  });
  return static_cast<bool>(rows_done);
}

// Scratch memory. The exact fp64 copies of the operands and the fp64 GEMM's
// result live only during one call, and they are large (25 MB for one
// 48 x 256 x 256 operand). A fresh block that size is mapped anew by the
// system allocator, and faulting its pages in costs more than filling them
// (measured on a 2-core VM: ~2.4 us per 4 KiB page, 9 ms per 25 MB, 45 ms per
// 100 MB). So each thread keeps the blocks it used, up to kScratchBytes, and
// hands one out again once no tensor refers to it (the pool's reference is
// then the storage's only one).
namespace {

constexpr int64_t kScratchBytes = int64_t{256} << 20;

struct ScratchPool {
  std::vector<at::Tensor> blocks;  // 1-D double tensors

  static bool is_free(const at::Tensor& block) { return block.storage().use_count() == 1; }

  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& block : blocks) total += block.numel() * static_cast<int64_t>(sizeof(double));
    return total;
  }

  at::Tensor take(int64_t n) {
    at::Tensor* best = nullptr;  // the smallest free block that is large enough
    for (auto& block : blocks)
      if (is_free(block) && block.numel() >= n && (best == nullptr || block.numel() < best->numel())) best = &block;
    if (best != nullptr) return best->narrow(0, 0, n);
    at::Tensor fresh = at::empty({n}, at::TensorOptions().dtype(at::kDouble));
    const int64_t need = n * static_cast<int64_t>(sizeof(double));
    if (need > kScratchBytes) return fresh;
    // Make room by dropping free blocks; keep the new one if it then fits.
    int64_t held = bytes();
    for (auto it = blocks.begin(); it != blocks.end() && held + need > kScratchBytes;) {
      if (is_free(*it)) {
        held -= it->numel() * static_cast<int64_t>(sizeof(double));
        it = blocks.erase(it);
      } else {
        ++it;
      }
    }
    if (held + need <= kScratchBytes) blocks.push_back(fresh);
    return fresh;
  }
};

}  // namespace

at::Tensor scratch_doubles(at::IntArrayRef sizes) {
  thread_local ScratchPool pool;
  const int64_t n = c10::multiply_integers(sizes);
  if (n == 0) return at::empty(sizes, at::TensorOptions().dtype(at::kDouble));
  return pool.take(n).view(sizes);
}

// The condition under which the fp64 GEMM value of one output is exact (no
// bias): every product a_k b_k is a multiple of q = q_a q_b, so every partial
// sum of any subset of them, in any order or tree (FMA included), is a
// multiple of q of magnitude at most sum |a_k b_k|. When that is below
// 2^53 q, every partial sum is representable in double, so no addition
// rounds and the GEMM returns c itself, whatever its blocking. Then
// RN_f(approx) = RN_f(c), ties included: this decides the many outputs that
// are exact float32 ties when the inputs are bfloat16 or float16 (products
// of 16 or 22 bits). sum |a_k b_k| <= a_norm b_norm (Cauchy-Schwarz); the
// norms are fp64 computations with relative error far below 2^-40, covered
// with room by kBoundSlack squared. Products of powers of two here never
// leave double's normal range (q >= 2^-149-23 per side).
inline bool exact_gemm_value(double a_norm, double b_norm, double a_quantum53, double b_quantum) {
  return a_norm * b_norm * (kBoundSlack * kBoundSlack) < a_quantum53 * b_quantum;
}

// Tier 1 for one row, restricted to outputs whose interval lies in f's
// normal range (nearly all of them), written without branches so that the
// compiler vectorizes it. It is round_if_decided specialized to that range:
// the interval [y - beta, y + beta], pushed one ulp outwards, must not touch 0
// and both its ends must round to the same value. Everything else (zeros,
// subnormals, overflow, non-finite values, undecided intervals) is flagged
// in `pending` for the general path; returns whether any output was.
// Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time:
// integer and IEEE operations give the same bits in every version.
// The bias is a template parameter: a null test inside the loop would keep
// the compiler from vectorizing it (measured: 8x slower).
// Without a bias, an output whose GEMM value is exact (exact_gemm_value) and
// nonzero (an exact zero's sign follows the contract's rule, decided by the
// general path) is decided as RN_f(approx) when that is a normal number.
template <typename F, bool kHasBias>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) static bool round_row_normal(
    const double* approx, const double* b_norm, double a_norm, double gamma, const double* bias,
    int64_t bias_stride, const double* b_quantum, double a_quantum53, int64_t N, typename F::Bits* out,
    uint8_t* pending) {
  constexpr FloatFormat f = F::get();
  // Magnitudes as signed integers: AVX2 compares only signed 64-bit lanes.
  const int64_t normal_min = static_cast<int64_t>(normal_min_bits(f));
  const int64_t overflow = static_cast<int64_t>(overflow_bits(f));
  uint32_t any_pending = 0;
  for (int64_t j = 0; j < N; ++j) {
    const double bias_j = kHasBias ? bias[j * bias_stride] : 0.0;
    const double y = approx[j] + bias_j;
    const double beta = gamma * abs_sum_bound(a_norm, b_norm[j], bias_j);
    const uint64_t lo = double_to_bits(y - beta), hi = double_to_bits(y + beta);
    const int64_t mag_lo = static_cast<int64_t>(lo & ~kSignBit), mag_hi = static_cast<int64_t>(hi & ~kSignBit);
    const int64_t inner = (mag_lo < mag_hi ? mag_lo : mag_hi) - 1;  // one ulp towards 0
    const int64_t outer = (mag_lo < mag_hi ? mag_hi : mag_lo) + 1;  // one ulp away from 0
    const uint64_t r_inner = round_normal_bits(static_cast<uint64_t>(inner), f);
    const uint64_t r_outer = round_normal_bits(static_cast<uint64_t>(outer), f);
    const bool bounded = (((lo ^ hi) & kSignBit) == 0) & (inner >= normal_min) & (outer < overflow) &
                         (r_inner == r_outer) & (static_cast<int64_t>(r_outer) < overflow);
    const uint64_t y_bits = double_to_bits(y);
    const int64_t mag_y = static_cast<int64_t>(y_bits & ~kSignBit);
    const uint64_t r_y = round_normal_bits(static_cast<uint64_t>(mag_y), f);
    const bool exact = !kHasBias && exact_gemm_value(a_norm, b_norm[j], a_quantum53, b_quantum[j]) &
                       (mag_y >= normal_min) & (static_cast<int64_t>(r_y) < overflow);
    const bool decided = bounded | exact;
    // Both ways give the same value when both apply (RN_f(c) either way).
    const uint64_t r = bounded ? r_inner : r_y;
    const uint32_t sign = (y_bits & kSignBit) ? (1u << (f.total_bits - 1)) : 0u;
    out[j] = static_cast<typename F::Bits>(decided ? (sign | encode_normal(r, f)) : 0u);
    pending[j] = !decided;
    any_pending |= decided ? 0u : 1u;
  }
  return any_pending != 0;
}

// round_row_normal<F, false> on AVX-512, 8 outputs per step in 512-bit
// vectors with mask registers (GCC's x86-64-v4 clone used 256-bit ones).
// The same operations on the same values in the same order per output:
// y = approx + 0, beta = gamma * (a_norm * b_norm + 0), the integer
// rounding of round_normal_bits, the signed 64-bit comparisons and
// exact_gemm_value's product; so the same bits, and the same outputs left
// to the general path.
#define CARBON_ROUND_V4 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))

// round_normal_bits of 8 magnitudes, kDrop = 53 - precision.
template <int kDrop>
CARBON_ROUND_V4 static inline __m512i round_normal_bits8(__m512i mag) {
  const __m512i last_kept = _mm512_and_si512(_mm512_srli_epi64(mag, kDrop), _mm512_set1_epi64(1));
  const __m512i half_less_one = _mm512_set1_epi64(static_cast<int64_t>((1ull << (kDrop - 1)) - 1));
  const __m512i keep = _mm512_set1_epi64(static_cast<int64_t>(~((1ull << kDrop) - 1)));
  return _mm512_and_si512(_mm512_add_epi64(_mm512_add_epi64(mag, half_less_one), last_kept), keep);
}

// Outputs j.. j + 7 of the row, those in `lanes` (nothing else is read or
// written); returns the lanes left to the general path.
template <typename F>
CARBON_ROUND_V4 __attribute__((always_inline)) static inline __mmask8 round8_normal_avx512(
    const double* approx, const double* b_norm, __m512d a_norm, __m512d gamma, const double* b_quantum,
    __m512d a_quantum53, int64_t j, __mmask8 lanes, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 53 - f.precision;
  const __m512i sign_bit = _mm512_set1_epi64(static_cast<int64_t>(kSignBit));
  const __m512i normal_min = _mm512_set1_epi64(static_cast<int64_t>(normal_min_bits(f)));
  const __m512i overflow = _mm512_set1_epi64(static_cast<int64_t>(overflow_bits(f)));
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i rebias = _mm512_set1_epi64(static_cast<int64_t>(static_cast<uint64_t>(1023 - f.max_exp)
                                                                << (f.precision - 1)));
  const __m512d zero = _mm512_setzero_pd();
  const __m512d y = _mm512_add_pd(_mm512_maskz_loadu_pd(lanes, approx + j), zero);
  const __m512d prod = _mm512_mul_pd(a_norm, _mm512_maskz_loadu_pd(lanes, b_norm + j));
  const __m512d beta = _mm512_mul_pd(gamma, _mm512_add_pd(prod, zero));
  const __m512i lo = _mm512_castpd_si512(_mm512_sub_pd(y, beta)), hi = _mm512_castpd_si512(_mm512_add_pd(y, beta));
  const __m512i mag_lo = _mm512_andnot_si512(sign_bit, lo), mag_hi = _mm512_andnot_si512(sign_bit, hi);
  const __m512i inner = _mm512_sub_epi64(_mm512_min_epi64(mag_lo, mag_hi), one);
  const __m512i outer = _mm512_add_epi64(_mm512_max_epi64(mag_lo, mag_hi), one);
  const __m512i r_inner = round_normal_bits8<drop>(inner), r_outer = round_normal_bits8<drop>(outer);
  __mmask8 bounded = _mm512_testn_epi64_mask(_mm512_xor_si512(lo, hi), sign_bit);
  bounded = _mm512_mask_cmpge_epi64_mask(bounded, inner, normal_min);
  bounded = _mm512_mask_cmplt_epi64_mask(bounded, outer, overflow);
  bounded = _mm512_mask_cmpeq_epi64_mask(bounded, r_inner, r_outer);
  bounded = _mm512_mask_cmplt_epi64_mask(bounded, r_outer, overflow);
  const __m512i y_bits = _mm512_castpd_si512(y);
  __mmask8 decided = bounded;
  __m512i r = r_inner;
  // Outputs that the bound leaves may still be exact GEMM values (inputs of
  // few bits); when every lane is bounded that test cannot change anything.
  if ((bounded & lanes) != lanes) {
    const __m512i mag_y = _mm512_andnot_si512(sign_bit, y_bits);
    const __m512i r_y = round_normal_bits8<drop>(mag_y);
    const __m512d quanta = _mm512_mul_pd(a_quantum53, _mm512_maskz_loadu_pd(lanes, b_quantum + j));
    const __m512d slack2 = _mm512_set1_pd(kBoundSlack * kBoundSlack);
    __mmask8 exact = _mm512_cmp_pd_mask(_mm512_mul_pd(prod, slack2), quanta, _CMP_LT_OQ);
    exact = _mm512_mask_cmpge_epi64_mask(exact, mag_y, normal_min);
    exact = _mm512_mask_cmplt_epi64_mask(exact, r_y, overflow);
    decided = _kor_mask8(bounded, exact);
    r = _mm512_mask_blend_epi64(bounded, r_y, r_inner);
  }
  const __m512i sign = _mm512_slli_epi64(_mm512_srli_epi64(y_bits, 63), f.total_bits - 1);
  const __m512i bits = _mm512_maskz_or_epi64(decided, sign, _mm512_sub_epi64(_mm512_srli_epi64(r, drop), rebias));
  if constexpr (sizeof(typename F::Bits) == 4) {
    _mm512_mask_cvtepi64_storeu_epi32(out + j, lanes, bits);
  } else {
    _mm512_mask_cvtepi64_storeu_epi16(out + j, lanes, bits);
  }
  return _kandn_mask8(decided, lanes);
}

// Returns the number of outputs left to the general path, their indices in
// `pending`.
template <typename F>
CARBON_ROUND_V4 static int64_t round_row_normal_avx512(const double* approx, const double* b_norm, double a_norm,
                                                       double gamma, const double* b_quantum, double a_quantum53,
                                                       int64_t N, typename F::Bits* out, int32_t* pending) {
  const __m512d a_n = _mm512_set1_pd(a_norm), g = _mm512_set1_pd(gamma), a_q = _mm512_set1_pd(a_quantum53);
  int64_t count = 0;
  auto record = [&](int64_t j, unsigned left) {
    for (; left != 0; left &= left - 1) pending[count++] = static_cast<int32_t>(j + __builtin_ctz(left));
  };
  int64_t j = 0;
  for (; j + 8 <= N; j += 8) {
    const __mmask8 left = round8_normal_avx512<F>(approx, b_norm, a_n, g, b_quantum, a_q, j, 0xFF, out);
    if (left != 0) record(j, left);
  }
  if (j < N) {
    const __mmask8 lanes = static_cast<__mmask8>((1u << (N - j)) - 1);
    const __mmask8 left = round8_normal_avx512<F>(approx, b_norm, a_n, g, b_quantum, a_q, j, lanes, out);
    if (left != 0) record(j, left);
  }
  return count;
}

// round_row_normal<F, false> on AVX2, 4 outputs per step: round8_normal_avx512
// with AVX2's instructions for the missing AVX-512 ones -- the signed 64-bit
// minimum and maximum of mag_lo, mag_hi by a compare and blends, a >= b as
// not b > a, mask registers as compare results and movemasks, and the
// narrowing stores as a permute of 32-bit lanes (and an unsigned-saturating
// pack, exact for values below 2^16, for 16-bit formats). The same
// operations on the same values per output, so the same bits and the same
// outputs left to the general path. The last N mod 4 outputs go through
// round_row_normal itself.
#define CARBON_ROUND_V3 __attribute__((target("avx2,fma")))

template <int kDrop>
CARBON_ROUND_V3 __attribute__((always_inline)) static inline __m256i round_normal_bits4(__m256i mag) {
  const __m256i last_kept = _mm256_and_si256(_mm256_srli_epi64(mag, kDrop), _mm256_set1_epi64x(1));
  const __m256i half_less_one = _mm256_set1_epi64x(static_cast<int64_t>((1ull << (kDrop - 1)) - 1));
  const __m256i keep = _mm256_set1_epi64x(static_cast<int64_t>(~((1ull << kDrop) - 1)));
  return _mm256_and_si256(_mm256_add_epi64(_mm256_add_epi64(mag, half_less_one), last_kept), keep);
}

// Outputs j.. j + 3 of the row; returns the lanes left to the general path
// (bit l: output j + l).
template <typename F>
CARBON_ROUND_V3 __attribute__((always_inline)) static inline unsigned round4_normal_avx2(
    const double* approx, const double* b_norm, __m256d a_norm, __m256d gamma, const double* b_quantum,
    __m256d a_quantum53, int64_t j, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  constexpr int drop = 53 - f.precision;
  const __m256i sign_bit = _mm256_set1_epi64x(static_cast<int64_t>(kSignBit));
  const __m256i normal_min = _mm256_set1_epi64x(static_cast<int64_t>(normal_min_bits(f)));
  const __m256i overflow = _mm256_set1_epi64x(static_cast<int64_t>(overflow_bits(f)));
  const __m256i one = _mm256_set1_epi64x(1), zero_i = _mm256_setzero_si256();
  const __m256i rebias = _mm256_set1_epi64x(static_cast<int64_t>(static_cast<uint64_t>(1023 - f.max_exp)
                                                                 << (f.precision - 1)));
  const __m256d zero = _mm256_setzero_pd();
  const __m256d y = _mm256_add_pd(_mm256_loadu_pd(approx + j), zero);
  const __m256d prod = _mm256_mul_pd(a_norm, _mm256_loadu_pd(b_norm + j));
  const __m256d beta = _mm256_mul_pd(gamma, _mm256_add_pd(prod, zero));
  const __m256i lo = _mm256_castpd_si256(_mm256_sub_pd(y, beta)), hi = _mm256_castpd_si256(_mm256_add_pd(y, beta));
  const __m256i mag_lo = _mm256_andnot_si256(sign_bit, lo), mag_hi = _mm256_andnot_si256(sign_bit, hi);
  const __m256i lo_above = _mm256_cmpgt_epi64(mag_lo, mag_hi);
  const __m256i inner = _mm256_sub_epi64(_mm256_blendv_epi8(mag_lo, mag_hi, lo_above), one);
  const __m256i outer = _mm256_add_epi64(_mm256_blendv_epi8(mag_hi, mag_lo, lo_above), one);
  const __m256i r_inner = round_normal_bits4<drop>(inner), r_outer = round_normal_bits4<drop>(outer);
  // Not bounded: the ends' signs differ, or inner < normal_min; bounded
  // needs outer < overflow, r_inner == r_outer and r_outer < overflow.
  const __m256i unbounded = _mm256_or_si256(_mm256_cmpgt_epi64(zero_i, _mm256_xor_si256(lo, hi)),
                                            _mm256_cmpgt_epi64(normal_min, inner));
  const __m256i in_range = _mm256_and_si256(
      _mm256_and_si256(_mm256_cmpgt_epi64(overflow, outer), _mm256_cmpeq_epi64(r_inner, r_outer)),
      _mm256_cmpgt_epi64(overflow, r_outer));
  const __m256i bounded = _mm256_andnot_si256(unbounded, in_range);
  const __m256i y_bits = _mm256_castpd_si256(y);
  __m256i decided = bounded, r = r_inner;
  // Outputs that the bound leaves may still be exact GEMM values (inputs of
  // few bits); when every lane is bounded that test cannot change anything.
  if (_mm256_movemask_pd(_mm256_castsi256_pd(bounded)) != 0xF) {
    const __m256i mag_y = _mm256_andnot_si256(sign_bit, y_bits);
    const __m256i r_y = round_normal_bits4<drop>(mag_y);
    const __m256d quanta = _mm256_mul_pd(a_quantum53, _mm256_loadu_pd(b_quantum + j));
    const __m256d slack2 = _mm256_set1_pd(kBoundSlack * kBoundSlack);
    __m256i exact = _mm256_castpd_si256(_mm256_cmp_pd(_mm256_mul_pd(prod, slack2), quanta, _CMP_LT_OQ));
    exact = _mm256_andnot_si256(_mm256_cmpgt_epi64(normal_min, mag_y), exact);
    exact = _mm256_and_si256(exact, _mm256_cmpgt_epi64(overflow, r_y));
    decided = _mm256_or_si256(bounded, exact);
    r = _mm256_blendv_epi8(r_y, r_inner, bounded);
  }
  const __m256i sign = _mm256_slli_epi64(_mm256_srli_epi64(y_bits, 63), f.total_bits - 1);
  const __m256i bits =
      _mm256_and_si256(decided, _mm256_or_si256(sign, _mm256_sub_epi64(_mm256_srli_epi64(r, drop), rebias)));
  // The low 32 bits of the four lanes (each value < 2^32), in order.
  const __m128i bits32 =
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bits, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
  if constexpr (sizeof(typename F::Bits) == 4) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), bits32);
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), _mm_packus_epi32(bits32, bits32));
  }
  return static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(decided))) ^ 0xFu;
}

// Returns the number of outputs left to the general path, their indices in
// `pending`; flags: scratch of N bytes (the tail's).
template <typename F>
CARBON_ROUND_V3 static int64_t round_row_normal_avx2(const double* approx, const double* b_norm, double a_norm,
                                                     double gamma, const double* b_quantum, double a_quantum53,
                                                     int64_t N, typename F::Bits* out, int32_t* pending,
                                                     uint8_t* flags) {
  const __m256d a_n = _mm256_set1_pd(a_norm), g = _mm256_set1_pd(gamma), a_q = _mm256_set1_pd(a_quantum53);
  int64_t count = 0;
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) {
    unsigned left = round4_normal_avx2<F>(approx, b_norm, a_n, g, b_quantum, a_q, j, out);
    for (; left != 0; left &= left - 1) pending[count++] = static_cast<int32_t>(j + __builtin_ctz(left));
  }
  if (j < N && round_row_normal<F, false>(approx + j, b_norm + j, a_norm, gamma, nullptr, 0, b_quantum + j,
                                          a_quantum53, N - j, out + j, flags))
    for (int64_t t = 0; t < N - j; ++t)
      if (flags[t]) pending[count++] = static_cast<int32_t>(j + t);
  return count;
}

// Tier 1's fast path for one row without a bias: the outputs it decides are
// written; returns how many it left, their indices in `pending` (N of
// them at most); flags: scratch of N bytes.
template <typename F>
static int64_t round_row_normal_no_bias(const double* approx, const double* b_norm, double a_norm, double gamma,
                                        const double* b_quantum, double a_quantum53, int64_t N, typename F::Bits* out,
                                        int32_t* pending, uint8_t* flags) {
  if (has_avx512_bw())
    return round_row_normal_avx512<F>(approx, b_norm, a_norm, gamma, b_quantum, a_quantum53, N, out, pending);
  if (has_avx2())
    return round_row_normal_avx2<F>(approx, b_norm, a_norm, gamma, b_quantum, a_quantum53, N, out, pending, flags);
  int64_t count = 0;
  if (round_row_normal<F, false>(approx, b_norm, a_norm, gamma, nullptr, 0, b_quantum, a_quantum53, N, out, flags))
    for (int64_t j = 0; j < N; ++j)
      if (flags[j]) pending[count++] = static_cast<int32_t>(j);
  return count;
}

// The exact sum when row i of a or column j of b is all zeros (norm 0) and
// the other is finite, without a bias: every product is a signed zero, of
// sign bit a_k's XOR b_k's, so the sum is -0 exactly when there is a product
// and every one is -0 (the exact accumulator's rule: exact_zero). Tier 1
// decides such outputs from the sign summaries unless both the row and the
// column hold both signs; this answers those without the exact tiers' two
// passes (causal attention: row 0 of the scores' gradient is such a row of
// zeros of both signs, one per head, and so is every output of its row of
// q's gradient). Returns false when it does not apply.
static bool zero_products_sum(const MatmulView& v, int64_t b, int64_t i, int64_t j, double* out) {
  if (v.bias != nullptr) return false;
  const double na = v.a_norm[b * v.M + i], nb = v.b_norm[b * v.N + j];
  if (!(std::isfinite(na) && std::isfinite(nb) && (na == 0.0 || nb == 0.0))) return false;
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  uint64_t all_negative = v.K > 0 ? 1 : 0;
  for (int64_t k = 0; k < v.K; ++k) all_negative &= (double_to_bits(a[k]) ^ double_to_bits(bt[k])) >> 63;
  *out = all_negative ? -0.0 : 0.0;
  return true;
}

// Tiers 2 and 3 for one output (matmul_round_exact): tier 2 in 16 lanes on
// AVX-512 or AVX2 (compensated_dot_avx512.h, compensated_dot_avx2.h: the
// scalar chain's ~16 cycles per term dominated products with a long inner
// dimension), with the bound for that summation tree's depth; the same
// RN_f(c) either way.
static double matmul_round_exact_cpu(const MatmulView& v, int64_t b, int64_t i, int64_t j, const FloatFormat& f) {
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  if (has_avx512())
    return matmul_round_compensated(v, b, i, j, compensated_dot_avx512(a, bt, v.K), compensated_dot_depth(v.K), f);
  if (has_avx2())
    return matmul_round_compensated(v, b, i, j, compensated_dot_avx2(a, bt, v.K), compensated_dot_depth(v.K), f);
  return matmul_round_exact(v, b, i, j, f);
}

// Rows [begin, end) of the B * M output rows, on this thread. lower_only:
// row i rounds its outputs j <= i and sets the others to +0.
template <typename F>
static void round_rows(const MatmulView& v, typename F::Bits* out, bool lower_only, int64_t begin, int64_t end) {
  constexpr FloatFormat f = F::get();
  std::vector<uint8_t> flags(v.N);
  std::vector<int32_t> pending(v.N);  // indices of the outputs tier 1's fast path left
  for (int64_t row = begin; row < end; ++row) {
    const int64_t b = row / v.M, i = row % v.M;
    const int64_t N = lower_only ? std::min(v.N, i + 1) : v.N;
    if (N < v.N) std::fill(out + row * v.N + N, out + (row + 1) * v.N, typename F::Bits{0});
    const double* bias = v.bias ? v.bias + b * v.bias_stride_b + i * v.bias_stride_m : nullptr;
    int64_t count = 0;
    if (bias) {
      if (round_row_normal<F, true>(v.approx + row * v.N, v.b_norm + b * v.N, v.a_norm[row], v.gemm_gamma, bias,
                                    v.bias_stride_n, v.b_quantum + b * v.N, v.a_quantum53[row], N, out + row * v.N,
                                    flags.data()))
        for (int64_t j = 0; j < N; ++j)
          if (flags[j]) pending[count++] = static_cast<int32_t>(j);
    } else {
      count = round_row_normal_no_bias<F>(v.approx + row * v.N, v.b_norm + b * v.N, v.a_norm[row], v.gemm_gamma,
                                          v.b_quantum + b * v.N, v.a_quantum53[row], N, out + row * v.N,
                                          pending.data(), flags.data());
    }
    for (int64_t t = 0; t < count; ++t) {
      const int64_t j = pending[t];
      double r;
      if (!matmul_round_fast(v, b, i, j, f, &r) && !zero_products_sum(v, b, i, j, &r))
        r = matmul_round_exact_cpu(v, b, i, j, f);
      out[row * v.N + j] = static_cast<typename F::Bits>(encode(r, f));
    }
  }
}

template <typename F>
static void round_all(const MatmulView& v, typename F::Bits* out, bool lower_only) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(v.N, 1));
  carbon::parallel_for(0, v.B * v.M, grain,
                   [&](int64_t begin, int64_t end) { round_rows<F>(v, out, lower_only, begin, end); });
}

void matmul_round_rows_cpu(const MatmulView& v, FormatId format, at::Tensor& out, bool lower_only) {
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    round_all<F>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()), lower_only);
  });
}

void matmul_round_row_range_cpu(const MatmulView& v, FormatId format, at::Tensor& out, bool lower_only,
                                int64_t begin, int64_t end) {
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    round_rows<F>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()), lower_only, begin, end);
  });
}

void matmul_round_cpu(const MatmulView& v, FormatId format, at::Tensor& out) {
  matmul_round_rows_cpu(v, format, out, false);
}

}  // namespace carbon
