// The CUDA emulator's stand-in for c10/cuda/CUDAStream.h: one stream, which is no stream at all.
#pragma once

using cudaStream_t = void*;

namespace c10 {
namespace cuda {
struct CUDAStream {
  cudaStream_t stream() const { return nullptr; }
  operator cudaStream_t() const { return nullptr; }  // NOLINT: as c10's
};
inline CUDAStream getCurrentCUDAStream() { return {}; }
}  // namespace cuda
}  // namespace c10
