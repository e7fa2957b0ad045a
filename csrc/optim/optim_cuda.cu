// CUDA kernels of the optimizer family. The per-element updates are
// optim_kernel.h's, as on the CPU, on the current stream, with no host
// synchronization. Each kernel runs over a list of up to 32 tensors of one
// dtype (tensor_lists.cuh): a model's hundreds of parameters take a few
// launches, not one each. The sum of squares:
//   pass 1  fixed chunks of kChunk elements of each tensor: fp64 sums of
//           squares, one per chunk;
//   pass 2  one warp adds the chunk partials and decides (tier 1);
//   pass 3  only if undecided (each kernel exits at once otherwise): exact
//           accumulators per block, merged with 64-bit integer atomics (exact
//           and order-independent), then rounded.
// No result depends on the grid or on how the tensors are grouped.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "optim.h"
#include "tensor_lists.cuh"

namespace carbon {
namespace {

constexpr int kThreads = 256;
// Elements per chunk of the elementwise steps: 16 per thread of a block.
constexpr int64_t kStepChunk = 16 * kThreads;

// The tensors of a launch (tensor_lists.cuh): parameters p, gradients g,
// float32 states (null where a step keeps none: SGD without momentum, Adam
// without AMSGrad), and capturable Adam's per-tensor step t (null: use the
// host's constants).
template <typename T>
struct StepLists {
  T* p[kListTensors];
  const T* g[kListTensors];
  float* s1[kListTensors];  // Adam: exp_avg; SGD: momentum buffer
  float* s2[kListTensors];  // Adam: exp_avg_sq
  float* s3[kListTensors];  // Adam: AMSGrad's max_exp_avg_sq
  const float* step[kListTensors];
};

// kAmsgrad: s3 holds AMSGrad's max_exp_avg_sq (else never read).
template <typename T, typename F, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(StepLists<T> a, ListChunks l, AdamConstants c0, AdamStepSource source) {
  constexpr FloatFormat f = F::get();
  for (int64_t chunk = blockIdx.x; chunk < l.first_chunk[l.count]; chunk += gridDim.x) {
    const ChunkRange r = chunk_range(l, chunk);
    AdamConstants c = c0;
    // A capturable step: every thread derives the same constants from the tensor's t and lr in device memory (a
    // few dozen fp64 operations, the host's sequence).
    if (a.step[r.t]) {
      AdamStepSource s = source;
      s.step = a.step[r.t];
      c = constants_at(c0, s);
    }
    T* p = a.p[r.t];
    const T* g = a.g[r.t];
    float *m = a.s1[r.t], *v = a.s2[r.t], *w = a.s3[r.t];
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) adam_element<kAmsgrad>(p, g, m, v, w, i, c, f);
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads) sgd_kernel(StepLists<T> a, ListChunks l, SgdConstants c) {
  constexpr FloatFormat f = F::get();
  for (int64_t chunk = blockIdx.x; chunk < l.first_chunk[l.count]; chunk += gridDim.x) {
    const ChunkRange r = chunk_range(l, chunk);
    T* p = a.p[r.t];
    const T* g = a.g[r.t];
    float* b = a.s1[r.t];
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      const double b0 = (b && !c.first_step) ? load(b, i) : 0.0;
      const SgdResult u = sgd_update(load(p, i), load(g, i), b0, c, f);
      if (b) store_value(b, i, u.b, state_format());
      store_value(p, i, u.p, f);
    }
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    clip_kernel(StepLists<T> a, ListChunks l, const float* __restrict__ total, double max_norm, double eps) {
  constexpr FloatFormat f = F::get();
  const double coef = clip_coefficient(load(total, 0), max_norm, eps);
  for (int64_t chunk = blockIdx.x; chunk < l.first_chunk[l.count]; chunk += gridDim.x) {
    const ChunkRange r = chunk_range(l, chunk);
    T* g = a.p[r.t];
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      const double scaled = load(g, i) * coef;
      store_value(g, i, round_double(scaled, f), f);
    }
  }
}

// ---- sum of squares
constexpr int64_t kChunk = 16 * 1024;
// Per chunk: kChunk / kThreads sequential additions per thread, 5 butterfly
// levels, then the block's warp partials added in order.
constexpr int64_t kChunkDepth = kChunk / kThreads + 5 + kThreads / kWarpSize;

// Scratch layout (int64 words): [0, kLimbs) limbs, kLimbs flags, kLimbs + 1
// "decided" (0/1), kLimbs + 2 the decided float32 value (as double bits),
// then the chunk partials (doubles).
constexpr int kFlagsWord = kLimbs, kDecidedWord = kLimbs + 1, kValueWord = kLimbs + 2, kPartials = kLimbs + 3;

// Pass 1 over a launch's tensors: block-chunk c's fp64 sum of squares goes to partials[c] (partials: this
// launch's slice of the scratch's partials, in tensor order: chunk by chunk, tensor after tensor).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    chunk_squares_kernel(StepLists<T> a, ListChunks l, double* __restrict__ partials) {
  __shared__ double warp_s[kThreads / kWarpSize];
  for (int64_t chunk = blockIdx.x; chunk < l.first_chunk[l.count]; chunk += gridDim.x) {
    const ChunkRange r = chunk_range(l, chunk);
    const T* x = a.p[r.t];
    double s = 0.0;
    for (int64_t k = r.begin + threadIdx.x; k < r.end; k += kThreads) s = s + square_of(x, k);
    s = warp_sum(s);
    if (lane_id() == 0) warp_s[threadIdx.x / kWarpSize] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < kThreads / kWarpSize; ++w) t = t + warp_s[w];
      partials[chunk] = t;
    }
    __syncthreads();  // warp_s is rewritten by the next chunk
  }
}

