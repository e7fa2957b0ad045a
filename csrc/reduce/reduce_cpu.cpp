// CPU kernels of the exact reductions. Each output is computed the same way
// whatever the thread count: the summation trees below depend only on the
// sizes, and every tree's error bound is used as such.
//   * many rows: rows split over threads, each row summed in eight chains;
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

#include "../dtypes.h"
#include "chain_tree.h"
#include "reduce.h"
#include "reduce_kernel.h"

namespace carbon {
namespace {

struct Sums {
  double sum = 0.0, abs_sum = 0.0;
};

// Tier 1's fp64 sums of x[0, n) in kChains interleaved chains (one or two
// SIMD registers of doubles): no value passes through more than
// chain_depth(n) additions (chain_tree.h).
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
  return {fold_chains(s), fold_chains(a)};
}

// ---------------------------------------------------------------- AVX-512 forms

// GCC 12 reports _mm512_cvtps_pd's internal _mm512_undefined_pd() as
// "may be used uninitialized" (a false positive in avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same chains as chain_sums_portable, one per lane of a vector of 8
// doubles (lane l adds elements l, l + 8, ... in order; the tail goes into
// chain 0 afterwards; then fold_chains), so the same fp64 sums. Written
// with intrinsics because GCC widened bfloat16 element by element (and an
// 8-lane form in the AVX2 clone split every vector in two).
#define CARBON_REDUCE_V4 __attribute__((target("arch=x86-64-v4")))

// element_value of 8 consecutive elements: exact widenings (the hardware's
// are exact in the default MXCSR state, which the callers check).
CARBON_REDUCE_V4 inline __m512d widen8(const double* p) { return _mm512_loadu_pd(p); }
CARBON_REDUCE_V4 inline __m512d widen8(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
CARBON_REDUCE_V4 inline __m512d widen8(const c10::BFloat16* p) {  // the top halves of float32s
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
}
CARBON_REDUCE_V4 inline __m512d widen8(const c10::Half* p) {
  return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The scalar tail and the fold, from the lanes' sums (AVX-512 code: a
// vector argument would be passed differently to a function compiled
// without it).
template <typename T>
CARBON_REDUCE_V4 inline Sums finish_chains(__m512d s, __m512d a, const T* x, int64_t k, int64_t n) {
  double sc[kChains], ac[kChains];
  _mm512_storeu_pd(sc, s);
  _mm512_storeu_pd(ac, a);
  for (; k < n; ++k) {
    const double v = element_value(x[k]);
    sc[0] = sc[0] + v;
    ac[0] = ac[0] + abs_value(v);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

template <typename T>
CARBON_REDUCE_V4 Sums chain_sums_v4(const T* x, int64_t n) {
  __m512d s = _mm512_setzero_pd(), a = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const __m512d v = widen8(x + k);
    s = _mm512_add_pd(s, v);
    a = _mm512_add_pd(a, _mm512_abs_pd(v));
  }
  return finish_chains(s, a, x, k, n);
}

// AVX-512 present, and this thread's MXCSR the default (round to
// nearest-even, no flush-to-zero / denormals-are-zero, exceptions masked),
// in which the widenings above are exact. CARBON_NORM_SCALAR=1 forces the
// portable forms (to check that both give the same bits).
bool use_v4() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          std::getenv("CARBON_NORM_SCALAR") == nullptr;
  return yes && (_mm_getcsr() & 0xFFC0u) == 0x1F80u;
}

#pragma GCC diagnostic pop

template <typename T>
Sums chain_sums(const T* x, int64_t n) {
  return use_v4() ? chain_sums_v4(x, n) : chain_sums_portable(x, n);
}

template <typename F>
void store(double value, typename F::Bits* out) {
  *out = static_cast<typename F::Bits>(encode(value, F::get()));
}

// ---------------------------------------------------------------- rows

template <typename T, typename F>
void reduce_many_rows(const T* x, int64_t rows, int64_t n, bool mean, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  auto finish = [&](int64_t r, const Sums& t1) {
    const T* row = x + r * n;
    double value;
    if (n == 0) {
      value = empty_reduction(mean);
    } else if (!reduce_round_fast(t1.sum, t1.abs_sum, n, chain_depth(n), mean, f, &value)) {
      value = reduce_exact(row, n, 1, t1.abs_sum, mean, f);
    }
    store<F>(value, out + r);
  };
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    const bool v4 = use_v4();
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * n;
      finish(r, v4 ? chain_sums_v4(row, n) : chain_sums_portable(row, n));
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
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Sums s = chain_sums(row + c * kChunk, chunk_len(c));
      sums[c] = s.sum;
      abs_sums[c] = s.abs_sum;
    }
  });
  const double sum = chain_sums(sums.data(), chunks).sum;
  const double abs_sum = chain_sums(abs_sums.data(), chunks).sum;
  double value;
  if (reduce_round_fast(sum, abs_sum, n, chain_depth(kChunk) + chain_depth(chunks), mean, f, &value))
    return value;

  std::vector<CompensatedSum> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t k = 0; k < chunk_len(c); ++k) compensated_add(parts[c], element_value(row[c * kChunk + k]));
  });
  CompensatedSum acc;
  for (const CompensatedSum& part : parts) acc = compensated_merge(acc, part);
  if (reduce_round_compensated(acc, abs_sum * kBoundSlack, n, n + chunks + 2, mean, f, &value)) return value;

  std::vector<std::array<int64_t, kLimbs>> limbs(chunks);
  std::vector<uint32_t> flags(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
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
  at::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t c = tile / blocks, j0 = (tile % blocks) * kColumnBlock;
      const int64_t rows = std::min(kRowChunk, n - c * kRowChunk), width = std::min(kColumnBlock, cols - j0);
      column_chunk_sums(x + c * kRowChunk * cols + j0, std::max<int64_t>(rows, 0), cols, width,
                        sums.data() + c * cols + j0, abs_sums.data() + c * cols + j0);
    }
  });
  at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
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
