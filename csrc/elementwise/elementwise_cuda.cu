// CUDA kernel of the elementwise math ops: a grid-stride loop over the same
// per-element code as the CPU (elementwise.h / elementwise_math.h), so the
// same bits. Launched on the current stream; no host synchronization.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "elementwise.h"

namespace carbon {
namespace {

template <math::Fn kFn, bool kBackward, typename F>
__global__ void elementwise_kernel(const typename F::Bits* __restrict__ x, const typename F::Bits* __restrict__ g,
                                   int64_t n, typename F::Bits* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = elementwise_one<kFn, kBackward, F>(x[i], kBackward ? g[i] : typename F::Bits{0});
}

__global__ void elementwise_binary64_kernel(math::Fn fn, bool backward, const double* __restrict__ x,
                                            const double* __restrict__ g, int64_t n, double* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = binary64_one(fn, backward, x[i], backward ? g[i] : 0.0);
}

}  // namespace

void elementwise_binary64_cuda(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad,
                               at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 128;  // the double-double cores use many registers
  const int blocks = blocks_for(x.numel(), threads);
  elementwise_binary64_kernel<<<blocks, threads, 0, current_stream()>>>(
      fn, backward, x.const_data_ptr<double>(), backward ? grad.const_data_ptr<double>() : nullptr, x.numel(),
      out.mutable_data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void elementwise_cuda(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 256;
  const int blocks = blocks_for(x.numel(), threads);
  const auto stream = current_stream();
  with_format(format_of(x.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    const Bits* xp = static_cast<const Bits*>(x.const_data_ptr());
    const Bits* gp = backward ? static_cast<const Bits*>(grad.const_data_ptr()) : nullptr;
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    with_fn(fn, [&](auto fn_tag) {
      constexpr math::Fn kFn = decltype(fn_tag)::value;
      if (backward)
        elementwise_kernel<kFn, true, F><<<blocks, threads, 0, stream>>>(xp, gp, x.numel(), op);
      else
        elementwise_kernel<kFn, false, F><<<blocks, threads, 0, stream>>>(xp, gp, x.numel(), op);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
