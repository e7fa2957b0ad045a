// CUDA kernel of var_mean: one warp per row. Tier 1 sums per lane, then the
// warp's butterfly (its depth bound covers any order); undecided statistics
// take the exact accumulator, one per lane, merged as integers. The decisions
// are variance_kernel.h's / norm_kernel.h's, so the bits equal the CPU's.
// No host synchronization.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "variance.h"
#include "variance_kernel.h"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T>
__device__ void warp_var_mean_row(const T* row, int64_t n, int64_t divisor, uint32_t* var_out, uint32_t* mean_out) {
  const int lane = lane_id();
  double var, mean;
  if (n == 0) {
    var = mean = canonical_nan();
  } else {
    double s = 0.0, a = 0.0;
    uint32_t flags = 0;
    for (int64_t k = lane; k < n; k += kWarpSize) {
      const double v = element_value(row[k]);
      flags |= nonfinite_flags(v);
      s = s + v;
      a = a + abs_value(v);
    }
    flags = warp_or(flags);
    s = warp_sum(s);
    a = warp_sum(a);
    const int64_t depth = (n + kWarpSize - 1) / kWarpSize + 6;
    if (flags) {
      nonfinite_var_mean(flags, &var, &mean);
    } else {
      if (!mean_fast(s, a, n, depth, &mean)) {
        int64_t storage[kLimbs];
        int64_t* limb = lane_limbs(storage);
        uint32_t exact_flags;
        exact_sum_clear(limb, exact_flags);
        for (int64_t k = lane; k < n; k += kWarpSize) exact_sum_add(limb, exact_flags, element_value(row[k]));
        exact_flags = warp_merge_limbs(limb, exact_flags);
        mean = exact_mean_round(limb, exact_flags, n);
      }
      double q = 0.0;
      for (int64_t k = lane; k < n; k += kWarpSize) {
        const double d = element_value(row[k]) - mean;
        q = q + d * d;
      }
      q = warp_sum(q);
      if (divisor == 0) {
        var = var_without_divisor(q);
      } else if (!mean_of_squares_fast(q, divisor, depth, 3, &var)) {
        int64_t storage[kLimbs];
        int64_t* limb = lane_limbs(storage);
        uint32_t exact_flags;
        exact_sum_clear(limb, exact_flags);
        for (int64_t k = lane; k < n; k += kWarpSize) add_centered_square(limb, exact_flags, element_value(row[k]), mean);
        exact_flags = warp_merge_limbs(limb, exact_flags);
        var = exact_mean_round(limb, exact_flags, divisor);
      }
    }
  }
  // Written as bits (float32 values already, so encode is exact): a hardware
  // double -> float conversion may give a NaN other than Carbon's one
  // 0x7FC00000, which the CPU's conversion of canonical_nan() writes.
  if (lane == 0) {
    *var_out = encode(var, F32::get());
    *mean_out = encode(mean, F32::get());
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    var_mean_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t divisor, uint32_t* __restrict__ var,
                    uint32_t* __restrict__ mean) {
  const int warp = threadIdx.x / kWarpSize;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock)
    warp_var_mean_row(x + r * n, n, divisor, var + r, mean + r);
}

}  // namespace

void var_mean_rows_cuda(const at::Tensor& x, int64_t divisor, at::Tensor& var, at::Tensor& mean) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const int threads = kWarpSize * kWarpsPerBlock;
  const int blocks = blocks_for(rows * kWarpSize, threads);
  const auto stream = current_stream();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    var_mean_kernel<T><<<blocks, threads, 0, stream>>>(x.const_data_ptr<T>(), rows, n, divisor,
                                                       static_cast<uint32_t*>(var.mutable_data_ptr()),
                                                       static_cast<uint32_t*>(mean.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
