// CUDA kernels of the exact reductions. Each row is finished by one warp:
// its lanes split the row for every tier; tier 1 and 2 partials merge in any
// tree (their bounds hold for any order, given the tree's depth), tier 3's
// accumulators merge as integers (exact). Nothing here synchronizes with the
// host, and no result depends on the grid.
//
// Many rows: one kernel, a warp per row computes all tiers.
// Few long rows: tier 1's fp64 sums are first computed by many blocks per
// row (fixed chunks of kChunk elements), then a warp per row adds the chunk
// partials and decides; the rare undecided row runs tiers 2 and 3 on its warp.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "column_sums.cuh"
#include "reduce.h"
#include "reduce_kernel.h"
#include "warp_tiers.cuh"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kChunkThreads = 256;
constexpr int64_t kChunk = 16 * 1024;  // elements per block in the split tier 1
constexpr int64_t kSplitRowsAbove = 64 * 1024;

struct Tier1 {
  double sum, abs_sum;
  int64_t depth;  // no element passes through more additions than this
};

// Tier 1 for one row on one warp: n/32 sequential additions per lane, then
// the 5 butterfly levels.
template <typename T>
__device__ Tier1 warp_tier1(const T* row, int64_t n) {
  double s = 0.0, a = 0.0;
  for (int64_t k = lane_id(); k < n; k += kWarpSize) {
    const double v = element_value(row[k]);
    s = s + v;
    a = a + abs_value(v);
  }
  return {warp_sum(s), warp_sum(a), (n + kWarpSize - 1) / kWarpSize + 6};
}

// Finishes one row on the whole warp from its tier-1 sums; every lane
// returns the same value.
template <typename T>
__device__ double warp_finish_row(const T* row, int64_t n, const Tier1& t1, bool mean, const FloatFormat& f) {
  const int lane = lane_id();
  double value = 0.0;
  if (n == 0) return empty_reduction(mean);
  if (reduce_round_fast(t1.sum, t1.abs_sum, n, t1.depth, mean, f, &value)) return value;
  if (t1.abs_sum == 0.0) {
    // Every element is ±0 (a nonzero |x| keeps the fp64 sum of magnitudes positive): the sum and the mean are an
    // exact zero, -0 iff every element is -0 (exact_zero's rule, as the CPU's tiers give), in one pass of the
    // whole warp instead of tiers 2 and 3 on it.
    bool not_negative_zero = false;
    for (int64_t k = lane; k < n; k += kWarpSize) not_negative_zero |= double_to_bits(element_value(row[k])) != kSignBit;
    return exact_zero(kSawTerm | (__any_sync(0xffffffffu, not_negative_zero) ? kSawNonNegZero : 0u));
  }
  return warp_round_exact_terms(
      n, [&](int64_t k) { return element_value(row[k]); }, t1.abs_sum, mean, f);
}

template <typename T, typename F>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    reduce_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, bool mean, typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize;
  // Warp-uniform loop: every lane of a warp works on the same row.
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = x + r * n;
    const double value = warp_finish_row(row, n, warp_tier1(row, n), mean, f);
    if (lane_id() == 0) out[r] = static_cast<typename F::Bits>(encode(value, f));
  }
}

// Split tier 1, pass 1: block (c, r) writes the fp64 sum and absolute sum of
// chunk c of row r. Depth within a chunk: kChunk / kChunkThreads sequential
// additions per thread, 5 butterfly levels, then the warps' partials added
// in order by thread 0.
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    chunk_sums_kernel(const T* __restrict__ x, int64_t n, int64_t chunks, double* __restrict__ sums,
                      double* __restrict__ abs_sums) {
  __shared__ double warp_s[kChunkThreads / kWarpSize], warp_a[kChunkThreads / kWarpSize];
  const int64_t c = blockIdx.x, r = blockIdx.y;
  const T* chunk = x + r * n + c * kChunk;
  const int64_t len = min(kChunk, n - c * kChunk);
  double s = 0.0, a = 0.0;
  for (int64_t k = threadIdx.x; k < len; k += kChunkThreads) {
    const double v = element_value(chunk[k]);
    s = s + v;
    a = a + abs_value(v);
  }
  s = warp_sum(s);
  a = warp_sum(a);
  if (lane_id() == 0) {
    warp_s[threadIdx.x / kWarpSize] = s;
    warp_a[threadIdx.x / kWarpSize] = a;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double ts = 0.0, ta = 0.0;
    for (int w = 0; w < kChunkThreads / kWarpSize; ++w) {
      ts = ts + warp_s[w];
      ta = ta + warp_a[w];
    }
    sums[r * chunks + c] = ts;
    abs_sums[r * chunks + c] = ta;
  }
}

// The elements of a contiguous [n, cols] tensor as column terms.
template <typename T>
struct ElementTerms {
  static constexpr int kQ = 1;
  const T* x;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, double (&t)[kQ]) const { t[0] = element_value(x[r * cols + c]); }
};

constexpr int64_t kChunkDepth = kChunk / kChunkThreads + 5 + kChunkThreads / kWarpSize;

// Split tier 1, pass 2: a warp per row adds the chunk partials (one more
// warp_tier1 over them) and finishes the row.
template <typename T, typename F>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    finish_split_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t chunks,
                             const double* __restrict__ sums, const double* __restrict__ abs_sums, bool mean,
                             typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const Tier1 s = warp_tier1(sums + r * chunks, chunks);
    const Tier1 a = warp_tier1(abs_sums + r * chunks, chunks);
    const Tier1 t1{s.sum, a.sum, kChunkDepth + s.depth};
    const double value = warp_finish_row(x + r * n, n, t1, mean, f);
    if (lane_id() == 0) out[r] = static_cast<typename F::Bits>(encode(value, f));
  }
}

}  // namespace

void reduce_rows_cuda(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const int threads = kWarpSize * kWarpsPerBlock;
  const int blocks = blocks_for(rows * kWarpSize, threads);
  const auto stream = current_stream();
  const int64_t sms = current_sm_count();
  const bool split = n > kSplitRowsAbove && rows < sms * kWarpsPerBlock && rows <= 65535;
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* bits = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      if (!split) {
        reduce_rows_kernel<T, F><<<blocks, threads, 0, stream>>>(x.const_data_ptr<T>(), rows, n, mean, bits);
        return;
      }
      const int64_t chunks = (n + kChunk - 1) / kChunk;
      const at::Tensor partials = at::empty({2, rows, chunks}, x.options().dtype(at::kDouble));
      double* sums = partials.mutable_data_ptr<double>();
      double* abs_sums = sums + rows * chunks;
      chunk_sums_kernel<T><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), kChunkThreads, 0, stream>>>(
          x.const_data_ptr<T>(), n, chunks, sums, abs_sums);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      finish_split_rows_kernel<T, F><<<blocks, threads, 0, stream>>>(x.const_data_ptr<T>(), rows, n, chunks, sums,
                                                                     abs_sums, mean, bits);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void reduce_columns_cuda(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(0), cols = x.size(1);
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      column_sums_cuda<F>(ElementTerms<T>{x.const_data_ptr<T>(), cols}, n, cols, mean,
                          {static_cast<typename F::Bits*>(out.mutable_data_ptr())}, x.options());
    });
  });
}

}  // namespace carbon
