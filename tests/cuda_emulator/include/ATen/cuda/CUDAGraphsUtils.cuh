// The CUDA emulator's stand-in for ATen/cuda/CUDAGraphsUtils.cuh: never capturing.
#pragma once

namespace at {
namespace cuda {
enum class CaptureStatus { None = 0, Active = 1, Invalidated = 2 };
inline CaptureStatus currentStreamCaptureStatus() { return CaptureStatus::None; }
}  // namespace cuda
}  // namespace at
