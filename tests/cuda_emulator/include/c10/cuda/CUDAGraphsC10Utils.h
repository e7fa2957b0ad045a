// The CUDA emulator's stand-in for c10/cuda/CUDAGraphsC10Utils.h: never capturing.
#pragma once

namespace c10 {
namespace cuda {
enum class CaptureStatus { None = 0, Active = 1, Invalidated = 2 };
inline CaptureStatus currentStreamCaptureStatusMayInitCtx() { return CaptureStatus::None; }
}  // namespace cuda
}  // namespace c10
