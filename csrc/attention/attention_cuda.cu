// CUDA kernel of attention_logits: one thread per element (grid-stride).
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../reduce/reduce_kernel.h"
#include "attention.h"
#include "attention_kernel.h"

namespace carbon {
namespace {

template <typename T>
__global__ void attention_logits_kernel(const float* s, int64_t total, int64_t Tq, int64_t Tk, double scale,
                                        const T* mask, int64_t sb, int64_t sq, int64_t sk, bool causal, float* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % Tk, i = (e / Tk) % Tq, b = e / (Tk * Tq);
    const double m = mask == nullptr ? -0.0 : element_value(mask[b * sb + i * sq + j * sk]);
    // The bits by encode, not a hardware double -> float conversion: the
    // value is already a float32 value, but a NaN (a NaN score or mask,
    // inf - inf) would convert to the GPU's NaN 0x7FFFFFFF, where the
    // contract (and the CPU, for a NaN score or mask) writes 0x7FC00000.
    reinterpret_cast<uint32_t*>(out)[e] =
        encode(attention_logit(s[e], scale, m, causal && j > i), Format<FormatId::kFloat32>::get());
  }
}

}  // namespace

void attention_logits_cuda(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(s.device());
  const int64_t Tq = s.size(1), Tk = s.size(2), total = s.numel();
  constexpr int kThreads = 256;
  const auto stream = current_stream();
  const at::ScalarType mask_type = mask.defined() ? mask.scalar_type() : at::kFloat;
  with_element_type(mask_type, [&](auto element) {
    using T = decltype(element);
    const T* m = mask.defined() ? mask.const_data_ptr<T>() : nullptr;
    const int64_t sb = mask.defined() ? mask.stride(0) : 0, sq = mask.defined() ? mask.stride(1) : 0,
                  sk = mask.defined() ? mask.stride(2) : 0;
    attention_logits_kernel<T><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
        s.const_data_ptr<float>(), total, Tq, Tk, scale, m, sb, sq, sk, causal, out.mutable_data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
