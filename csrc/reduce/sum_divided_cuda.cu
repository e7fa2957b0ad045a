// sum_divided on CUDA: one warp reduces the whole (short) vector with the
// tiers of carbon.mean and reads the divisor from device memory, so nothing
// waits for the host. Same decisions as the CPU (reduce_kernel.h): same bits.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "reduce_kernel.h"
#include "sum_divided.h"
#include "warp_tiers.cuh"

namespace carbon {
namespace {

template <typename T, typename F>
__global__ void __launch_bounds__(kWarpSize)
    sum_divided_kernel(const T* __restrict__ x, int64_t n, const int64_t* __restrict__ divisor,
                       typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int lane = lane_id();
  const int64_t d = *divisor;
  double s = 0.0, a = 0.0;
  for (int64_t k = lane; k < n; k += kWarpSize) {
    const double v = element_value(x[k]);
    s = s + v;
    a = a + abs_value(v);
  }
  s = warp_sum(s);
  a = warp_sum(a);
  double value;
  if (d <= 0 || n == 0) {
    value = empty_reduction(true);
  } else if (!reduce_round_fast(s, a, d, (n + kWarpSize - 1) / kWarpSize + 6, true, f, &value)) {
    value = warp_round_exact_terms(
        n, [&](int64_t k) { return element_value(x[k]); }, a, true, f, d);
  }
  if (lane == 0) *out = static_cast<typename F::Bits>(encode(value, f));
}

}  // namespace

void sum_divided_cuda(const at::Tensor& x, const at::Tensor& divisor, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = current_stream();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    with_format(format_of(x.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      sum_divided_kernel<T, F><<<1, kWarpSize, 0, stream>>>(x.const_data_ptr<T>(), x.numel(),
                                                           divisor.const_data_ptr<int64_t>(),
                                                           static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
