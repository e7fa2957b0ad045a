// cumsum_rows on CUDA. Short rows: one thread per row runs the row
// (cumsum_kernel.h). Long rows are cut into chunks of kChunk elements, so
// that no thread walks a whole row:
//   1. a thread per (row, chunk) adds its chunk in fp64 (sum and absolute sum);
//   2. a warp per row turns those into each chunk's exclusive prefix (each
//      lane adds a run of chunks, a 5-level shuffle scan joins the lanes, each
//      lane walks its run again), in place;
//   3. a thread per (row, chunk) continues from its chunk's prefix with
//      cumsum_span: the running sum, the monotone test at the depth of the
//      tree so far, and the exact accumulator for an undecided prefix.
// Every decided prefix is RN_F(exact prefix sum), so neither the chunking nor
// the grid shows in the bits. No host synchronization.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "cumsum.h"
#include "cumsum_kernel.h"

namespace carbon {
namespace {

constexpr int kRowThreads = 128;
constexpr int64_t kChunk = 64;
constexpr int64_t kChunkedAbove = 4 * kChunk;  // shorter rows: a thread per row
constexpr int kScanWarps = 4;

template <typename T, typename F>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                   typename F::Bits* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
    cumsum_row<T, F>(x + r * n, n, out + r * n);
}

// Pass 1: sums[r, c] and abs_sums[r, c] of chunk c of row r, added in order
// from 0 (no element passes through more than kChunk additions).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    chunk_sums_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t chunks, double* __restrict__ sums,
                      double* __restrict__ abs_sums) {
  const int64_t total = rows * chunks;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / chunks, begin = (e % chunks) * kChunk;
    const T* row = x + r * n;
    const int64_t end = min(n, begin + kChunk);
    double s = 0.0, a = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const double v = element_value(row[i]);
      s = s + v;
      a = a + abs_value(v);
    }
    sums[e] = s;
    abs_sums[e] = a;
  }
}

// The lanes' inclusive prefix of v (Hillis-Steele: a value passes through at
// most 5 additions).
__device__ double warp_inclusive_scan(double v) {
  const int lane = lane_id();
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const double other = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = v + other;
  }
  return v;
}

// Pass 2: a warp per row replaces each chunk's sums by the sums of the chunks
// before it (exclusive prefix). Lane l owns chunks [l m, l m + m).
__global__ void __launch_bounds__(kWarpSize* kScanWarps)
    chunk_prefixes_kernel(int64_t rows, int64_t chunks, double* __restrict__ sums, double* __restrict__ abs_sums) {
  const int lane = lane_id();
  const int64_t per_lane = (chunks + kWarpSize - 1) / kWarpSize;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kScanWarps + threadIdx.x / kWarpSize; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kScanWarps) {
    double* s_row = sums + r * chunks;
    double* a_row = abs_sums + r * chunks;
    const int64_t begin = min(chunks, lane * per_lane), end = min(chunks, begin + per_lane);
    double s = 0.0, a = 0.0;
    for (int64_t c = begin; c < end; ++c) {
      s = s + s_row[c];
      a = a + a_row[c];
    }
    const double s_incl = warp_inclusive_scan(s), a_incl = warp_inclusive_scan(a);
    s = __shfl_up_sync(0xffffffffu, s_incl, 1);
    a = __shfl_up_sync(0xffffffffu, a_incl, 1);
    if (lane == 0) s = a = 0.0;
    for (int64_t c = begin; c < end; ++c) {
      const double chunk_s = s_row[c], chunk_a = a_row[c];
      s_row[c] = s;
      a_row[c] = a;
      s = s + chunk_s;
      a = a + chunk_a;
    }
  }
}

// The depth of pass 2's prefixes: an element of an earlier chunk passes
// through at most kChunk additions in its chunk (pass 1), per_lane in its
// lane's run, 5 in the scan and per_lane in the walk (or, within one lane's
// run, kChunk + per_lane).
int64_t prefix_depth(int64_t chunks) { return kChunk + 2 * ((chunks + kWarpSize - 1) / kWarpSize) + 5; }

// Pass 3: chunk c of row r from its prefix.
template <typename T, typename F>
__global__ void __launch_bounds__(kRowThreads)
    chunk_cumsum_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t chunks,
                        const double* __restrict__ sums, const double* __restrict__ abs_sums, int64_t depth,
                        typename F::Bits* __restrict__ out) {
  const int64_t total = rows * chunks;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / chunks, c = e % chunks, begin = c * kChunk;
    cumsum_span<T, F>(x + r * n, begin, min(n, begin + kChunk), sums[e], abs_sums[e], c == 0 ? 0 : depth,
                      out + r * n);
  }
}

}  // namespace

void cumsum_rows_cuda(const at::Tensor& x, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const auto stream = current_stream();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* bits = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      if (n <= kChunkedAbove) {
        cumsum_rows_kernel<T, F><<<blocks_for(rows, kRowThreads), kRowThreads, 0, stream>>>(
            x.const_data_ptr<T>(), rows, n, bits);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return;
      }
      const int64_t chunks = (n + kChunk - 1) / kChunk;
      const at::Tensor partials = at::empty({2, rows, chunks}, x.options().dtype(at::kDouble));
      double* sums = partials.mutable_data_ptr<double>();
      double* abs_sums = sums + rows * chunks;
      const int chunk_blocks = blocks_for(rows * chunks, kRowThreads);
      chunk_sums_kernel<T><<<chunk_blocks, kRowThreads, 0, stream>>>(x.const_data_ptr<T>(), rows, n, chunks, sums,
                                                                     abs_sums);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      chunk_prefixes_kernel<<<blocks_for(rows * kWarpSize, kWarpSize * kScanWarps), kWarpSize * kScanWarps, 0,
                              stream>>>(rows, chunks, sums, abs_sums);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      chunk_cumsum_kernel<T, F><<<chunk_blocks, kRowThreads, 0, stream>>>(
          x.const_data_ptr<T>(), rows, n, chunks, sums, abs_sums, prefix_depth(chunks), bits);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace carbon
