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
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "../reduce/reduce_kernel.h"
#include "matmul.h"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;

// The exact fp64 copy of an operand's rows and their statistics (2-norm,
// RowSigns) from one read of the source, which has element type T, shape
// [B, R, K] and any strides; dst is [B * R, K], contiguous. (Before: a copy
// to fp64, then a kernel reading that copy again for the statistics -- for
// attention's probabilities, 805 MB more per product at GPT-2 small's batch
// 8 x 1024.)
// The norms feed only tier 1's bound, which holds for any summation order
// (kBoundSlack), so each kernel sums in the order that suits its layout.
struct RowsView {
  int64_t B, R, K;
  int64_t sb, sr, sk;  // element strides of the source
};

// Rows contiguous along k (sk == 1), or any layout without a better kernel:
// a warp per row, lanes over k.
template <typename T>
__global__ void widen_rows_kernel(const T* __restrict__ src, RowsView v, double* __restrict__ dst,
                                  double* __restrict__ norm, uint8_t* __restrict__ signs) {
  const int lane = lane_id();
  const int64_t rows = v.B * v.R;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; row < rows; row += warps) {
    const T* x = src + (row / v.R) * v.sb + (row % v.R) * v.sr;
    double* out = dst + row * v.K;
    double sum_squares = 0.0;
    uint8_t s = 0;
    for (int64_t k = lane; k < v.K; k += kWarpSize) {
      const double value = element_value(x[k * v.sk]);
      out[k] = value;
      sum_squares = sum_squares + value * value;
      s |= row_signs_of(value);
    }
    sum_squares = warp_sum(sum_squares);
    const uint32_t s32 = warp_or(s);
    if (lane == 0) {
      norm[row] = sqrt(sum_squares);
      signs[row] = static_cast<uint8_t>(s32);
    }
  }
}

// Rows that are the columns of a row-major source (sr == 1, as b's columns
// and a transposed a are): a block of 32 x 8 threads takes 32 rows and walks
// k in tiles of 32, reading each tile along the rows (coalesced), turning it
// in shared memory, and writing it along k (coalesced). Thread (x, y) writes
// rows y, y + 8, y + 16, y + 24 of the tile at k = x and keeps their sums;
// the warp y then adds its lanes' sums for those rows.
constexpr int kTile = 32, kTileRowsPerPass = 8;

template <typename T>
__global__ void __launch_bounds__(kTile* kTileRowsPerPass)
    widen_columns_kernel(const T* __restrict__ src, RowsView v, double* __restrict__ dst,
                         double* __restrict__ norm, uint8_t* __restrict__ signs) {
  __shared__ double tile[kTile][kTile + 1];  // [k][row]; +1: no bank conflicts when turned
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t row_tiles = (v.R + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < v.B * row_tiles; t += gridDim.x) {
    const int64_t b = t / row_tiles, r0 = (t % row_tiles) * kTile;
    const T* x = src + b * v.sb;
    double sum_squares[kTile / kTileRowsPerPass] = {};
    uint32_t s[kTile / kTileRowsPerPass] = {};
    for (int64_t k0 = 0; k0 < v.K; k0 += kTile) {
      for (int i = 0; i < kTile / kTileRowsPerPass; ++i) {  // load: k = k0 + ty + 8i, row = r0 + tx
        const int64_t k = k0 + ty + kTileRowsPerPass * i, r = r0 + tx;
        tile[ty + kTileRowsPerPass * i][tx] = (k < v.K && r < v.R) ? element_value(x[r * v.sr + k * v.sk]) : 0.0;
      }
      __syncthreads();
      for (int i = 0; i < kTile / kTileRowsPerPass; ++i) {  // store: row = r0 + ty + 8i, k = k0 + tx
        const int64_t r = r0 + ty + kTileRowsPerPass * i, k = k0 + tx;
        if (k < v.K && r < v.R) {
          const double value = tile[tx][ty + kTileRowsPerPass * i];
          dst[(b * v.R + r) * v.K + k] = value;
          sum_squares[i] = sum_squares[i] + value * value;
          s[i] |= row_signs_of(value);
        }
      }
      __syncthreads();
    }
    for (int i = 0; i < kTile / kTileRowsPerPass; ++i) {
      const double total = warp_sum(sum_squares[i]);
      const uint32_t s32 = warp_or(s[i]);
      const int64_t r = r0 + ty + kTileRowsPerPass * i;
      if (tx == 0 && r < v.R) {
        norm[b * v.R + r] = sqrt(total);
        signs[b * v.R + r] = static_cast<uint8_t>(s32);
      }
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

void widen_rows_cuda(const at::Tensor& src, at::Tensor& dst, at::Tensor& norms, at::Tensor& signs) {
  const c10::cuda::CUDAGuard guard(src.device());
  const RowsView v{src.size(0), src.size(1), src.size(2), src.stride(0), src.stride(1), src.stride(2)};
  if (v.B * v.R == 0) return;
  const auto stream = current_stream();
  double* d = dst.mutable_data_ptr<double>();
  double* n = norms.mutable_data_ptr<double>();
  uint8_t* s = signs.mutable_data_ptr<uint8_t>();
  with_element_type(src.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* x = src.const_data_ptr<T>();
    if (v.sk != 1 && v.sr == 1 && v.K > 1) {
      const int64_t tiles = v.B * ((v.R + kTile - 1) / kTile);
      const int threads = kTile * kTileRowsPerPass;
      widen_columns_kernel<T><<<blocks_for(tiles * threads, threads), threads, 0, stream>>>(x, v, d, n, s);
    } else {
      const int threads = kWarpSize * kWarpsPerBlock;
      widen_rows_kernel<T><<<blocks_for(v.B * v.R * kWarpSize, threads), threads, 0, stream>>>(x, v, d, n, s);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void matmul_round_cuda(const MatmulView& v, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int threads = kWarpSize * kWarpsPerBlock;
  const int blocks = blocks_for(v.B * v.M * v.N, threads);
  const auto stream = current_stream();
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    matmul_round_kernel<F><<<blocks, threads, 0, stream>>>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
