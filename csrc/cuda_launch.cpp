// Device-property queries for cuda_launch.cuh, compiled by the host compiler
// only (see there why). Empty in a CPU-only build.
#ifdef CARBON_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>

#include "cuda_launch.cuh"

namespace carbon {

int64_t current_sm_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

size_t current_shared_memory_per_block_optin() {
  return at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
}

}  // namespace carbon

#endif  // CARBON_WITH_CUDA
