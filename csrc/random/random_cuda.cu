// CUDA kernels of Carbon's random ops: a grid-stride loop over the same
// per-block code as the CPU (philox.h), so the same bits. Launched on the
// current stream. The seed and offset arrive as kernel arguments, or (a
// generator's state tensor on the device) as the address of the int64 pair
// [seed, offset], read by every thread when the kernel runs: the host never
// waits for the device, and a CUDA graph replay reads the state of its time.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "random.h"

namespace carbon {
namespace random {
namespace {

template <Kind kKind, typename F>
__global__ void random_kernel(Params params, int64_t items, int64_t n, const typename F::Bits* __restrict__ in,
                              typename F::Bits* __restrict__ out) {
  const int64_t* device_state = params.state.device_state;
  const uint64_t seed = device_state != nullptr ? static_cast<uint64_t>(device_state[0]) : params.state.seed;
  const uint64_t offset = device_state != nullptr ? static_cast<uint64_t>(device_state[1]) : params.state.offset;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items; item += stride)
    random_item<kKind, F>(params, seed, offset, static_cast<uint64_t>(item), n, in, out);
}

}  // namespace

void random_cuda(const Params& params, const at::Tensor& in, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  // A state read on the host would be frozen into the graph while the
  // generator's offset moves on at each replay: every replay would draw the
  // same values.
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  TORCH_CHECK(!params.state.from_host_tensor || !capturing,
              "carbon: a draw captured in a CUDA graph needs its generator's state on the device "
              "(carbon.Generator(device=\"cuda\")); this one's state is in host memory");
  const int threads = 256;
  const int64_t n = out.numel();
  const int64_t items = work_items(params.kind, n);
  const int blocks = blocks_for(items, threads);
  const auto stream = current_stream();
  with_format(format_of(out.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    const Bits* ip = in.defined() ? static_cast<const Bits*>(in.const_data_ptr()) : nullptr;
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    with_kind(params.kind, [&](auto kind_tag) {
      constexpr Kind kKind = decltype(kind_tag)::value;
      random_kernel<kKind, F><<<blocks, threads, 0, stream>>>(params, items, n, ip, op);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace random
}  // namespace carbon
