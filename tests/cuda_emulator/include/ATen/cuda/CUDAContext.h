// The CUDA emulator's stand-in for ATen/cuda/CUDAContext.h (tests/cuda_emulator/cuda_emulator.h): a device with the
// H200's limits but few SMs, so that grids are small and the kernels' grid-stride loops take several turns.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>

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

namespace at {
namespace cuda {

cudaDeviceProp* getCurrentDeviceProperties();

}  // namespace cuda
}  // namespace at
