// CUDA kernel of the indexed accumulations: one thread per destination
// element (o, j, c), columns fastest, so the threads of a warp share a
// destination row (its segment of `order` is read as a broadcast) and read
// consecutive columns of each contributing source row. Each thread runs all
// tiers for its element (scatter_kernel.h); no atomics, no host
// synchronization, and no result depends on the grid.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "scatter.h"
#include "scatter_kernel.h"

namespace carbon {
namespace {

constexpr int kThreads = 256;

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order,
                        const int64_t* __restrict__ offsets, int64_t outer, int64_t N, int64_t S, int64_t inner,
                        typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int64_t total = outer * S * inner;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = e % inner, d = e / inner;
    const int64_t o = d / S, j = d % S;
    const int64_t begin = offsets[j], end = offsets[j + 1];
    const DestinationTerms<T> terms{self ? self + e : nullptr, source + o * N * inner + c, order + begin, end - begin,
                                    inner};
    out[e] = static_cast<typename F::Bits>(encode(scatter_element(terms, f), f));
  }
}

}  // namespace

void scatter_rows_cuda(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                       const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t N = order.numel();
  const int blocks = blocks_for(outer * S * inner, kThreads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_element_type(source.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      scatter_rows_kernel<T, F><<<blocks, kThreads, 0, stream>>>(
          self.defined() ? self.const_data_ptr<T>() : nullptr, source.const_data_ptr<T>(),
          order.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(), outer, N, S, inner,
          static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
