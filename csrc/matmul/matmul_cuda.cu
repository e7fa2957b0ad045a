// CUDA kernels of the correctly rounded matmul. The per-output arithmetic is
// the shared code in matmul_kernel.h / csrc/exact; this file only decides how
// it is spread over threads. Nothing here synchronizes with the host, so the
// ops work inside CUDA graph capture.
//
// Rounding kernel: one thread per output runs tier 1. Outputs it cannot
// decide are then taken one at a time by their whole warp (warp-uniform
// loop over a ballot mask): the 32 lanes split K for the compensated tier and,
// if needed, for the exact accumulator, each lane with private limbs that are
// summed as integers at the end (order-free, so exact; warp_exact.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../exact/warp_exact.cuh"
#include "matmul.h"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;

__global__ void row_stats_kernel(const double* __restrict__ x, int64_t R, int64_t K,
                                 double* __restrict__ norm, uint8_t* __restrict__ signs) {
  const int lane = lane_id();
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t r = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; r < R; r += warps) {
    double sum_squares = 0.0;
    uint8_t s = 0;
    for (int64_t k = lane; k < K; k += kWarpSize) {
      const double value = x[r * K + k];
      sum_squares = sum_squares + value * value;
      s |= row_signs_of(value);
    }
    sum_squares = warp_sum(sum_squares);
    const uint32_t s32 = warp_or(s);
    if (lane == 0) {
      norm[r] = sqrt(sum_squares);
      signs[r] = static_cast<uint8_t>(s32);
    }
  }
}

// Tiers 2 and 3 for output (b, i, j), computed by the whole warp. Every lane
// returns the same value.
__device__ double round_exact_warp(const MatmulView& v, int64_t b, int64_t i, int64_t j, const FloatFormat& f) {
  const int lane = lane_id();
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  const bool has_bias = v.bias != nullptr;
  const double bias = has_bias ? bias_at(v, b, i, j) : 0.0;

  CompensatedSum acc;
  for (int64_t k = lane; k < v.K; k += kWarpSize) compensated_add(acc, a[k] * bt[k]);
  if (has_bias && lane == 0) compensated_add(acc, bias);
  acc = warp_merge(acc);
  const double value = acc.s + acc.t;
  const double abs_sum = abs_sum_bound(v.a_norm[b * v.M + i], v.b_norm[b * v.N + j], bias);
  double out = 0.0;
  if (round_if_decided(value, compensated_bound(value, abs_sum, warp_compensated_depth(v.K + 1)), f, &out))
    return out;

  int64_t storage[kLimbs];
  int64_t* limb = lane_limbs(storage);
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = lane; k < v.K; k += kWarpSize) exact_sum_add_product(limb, flags, a[k], bt[k]);
  if (has_bias && lane == 0) exact_sum_add(limb, flags, bias);
  flags = warp_merge_limbs(limb, flags);
  return exact_sum_round(limb, flags, f);
}

template <typename F>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    matmul_round_kernel(MatmulView v, typename F::Bits* __restrict__ out) {
  using Bits = typename F::Bits;
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t total = v.B * v.M * v.N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // The loop bound is warp-uniform (base is a multiple of 32), so whole warps
  // enter the cooperative exact path together.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + warp * kWarpSize; base < total;
       base += stride) {
    const int64_t idx = base + lane;
    const bool valid = idx < total;
    int64_t b = 0, i = 0, j = 0;
    bool pending = false;
    if (valid) {
      j = idx % v.N;
      i = (idx / v.N) % v.M;
      b = idx / (v.N * v.M);
      double r;
      if (matmul_round_fast(v, b, i, j, f, &r))
        out[idx] = static_cast<Bits>(encode(r, f));
      else
        pending = true;
    }
    unsigned todo = __ballot_sync(kFullWarp, pending);
    while (todo) {
      const int src = __ffs(todo) - 1;
      todo &= todo - 1;
      const int64_t pb = __shfl_sync(kFullWarp, b, src);
      const int64_t pi = __shfl_sync(kFullWarp, i, src);
      const int64_t pj = __shfl_sync(kFullWarp, j, src);
      const double r = round_exact_warp(v, pb, pi, pj, f);
      if (lane == src) out[idx] = static_cast<Bits>(encode(r, f));
    }
  }
}

}  // namespace

void row_stats_cuda(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t R = rows.size(0), K = rows.size(1);
  if (R == 0) return;
  const int threads = kWarpSize * kWarpsPerBlock;
  row_stats_kernel<<<blocks_for(R * kWarpSize, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      rows.const_data_ptr<double>(), R, K, norms.mutable_data_ptr<double>(),
      signs.mutable_data_ptr<uint8_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void matmul_round_cuda(const MatmulView& v, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int threads = kWarpSize * kWarpsPerBlock;
  const int blocks = blocks_for(v.B * v.M * v.N, threads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    matmul_round_kernel<F><<<blocks, threads, 0, stream>>>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
