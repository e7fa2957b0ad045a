// CUDA kernels of the indexed accumulations: chunk sums of the sorted
// contributions, then one thread per destination element (o, j, c), columns
// fastest, so the threads of a warp share a destination row (its segment of
// `order` is read as a broadcast) and read consecutive columns of each
// contributing source row. Each thread runs all tiers for its element
// (scatter_kernel.h); no atomics, no host synchronization, and no result
// depends on the grid or on the chunking.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "scatter.h"
#include "scatter_kernel.h"

namespace carbon {
namespace {

constexpr int kThreads = 256;

// Chunk q of the sorted positions, [q L, q L + L) with L = kScatterChunk,
// for (o, c): its tier-1 sums when all its contributions go to one
// destination in [0, S) (only those are read: a destination uses the chunks
// lying wholly inside its segment); nothing otherwise.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    chunk_sums_kernel(const T* __restrict__ source, const int64_t* __restrict__ order,
                      const int64_t* __restrict__ keys, int64_t outer, int64_t N, int64_t S, int64_t inner,
                      int64_t chunks, PartialSum* __restrict__ sums) {
  const int64_t total = outer * chunks * inner;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = e % inner, d = e / inner;
    const int64_t o = d / chunks, q = d % chunks;
    const int64_t first = q * kScatterChunk;
    const int64_t key = keys[first];
    if (key != keys[first + kScatterChunk - 1] || key < 0 || key >= S) continue;
    sums[e] = chunk_partial(source + o * N * inner + c, order + first, inner);
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const T* __restrict__ self, const T* __restrict__ source, const int64_t* __restrict__ order,
                        const int64_t* __restrict__ offsets, const PartialSum* __restrict__ sums, int64_t chunks,
                        int64_t outer, int64_t N, int64_t S, int64_t inner, typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int64_t total = outer * S * inner;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = e % inner, d = e / inner;
    const int64_t o = d / S, j = d % S;
    const int64_t begin = offsets[j], end = offsets[j + 1];
    const DestinationTerms<T> terms{self ? self + e : nullptr, source + o * N * inner + c, order + begin, end - begin,
                                    inner};
    const PartialSum* chunk_sums = sums ? sums + o * chunks * inner + c : nullptr;
    out[e] = static_cast<typename F::Bits>(encode(scatter_element(terms, begin, chunk_sums, f), f));
  }
}

}  // namespace

void scatter_rows_cuda(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                       const at::Tensor& keys, const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner,
                       at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t N = order.numel();
  // Chunk sums only pay when a destination can hold a whole chunk.
  const int64_t chunks = N / kScatterChunk;
  at::Tensor sums;
  if (chunks > 0)
    sums = at::empty({outer * chunks * inner * static_cast<int64_t>(sizeof(PartialSum))},
                     out.options().dtype(at::kByte));
  const auto stream = current_stream();
  with_element_type(source.scalar_type(), [&](auto element) {
    using T = decltype(element);
    PartialSum* sums_ptr = chunks > 0 ? reinterpret_cast<PartialSum*>(sums.mutable_data_ptr()) : nullptr;
    if (chunks > 0) {
      chunk_sums_kernel<T><<<blocks_for(outer * chunks * inner, kThreads), kThreads, 0, stream>>>(
          source.const_data_ptr<T>(), order.const_data_ptr<int64_t>(), keys.const_data_ptr<int64_t>(), outer, N, S,
          inner, chunks, sums_ptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      scatter_rows_kernel<T, F><<<blocks_for(outer * S * inner, kThreads), kThreads, 0, stream>>>(
          self.defined() ? self.const_data_ptr<T>() : nullptr, source.const_data_ptr<T>(),
          order.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(), sums_ptr, chunks, outer, N, S, inner,
          static_cast<typename F::Bits*>(out.mutable_data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace carbon
