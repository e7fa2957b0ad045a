// Grid sizing and the current stream, shared by Carbon's CUDA kernels.
// Results never depend on the grid: every kernel computes each output the
// same way whatever its size.
//
// Only light c10 headers here: every .cu file includes this, and nvcc parses
// each header once per target architecture. The device-property queries live
// in cuda_launch.cpp, compiled once by the host compiler, so that
// ATen/cuda/CUDAContext.h (cuBLAS, cuSPARSE and cuSOLVER headers) stays out
// of the .cu files.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace carbon {

// The current device's number of SMs and its opt-in shared memory per block
// (torch's cached cudaDeviceProp).
int64_t current_sm_count();
size_t current_shared_memory_per_block_optin();

// The stream torch's current-stream API names for the current device.
inline c10::cuda::CUDAStream current_stream() { return c10::cuda::getCurrentCUDAStream(); }

// Enough blocks of `threads` for `work_items` threads, capped at 32 per SM
// (kernels loop over the rest).
inline int blocks_for(int64_t work_items, int threads) {
  const int64_t want = (work_items + threads - 1) / threads;
  const int64_t cap = current_sm_count() * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace carbon
