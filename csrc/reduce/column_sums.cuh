// Exact column sums on CUDA: for kQ families of exact fp64 terms t_q(r, c)
// over rows r < R and columns c < C,
//     out_q[c] = RN_f(sum_r t_q(r, c))        (or RN_f(sum / R) with `mean`),
// the correctly rounded exact sums of reduce_kernel.h. Used where a
// reduction runs down the leading dimension of a contiguous [R, C] tensor:
// carbon.sum / mean over leading dims (a bias gradient), and the weight and
// bias gradients of layer_norm / rms_norm. Reading the columns in place saves
// the transposing copy (a read and a write of the whole tensor) that a
// row-wise reduction would need first.
//
// Pass 1 (column_partials_kernel): a thread per (column, chunk of rows)
//   adds its chunk's terms in row order in fp64: their sum, the sum of their
//   magnitudes, and whether some term is not -0. Consecutive threads take
//   consecutive columns, so each row's loads and the partials' stores are
//   coalesced; chunks of rows give enough threads to keep the memory busy
//   when there are few columns.
// Pass 2 (finish_columns_kernel): a thread per column adds its chunks'
//   partials in chunk order and decides by tier 1. A column whose partial
//   magnitudes sum to 0 holds only ±0 terms: its sum is an exact zero, -0 iff
//   every term is -0 (exact_zero's rule), from pass 1's flags. The rare
//   column left undecided is finished by the whole warp with tiers 2 and 3
//   (warp_tiers.cuh), its terms recomputed (strided reads, for that column
//   only).
// Depth of tier 1's tree: chunk_rows additions in pass 1 (from 0.0, in
// order), then `chunks` more in pass 2. The grid only sets the chunking, and
// every chunking gives the correctly rounded value: nothing depends on it.
// No host synchronization; launches on the current stream.
//
// A Terms type: `static constexpr int kQ;` and
//   `__device__ void operator()(int64_t r, int64_t c, double (&t)[kQ]) const`
// writing the kQ exact terms of row r, column c.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <array>

#include "../cuda_launch.cuh"
#include "../exact/warp_exact.cuh"
#include "reduce_kernel.h"
#include "warp_tiers.cuh"