// One warp: tier 1 over the chunk partials.
__global__ void decide_kernel(int64_t* scratch, int64_t chunks, int64_t n) {
  const double* partials = reinterpret_cast<const double*>(scratch + kPartials);
  double s = 0.0;
  for (int64_t k = lane_id(); k < chunks; k += kWarpSize) s = s + partials[k];
  s = warp_sum(s);
  const int64_t depth = kChunkDepth + (chunks + kWarpSize - 1) / kWarpSize + 6;
  if (lane_id() == 0) {
    double value;
    const bool decided = reduce_round_fast(s, s, n, depth, false, state_format(), &value);
    scratch[kDecidedWord] = decided ? 1 : 0;
    scratch[kValueWord] = static_cast<int64_t>(double_to_bits(decided ? value : 0.0));
  }
}

// Tier 3 for a launch's tensors, only when tier 1 did not decide.
template <typename T>
__global__ void __launch_bounds__(kThreads) exact_squares_kernel(StepLists<T> a, ListChunks l, int64_t* scratch) {
  if (scratch[kDecidedWord]) return;
  __shared__ unsigned long long block_limbs[kLimbs];
  __shared__ unsigned int block_flags;
  if (threadIdx.x < kLimbs) block_limbs[threadIdx.x] = 0;
  if (threadIdx.x == 0) block_flags = 0;
  __syncthreads();
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t chunk = blockIdx.x; chunk < l.first_chunk[l.count]; chunk += gridDim.x) {
    const ChunkRange r = chunk_range(l, chunk);
    for (int64_t k = r.begin + threadIdx.x; k < r.end; k += kThreads) exact_sum_add(limb, flags, square_of(a.p[r.t], k));
  }
  for (int j = 0; j < kLimbs; ++j)
    if (limb[j]) atomicAdd(&block_limbs[j], static_cast<unsigned long long>(limb[j]));
  atomicOr(&block_flags, flags);
  __syncthreads();
  if (threadIdx.x < kLimbs && block_limbs[threadIdx.x])
    atomicAdd(reinterpret_cast<unsigned long long*>(scratch + threadIdx.x), block_limbs[threadIdx.x]);
  if (threadIdx.x == 0 && block_flags)
    atomicOr(reinterpret_cast<unsigned long long*>(scratch + kFlagsWord), static_cast<unsigned long long>(block_flags));
}

__global__ void finish_kernel(int64_t* scratch, bool take_sqrt, float* out) {
  double value = bits_to_double(static_cast<uint64_t>(scratch[kValueWord]));
  if (!scratch[kDecidedWord])
    value = reduce_round_exact_sum(scratch, static_cast<uint32_t>(scratch[kFlagsWord]), 1, false, state_format());
  if (take_sqrt) value = norm_from_sum_of_squares(value);
  store_value(out, 0, value, state_format());
}

template <typename Fn>
void with_types(const at::Tensor& t, Fn&& fn) {
  with_element_type(t.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format_of(t.scalar_type()), [&](auto fmt) { fn(T{}, decltype(fmt){}); });
  });
}

// The pointers of list entry k = tensors[i] of each given list (an empty list: null).
template <typename T>
void set_entry(StepLists<T>& a, int k, size_t i, at::TensorList p, at::TensorList g, at::TensorList s1,
               at::TensorList s2, at::TensorList s3, at::TensorList steps) {
  a.p[k] = p[i].mutable_data_ptr<T>();
  a.g[k] = g.empty() ? nullptr : g[i].const_data_ptr<T>();
  a.s1[k] = s1.empty() ? nullptr : s1[i].mutable_data_ptr<float>();
  a.s2[k] = s2.empty() ? nullptr : s2[i].mutable_data_ptr<float>();
  a.s3[k] = s3.empty() ? nullptr : s3[i].mutable_data_ptr<float>();
  a.step[k] = steps.empty() ? nullptr : steps[i].const_data_ptr<float>();
}

