// CUDA kernel of the two-argument functions atan2, hypot and pow: a grid-stride
// loop over the same per-element code as the CPU (two_argument_math.h), so
// the same bits. No host synchronization.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/float_format.h"
#include "two_argument.h"
#include "two_argument_math.h"

namespace carbon {
namespace {

template <typename F>
__global__ void two_argument_kernel(TwoArgumentFn fn, const typename F::Bits* __restrict__ a,
                                    const typename F::Bits* __restrict__ b, int64_t n,
                                    typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double u = decode(a[i], f), v = decode(b[i], f);
    const double r = two_argument_core(fn, u, v);
    out[i] = static_cast<typename F::Bits>(encode(round_double(r, f), f));
  }
}

}  // namespace

void two_argument_cuda(TwoArgumentFn fn, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(a.device());
  const int threads = 256;
  const int blocks = blocks_for(a.numel(), threads);
  const auto stream = current_stream();
  with_format(format_of(a.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    two_argument_kernel<F><<<blocks, threads, 0, stream>>>(fn, static_cast<const Bits*>(a.const_data_ptr()),
                                                           static_cast<const Bits*>(b.const_data_ptr()), a.numel(),
                                                           static_cast<Bits*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
