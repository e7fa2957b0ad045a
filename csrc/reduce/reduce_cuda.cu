// CUDA kernels of the exact reductions: one warp per row. The lanes split the
// row for every tier; tier 1 and 2 partials merge in any tree (their bounds
// hold for any order), tier 3's accumulators merge as integers (exact).
// Nothing here synchronizes with the host.
//
// Known limit: a single very long row (a full reduction) runs on one warp.
// Splitting it across blocks needs a second pass for the decision; to do.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "reduce.h"
#include "reduce_kernel.h"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T, typename F>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    reduce_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, bool mean, typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  __shared__ WarpLimbs limbs[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  // Warp-uniform loop: every lane of a warp works on the same row.
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = x + r * n;
    double value = 0.0;
    if (n == 0) {
      value = empty_reduction(mean);
    } else {
      double s = 0.0, a = 0.0;
      for (int64_t k = lane; k < n; k += kWarpSize) {
        const double v = element_value(row[k]);
        s = s + v;
        a = a + abs_value(v);
      }
      s = warp_sum(s);
      a = warp_sum(a);
      // Depth: n/32 sequential additions per lane, then 5 butterfly levels.
      if (!reduce_round_fast(s, a, n, (n + kWarpSize - 1) / kWarpSize + 6, mean, f, &value)) {
        CompensatedSum acc;
        for (int64_t k = lane; k < n; k += kWarpSize) compensated_add(acc, element_value(row[k]));
        acc = warp_merge(acc);
        if (!reduce_round_compensated(acc, a * kBoundSlack, n, warp_compensated_depth(n), mean, f, &value)) {
          int64_t* mine = limbs[warp][lane];
          uint32_t flags;
          exact_sum_clear(mine, flags);
          for (int64_t k = lane; k < n; k += kWarpSize) exact_sum_add(mine, flags, element_value(row[k]));
          flags = warp_merge_limbs(limbs[warp], flags);
          if (lane == 0) value = reduce_round_exact_sum(limbs[warp][0], flags, n, mean, f);
          value = warp_broadcast_from_lane0(value);
        }
      }
    }
    if (lane == 0) out[r] = static_cast<typename F::Bits>(encode(value, f));
  }
}

}  // namespace

void reduce_rows_cuda(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const int threads = kWarpSize * kWarpsPerBlock;
  const int blocks = blocks_for(rows * kWarpSize, threads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      reduce_rows_kernel<T, F><<<blocks, threads, 0, stream>>>(
          x.const_data_ptr<T>(), rows, n, mean, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