// fn(lists, chunks, T{}, F{}) for each list launch over p (chunks of `chunk` elements), the entries filled from
// the lists given (tensors matching p's, or empty).
template <typename Fn>
void for_each_launch(at::TensorList p, at::TensorList g, at::TensorList s1, at::TensorList s2, at::TensorList s3,
                     at::TensorList steps, int64_t chunk, Fn&& fn) {
  for_each_tensor_list(p, chunk, [&](const std::vector<size_t>& run, const ListChunks& l) {
    with_types(p[run[0]], [&](auto element, auto fmt) {
      using T = decltype(element);
      StepLists<T> a{};
      for (int k = 0; k < l.count; ++k) set_entry(a, k, run[k], p, g, s1, s2, s3, steps);
      fn(a, l, element, fmt);
    });
  });
}

}  // namespace

void adam_step_cuda(at::TensorList p, at::TensorList g, at::TensorList m, at::TensorList v, at::TensorList w,
                    at::TensorList steps, const AdamConstants& c, const AdamStepSource& source) {
  if (p.empty()) return;
  const c10::cuda::CUDAGuard guard(p[0].device());
  const auto stream = current_stream();
  for_each_launch(p, g, m, v, w, steps, kStepChunk, [&](const auto& a, const ListChunks& l, auto element, auto fmt) {
    using T = decltype(element);
    using F = decltype(fmt);
    if (!w.empty())
      adam_kernel<T, F, true><<<list_blocks(l), kThreads, 0, stream>>>(a, l, c, source);
    else
      adam_kernel<T, F, false><<<list_blocks(l), kThreads, 0, stream>>>(a, l, c, source);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void sgd_step_cuda(at::TensorList p, at::TensorList g, at::TensorList b, const SgdConstants& c) {
  if (p.empty()) return;
  const c10::cuda::CUDAGuard guard(p[0].device());
  const auto stream = current_stream();
  for_each_launch(p, g, b, {}, {}, {}, kStepChunk, [&](const auto& a, const ListChunks& l, auto element, auto fmt) {
    sgd_kernel<decltype(element), decltype(fmt)><<<list_blocks(l), kThreads, 0, stream>>>(a, l, c);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void clip_scale_cuda(at::TensorList grads, const at::Tensor& total_norm, double max_norm, double eps) {
  const c10::cuda::CUDAGuard guard(total_norm.device());
  const auto stream = current_stream();
  for_each_launch(grads, {}, {}, {}, {}, {}, kStepChunk, [&](const auto& a, const ListChunks& l, auto element,
                                                             auto fmt) {
    clip_kernel<decltype(element), decltype(fmt)><<<list_blocks(l), kThreads, 0, stream>>>(
        a, l, total_norm.const_data_ptr<float>(), max_norm, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor sum_squares_cuda(at::TensorList tensors, bool take_sqrt) {
  const c10::cuda::CUDAGuard guard(tensors[0].device());
  const auto stream = current_stream();
  int64_t chunks = 0, n = 0;
  for (const at::Tensor& t : tensors) {
    chunks += (t.numel() + kChunk - 1) / kChunk;
    n += t.numel();
  }
  at::Tensor scratch = at::zeros({kPartials + std::max<int64_t>(chunks, 1)}, tensors[0].options().dtype(at::kLong));
  int64_t* s = scratch.mutable_data_ptr<int64_t>();
  double* partials = reinterpret_cast<double*>(s + kPartials);
  int64_t base = 0;
  for_each_launch(tensors, {}, {}, {}, {}, {}, kChunk, [&](const auto& a, const ListChunks& l, auto element, auto) {
    chunk_squares_kernel<decltype(element)><<<list_blocks(l), kThreads, 0, stream>>>(a, l, partials + base);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    base += l.first_chunk[l.count];
  });
  decide_kernel<<<1, kWarpSize, 0, stream>>>(s, chunks, std::max<int64_t>(n, 1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  for_each_launch(tensors, {}, {}, {}, {}, {}, kChunk, [&](const auto& a, const ListChunks& l, auto element, auto) {
    exact_squares_kernel<decltype(element)><<<list_blocks(l), kThreads, 0, stream>>>(a, l, s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  at::Tensor out = at::empty({}, tensors[0].options().dtype(at::kFloat));
  finish_kernel<<<1, 1, 0, stream>>>(s, take_sqrt, out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace carbon
