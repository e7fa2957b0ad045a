// cumsum_rows on CUDA: one thread per row runs cumsum_kernel.h's row loop
// (sequential prefix sums; the exact accumulator lives in the thread's local
// memory). Simple rather than fast: long single rows are serial. No host sync.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "cumsum.h"
#include "cumsum_kernel.h"

namespace carbon {
namespace {

template <typename T, typename F>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                   typename F::Bits* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
    cumsum_row<T, F>(x + r * n, n, out + r * n);
}

}  // namespace

void cumsum_rows_cuda(const at::Tensor& x, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const int threads = 128;
  const int blocks = blocks_for(rows, threads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      cumsum_rows_kernel<T, F><<<blocks, threads, 0, stream>>>(x.const_data_ptr<T>(), rows, n,
                                                               static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
