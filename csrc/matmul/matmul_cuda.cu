// CUDA kernels of the correctly rounded matmul. The per-output arithmetic is
// the shared code in matmul_kernel.h / csrc/exact; this file only decides how
// it is spread over threads. Nothing here synchronizes with the host, so the
// ops work inside CUDA graph capture.
//
// Rounding kernel: one thread per output runs tier 1. Outputs it cannot
// decide are then taken one at a time by their whole warp (warp-uniform
// loop over a ballot mask): the 32 lanes split K for the compensated tier and,
// if needed, for the exact accumulator, each lane with private limbs in shared
// memory that are summed as integers at the end (order-free, so exact).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "matmul.h"

namespace carbon {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__global__ void row_stats_kernel(const double* __restrict__ x, int64_t R, int64_t K,
                                 double* __restrict__ norm, uint8_t* __restrict__ signs) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; r < R; r += warps) {
    double sum_squares = 0.0;
    uint8_t s = 0;
    for (int64_t k = lane; k < K; k += kWarp) {
      const double value = x[r * K + k];
      sum_squares = sum_squares + value * value;
      s |= row_signs_of(value);
    }
    unsigned s32 = s;
    for (int off = kWarp / 2; off > 0; off /= 2) {
      sum_squares = sum_squares + __shfl_xor_sync(kFullMask, sum_squares, off);
      s32 |= __shfl_xor_sync(kFullMask, s32, off);
    }
    if (lane == 0) {
      norm[r] = sqrt(sum_squares);
      signs[r] = static_cast<uint8_t>(s32);
    }
  }
}

// Tiers 2 and 3 for output (b, i, j), computed by the whole warp. Every lane
// returns the same value. `limbs` is this warp's [kWarp][kLimbs] shared block.
__device__ double round_exact_warp(const MatmulView& v, int64_t b, int64_t i, int64_t j,
                                   const FloatFormat& f, int64_t (*limbs)[kLimbs]) {
  const int lane = threadIdx.x % kWarp;
  const double* a = v.a + (b * v.M + i) * v.K;
  const double* bt = v.bt + (b * v.N + j) * v.K;
  const bool has_bias = v.bias != nullptr;
  const double bias = has_bias ? bias_at(v, b, i, j) : 0.0;

  CompensatedSum acc;
  for (int64_t k = lane; k < v.K; k += kWarp) compensated_add(acc, a[k] * bt[k]);
  if (has_bias && lane == 0) compensated_add(acc, bias);
  for (int off = kWarp / 2; off > 0; off /= 2) {
    CompensatedSum other;
    other.s = __shfl_xor_sync(kFullMask, acc.s, off);
    other.t = __shfl_xor_sync(kFullMask, acc.t, off);
    acc = compensated_merge(acc, other);
  }
  const double value = acc.s + acc.t;
  const double abs_sum = abs_sum_bound(v.a_norm[b * v.M + i], v.b_norm[b * v.N + j], bias);
  double out = 0.0;
  // Depth: K/32 sequential steps per lane + 5 merges, bounded by K + 64.
  if (round_if_decided(value, compensated_bound(value, abs_sum, v.K + 64), f, &out)) return out;

  int64_t* mine = limbs[lane];
  uint32_t flags;
  exact_sum_clear(mine, flags);
  for (int64_t k = lane; k < v.K; k += kWarp) exact_sum_add_product(mine, flags, a[k], bt[k]);
  if (has_bias && lane == 0) exact_sum_add(mine, flags, bias);
  for (int off = kWarp / 2; off > 0; off /= 2) flags |= __shfl_xor_sync(kFullMask, flags, off);
  __syncwarp();
  int64_t total = 0;
  if (lane < kLimbs)
    for (int l = 0; l < kWarp; ++l) total += limbs[l][lane];
  __syncwarp();
  if (lane < kLimbs) limbs[0][lane] = total;
  __syncwarp();
  if (lane == 0) out = exact_sum_round(limbs[0], flags, f);
  out = __shfl_sync(kFullMask, out, 0);
  __syncwarp();  // limbs[0] is reused by the next output
  return out;
}

template <typename F>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    matmul_round_kernel(MatmulView v, typename F::Bits* __restrict__ out) {
  using Bits = typename F::Bits;
  constexpr FloatFormat f = F::get();
  __shared__ int64_t limbs[kWarpsPerBlock][kWarp][kLimbs];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t total = v.B * v.M * v.N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // The loop bound is warp-uniform (base is a multiple of 32), so whole warps
  // enter the cooperative exact path together.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + warp * kWarp; base < total;
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
    unsigned todo = __ballot_sync(kFullMask, pending);
    while (todo) {
      const int src = __ffs(todo) - 1;
      todo &= todo - 1;
      const int64_t pb = __shfl_sync(kFullMask, b, src);
      const int64_t pi = __shfl_sync(kFullMask, i, src);
      const int64_t pj = __shfl_sync(kFullMask, j, src);
      const double r = round_exact_warp(v, pb, pi, pj, f, limbs[warp]);
      if (lane == src) out[idx] = static_cast<Bits>(encode(r, f));
    }
  }
}

int blocks_for(int64_t work_items, int threads) {
  const int64_t want = (work_items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace

void row_stats_cuda(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t R = rows.size(0), K = rows.size(1);
  if (R == 0) return;
  const int threads = kWarp * kWarpsPerBlock;
  row_stats_kernel<<<blocks_for(R * kWarp, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      rows.const_data_ptr<double>(), R, K, norms.mutable_data_ptr<double>(),
      signs.mutable_data_ptr<uint8_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void matmul_round_cuda(const MatmulView& v, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int threads = kWarp * kWarpsPerBlock;
  const int blocks = blocks_for(v.B * v.M * v.N, threads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    matmul_round_kernel<F><<<blocks, threads, 0, stream>>>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
