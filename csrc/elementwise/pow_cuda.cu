// CUDA kernels of the pow ops and the square root: grid-stride loops over the
// same per-element code as the CPU (pow_math.h), so the same bits. No host
// synchronization.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "pow.h"
#include "binary64_math.h"
#include "pow_math.h"

namespace carbon {
namespace {

template <typename F>
__global__ void pow_kernel(const typename F::Bits* __restrict__ x, int64_t n, double scalar, bool tensor_is_base,
                           typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = decode(x[i], f);
    const double r = tensor_is_base ? math::pow_core(v, scalar) : math::pow_core(scalar, v);
    out[i] = static_cast<typename F::Bits>(encode(round_double(r, f), f));
  }
}

__global__ void pow_binary64_kernel(const double* __restrict__ x, int64_t n, double scalar, bool tensor_is_base,
                                    double* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = pow_binary64_one(x[i], scalar, tensor_is_base);
}

template <typename F>
__global__ void sqrt_kernel(const typename F::Bits* __restrict__ x, int64_t n, typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = static_cast<typename F::Bits>(encode(sqrt_one(decode(x[i], f), f), f));
}

__global__ void sqrt_binary64_kernel(const double* __restrict__ x, int64_t n, double* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = sqrt_binary64_one(x[i]);
}

}  // namespace

void sqrt_cuda(const at::Tensor& x, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 256;
  const int blocks = blocks_for(x.numel(), threads);
  const auto stream = current_stream();
  if (x.scalar_type() == at::kDouble) {
    sqrt_binary64_kernel<<<blocks, threads, 0, stream>>>(x.const_data_ptr<double>(), x.numel(),
                                                         out.mutable_data_ptr<double>());
  } else {
    with_format(format_of(x.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      using Bits = typename F::Bits;
      sqrt_kernel<F><<<blocks, threads, 0, stream>>>(static_cast<const Bits*>(x.const_data_ptr()), x.numel(),
                                                     static_cast<Bits*>(out.mutable_data_ptr()));
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void pow_cuda(const at::Tensor& x, double scalar, bool tensor_is_base, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 256;
  const int blocks = blocks_for(x.numel(), threads);
  const auto stream = current_stream();
  if (x.scalar_type() == at::kDouble) {  // float64: the double-double core
    pow_binary64_kernel<<<blocks_for(x.numel(), 128), 128, 0, stream>>>(
        x.const_data_ptr<double>(), x.numel(), scalar, tensor_is_base, out.mutable_data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  with_format(format_of(x.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    pow_kernel<F><<<blocks, threads, 0, stream>>>(static_cast<const Bits*>(x.const_data_ptr()), x.numel(), scalar,
                                                  tensor_is_base, static_cast<Bits*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