namespace carbon {
namespace column_sums_detail {

constexpr int kPartialThreads = 256;  // columns per block in pass 1 (fewer when there are fewer columns)
constexpr int kFinishWarps = 4;       // pass 2: 32 columns per warp
constexpr int64_t kMinChunkRows = 32;
constexpr int64_t kMaxChunks = 1024;  // keeps pass 2's chain and the grid's y extent short
// Pass 1's partials: [kQ][3][chunks][C] doubles (sum, sum of magnitudes, 1.0 if some term is not -0).
constexpr int kPartialKinds = 3;

template <typename Terms>
__global__ void __launch_bounds__(kPartialThreads)
    column_partials_kernel(Terms terms, int64_t rows, int64_t cols, int64_t chunk_rows, int64_t chunks,
                           double* __restrict__ partials) {
  constexpr int Q = Terms::kQ;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;  // no barrier or warp collective below
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    double s[Q], a[Q];
    bool not_negative_zero[Q];
    for (int q = 0; q < Q; ++q) {
      s[q] = a[q] = 0.0;
      not_negative_zero[q] = false;
    }
    const int64_t end = rows < (chunk + 1) * chunk_rows ? rows : (chunk + 1) * chunk_rows;
#pragma unroll 4
    for (int64_t r = chunk * chunk_rows; r < end; ++r) {
      double t[Q];
      terms(r, c, t);
      for (int q = 0; q < Q; ++q) {
        s[q] = s[q] + t[q];
        a[q] = a[q] + abs_value(t[q]);
        not_negative_zero[q] |= double_to_bits(t[q]) != kSignBit;
      }
    }
    for (int q = 0; q < Q; ++q) {
      double* p = partials + ((static_cast<int64_t>(q) * kPartialKinds) * chunks + chunk) * cols + c;
      p[0] = s[q];
      p[chunks * cols] = a[q];
      p[2 * chunks * cols] = not_negative_zero[q] ? 1.0 : 0.0;
    }
  }
}

template <typename Bits, int Q>
struct ColumnOutputs {
  Bits* out[Q];  // null: that family is not wanted
};

template <typename Terms, typename F>
__global__ void __launch_bounds__(kWarpSize* kFinishWarps)
    finish_columns_kernel(Terms terms, int64_t rows, int64_t cols, int64_t chunks, int64_t depth,
                          const double* __restrict__ partials, bool mean,
                          ColumnOutputs<typename F::Bits, Terms::kQ> outputs) {
  constexpr int Q = Terms::kQ;
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  // Warp-uniform loop: a warp takes 32 consecutive columns.
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kFinishWarps + warp) * kWarpSize; base < cols;
       base += static_cast<int64_t>(gridDim.x) * kFinishWarps * kWarpSize) {
    const int64_t c = base + lane;
    const bool mine = c < cols;
    for (int q = 0; q < Q; ++q) {
      typename F::Bits* out = outputs.out[q];
      if (out == nullptr) continue;  // uniform across the warp
      double s = 0.0, a = 0.0, value = 0.0;
      bool not_negative_zero = false, decided = true;
      if (mine) {
        const double* p = partials + (static_cast<int64_t>(q) * kPartialKinds) * chunks * cols + c;
        for (int64_t k = 0; k < chunks; ++k) {
          s = s + p[k * cols];
          a = a + p[(chunks + k) * cols];
          not_negative_zero |= p[(2 * chunks + k) * cols] != 0.0;
        }
        if (rows == 0)
          value = empty_reduction(mean);
        else if (reduce_round_fast(s, a, rows, depth, mean, f, &value)) {
        } else if (a == 0.0)
          value = exact_zero(kSawTerm | (not_negative_zero ? kSawNonNegZero : 0u));
        else
          decided = false;
      }
      unsigned todo = __ballot_sync(kFullWarp, !decided);
      while (todo) {
        const int src = __ffs(static_cast<int>(todo)) - 1;
        todo &= todo - 1;
        const int64_t col = base + src;
        const double abs_sum = __shfl_sync(kFullWarp, a, src);
        const double v = warp_round_exact_terms(
            rows,
            [&](int64_t r) {
              double t[Q];
              terms(r, col, t);
              return t[q];
            },
            abs_sum, mean, f);
        if (lane == src) value = v;
      }
      if (mine) out[c] = static_cast<typename F::Bits>(encode(value, f));
    }
  }
}

}  // namespace column_sums_detail

// Launches both passes for a [rows, cols] family of terms; outputs[q] is
// column family q's contiguous output of cols elements in format F (null: not
// wanted). `device_options` places the partials (fp64 scratch) on the device.
template <typename F, typename Terms>
void column_sums_cuda(const Terms& terms, int64_t rows, int64_t cols, bool mean,
                      const std::array<typename F::Bits*, Terms::kQ>& outputs, const at::TensorOptions& device_options) {
  using namespace column_sums_detail;
  constexpr int Q = Terms::kQ;
  if (cols == 0) return;
  const auto stream = current_stream();
  const int64_t sms = current_sm_count();
  const int threads = static_cast<int>(std::min<int64_t>(kPartialThreads, (cols + kWarpSize - 1) / kWarpSize * kWarpSize));
  const int64_t column_blocks = (cols + threads - 1) / threads;
  // About one full load of resident threads (2048 per SM) in pass 1, each
  // adding at least kMinChunkRows rows.
  const int64_t wanted = (sms * 2048 + column_blocks * threads - 1) / (column_blocks * threads);
  int64_t chunks = std::max<int64_t>(1, std::min({wanted, kMaxChunks, (rows + kMinChunkRows - 1) / kMinChunkRows}));
  const int64_t chunk_rows = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  chunks = rows == 0 ? 1 : (rows + chunk_rows - 1) / chunk_rows;
  const at::Tensor partials = at::empty({Q * kPartialKinds * chunks * cols}, device_options.dtype(at::kDouble));
  column_partials_kernel<Terms><<<dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks)), threads,
                                  0, stream>>>(terms, rows, cols, chunk_rows, chunks, partials.mutable_data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  ColumnOutputs<typename F::Bits, Q> outs;
  for (int q = 0; q < Q; ++q) outs.out[q] = outputs[q];
  const int finish_threads = kWarpSize * kFinishWarps;
  finish_columns_kernel<Terms, F><<<blocks_for(cols, finish_threads), finish_threads, 0, stream>>>(
      terms, rows, cols, chunks, chunk_rows + chunks, partials.const_data_ptr<double>(), mean, outs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
