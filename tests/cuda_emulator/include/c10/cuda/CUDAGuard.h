// The CUDA emulator's stand-in for c10/cuda/CUDAGuard.h: one device, index 0.
#pragma once

#include <c10/core/Device.h>

namespace c10 {
namespace cuda {
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
};
inline c10::DeviceIndex current_device() { return 0; }
}  // namespace cuda
}  // namespace c10
