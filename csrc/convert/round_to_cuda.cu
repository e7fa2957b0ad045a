// CUDA kernel of round_to: one thread per element, the same per-element code
// as the CPU (round_to.h), so the same bits.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "round_to.h"

namespace carbon {
namespace {

template <typename From, typename To>
__global__ void round_to_kernel(const typename From::Bits* __restrict__ x, int64_t n, uint32_t divisor,
                                typename To::Bits* __restrict__ out) {
  constexpr FloatFormat from = From::get(), to = To::get();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = static_cast<typename To::Bits>(encode(round_quotient(decode(x[i], from), divisor, to), to));
}

}  // namespace

void round_to_cuda(const at::Tensor& x, uint32_t divisor, FormatId to, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 256;
  const int blocks = blocks_for(x.numel(), threads);
  const auto stream = current_stream();
  with_format(format_of(x.scalar_type()), [&](auto from_fmt) {
    using From = decltype(from_fmt);
    with_format(to, [&](auto to_fmt) {
      using To = decltype(to_fmt);
      round_to_kernel<From, To><<<blocks, threads, 0, stream>>>(
          static_cast<const typename From::Bits*>(x.const_data_ptr()), x.numel(), divisor,
          static_cast<typename To::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
