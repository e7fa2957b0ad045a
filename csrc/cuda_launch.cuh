// Grid sizing shared by Carbon's CUDA kernels. Results never depend on it:
// every kernel computes each output the same way whatever the grid.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>

namespace carbon {

// Enough blocks of `threads` for `work_items` threads, capped at 32 per SM
// (kernels loop over the rest).
inline int blocks_for(int64_t work_items, int threads) {
  const int64_t want = (work_items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace carbon
