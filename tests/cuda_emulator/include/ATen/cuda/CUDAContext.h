// The CUDA emulator's stand-in for ATen/cuda/CUDAContext.h (tests/cuda_emulator/cuda_emulator.h): a device with the
// H200's limits but few SMs, so that grids are small and the kernels' grid-stride loops take several turns.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>

using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct cudaDeviceProp {
  int multiProcessorCount;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int maxThreadsPerBlock;
  int warpSize;
};

template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cudaSuccess;
}

#define C10_CUDA_CHECK(expr) ((void)(expr))
#define C10_CUDA_KERNEL_LAUNCH_CHECK() ((void)0)

namespace at {
namespace cuda {

cudaDeviceProp* getCurrentDeviceProperties();

struct CUDAStream {
  cudaStream_t stream() const { return nullptr; }
  operator cudaStream_t() const { return nullptr; }  // NOLINT: as ATen's
};
inline CUDAStream getCurrentCUDAStream() { return {}; }

}  // namespace cuda
}  // namespace at
