// CUDA kernels of the optimizer family. The per-element updates are
// optim_kernel.h's, as on the CPU; grid-stride loops on the current stream,
// no host synchronization. The sum of squares:
//   pass 1  per tensor, fixed chunks of kChunk elements: fp64 sums of squares;
//   pass 2  one warp adds the chunk partials and decides (tier 1);
//   pass 3  only if undecided (each kernel exits at once otherwise): exact
//           accumulators per block, merged with 64-bit integer atomics (exact
//           and order-independent), then rounded.
// No result depends on the grid.
#include <c10/cuda/CUDAGuard.h>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "optim.h"

namespace carbon {
namespace {

constexpr int kThreads = 256;

// kAmsgrad: w is AMSGrad's max_exp_avg_sq (else null, never read).
template <typename T, typename F, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(T* __restrict__ p, const T* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                float* __restrict__ w, int64_t n, AdamConstants c, AdamStepSource source) {
  constexpr FloatFormat f = F::get();
  // A capturable step: every thread derives the same constants from t and
  // lr in device memory (a few dozen fp64 operations, the host's sequence).
  if (source.step) c = constants_at(c, source);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double w0 = kAmsgrad ? load(w, i) : 0.0;
    const AdamResult r = adam_update<kAmsgrad>(load(p, i), load(g, i), load(m, i), load(v, i), w0, c, f);
    store_value(m, i, r.m, state_format());
    store_value(v, i, r.v, state_format());
    if constexpr (kAmsgrad) store_value(w, i, r.v_max, state_format());
    store_value(p, i, r.p, f);
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(T* __restrict__ p, const T* __restrict__ g, float* __restrict__ b, int64_t n, SgdConstants c) {
  constexpr FloatFormat f = F::get();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double b0 = (b && !c.first_step) ? load(b, i) : 0.0;
    const SgdResult r = sgd_update(load(p, i), load(g, i), b0, c, f);
    if (b) store_value(b, i, r.b, state_format());
    store_value(p, i, r.p, f);
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    clip_kernel(T* __restrict__ g, int64_t n, const float* __restrict__ total, double max_norm, double eps) {
  constexpr FloatFormat f = F::get();
  const double coef = clip_coefficient(load(total, 0), max_norm, eps);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double scaled = load(g, i) * coef;
    store_value(g, i, round_double(scaled, f), f);
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    chunk_squares_kernel(const T* __restrict__ x, int64_t n, double* __restrict__ partials) {
  __shared__ double warp_s[kThreads / kWarpSize];
  const int64_t c = blockIdx.x;
  const int64_t len = min(kChunk, n - c * kChunk);
  const T* chunk = x + c * kChunk;
  double s = 0.0;
  for (int64_t k = threadIdx.x; k < len; k += kThreads) s = s + square_of(chunk, k);
  s = warp_sum(s);
  if (lane_id() == 0) warp_s[threadIdx.x / kWarpSize] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kThreads / kWarpSize; ++w) t = t + warp_s[w];
    partials[c] = t;
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

// Tier 3 for one tensor, only when tier 1 did not decide.
template <typename T>
__global__ void __launch_bounds__(kThreads) exact_squares_kernel(const T* __restrict__ x, int64_t n, int64_t* scratch) {
  if (scratch[kDecidedWord]) return;
  __shared__ unsigned long long block_limbs[kLimbs];
  __shared__ unsigned int block_flags;
  if (threadIdx.x < kLimbs) block_limbs[threadIdx.x] = 0;
  if (threadIdx.x == 0) block_flags = 0;
  __syncthreads();
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    exact_sum_add(limb, flags, square_of(x, i));
  for (int l = 0; l < kLimbs; ++l)
    if (limb[l]) atomicAdd(&block_limbs[l], static_cast<unsigned long long>(limb[l]));
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

}  // namespace

void adam_step_cuda(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                    const at::Tensor* w, const AdamConstants& c, const AdamStepSource& source) {
  const c10::cuda::CUDAGuard guard(p.device());
  const int64_t n = p.numel();
  const auto stream = at::cuda::getCurrentCUDAStream();
  with_types(p, [&](auto element, auto fmt) {
    using T = decltype(element);
    using F = decltype(fmt);
    T* pp = p.mutable_data_ptr<T>();
    const T* gp = g.const_data_ptr<T>();
    float* mp = m.mutable_data_ptr<float>();
    float* vp = v.mutable_data_ptr<float>();
    const int blocks = blocks_for(n, kThreads);
    if (w) {
      adam_kernel<T, F, true><<<blocks, kThreads, 0, stream>>>(pp, gp, mp, vp, w->mutable_data_ptr<float>(), n, c,
                                                               source);
    } else {
      adam_kernel<T, F, false><<<blocks, kThreads, 0, stream>>>(pp, gp, mp, vp, nullptr, n, c, source);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void sgd_step_cuda(const at::Tensor& p, const at::Tensor& g, const at::Tensor* b, const SgdConstants& c) {
  const c10::cuda::CUDAGuard guard(p.device());
  const int64_t n = p.numel();
  with_types(p, [&](auto element, auto fmt) {
    using T = decltype(element);
    sgd_kernel<T, decltype(fmt)><<<blocks_for(n, kThreads), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        p.mutable_data_ptr<T>(), g.const_data_ptr<T>(), b ? b->mutable_data_ptr<float>() : nullptr, n, c);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void clip_scale_cuda(at::TensorList grads, const at::Tensor& total_norm, double max_norm, double eps) {
  const c10::cuda::CUDAGuard guard(total_norm.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  for (const at::Tensor& g : grads) {
    const int64_t n = g.numel();
    if (n == 0) continue;
    with_types(g, [&](auto element, auto fmt) {
      using T = decltype(element);
      clip_kernel<T, decltype(fmt)><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          g.mutable_data_ptr<T>(), n, total_norm.const_data_ptr<float>(), max_norm, eps);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

at::Tensor sum_squares_cuda(at::TensorList tensors, bool take_sqrt) {
  const c10::cuda::CUDAGuard guard(tensors[0].device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  int64_t chunks = 0, n = 0;
  for (const at::Tensor& t : tensors) {
    chunks += (t.numel() + kChunk - 1) / kChunk;
    n += t.numel();
  }
  at::Tensor scratch = at::zeros({kPartials + std::max<int64_t>(chunks, 1)}, tensors[0].options().dtype(at::kLong));
  int64_t* s = scratch.mutable_data_ptr<int64_t>();
  double* partials = reinterpret_cast<double*>(s + kPartials);
  int64_t base = 0;
  for (const at::Tensor& t : tensors) {
    const int64_t c = (t.numel() + kChunk - 1) / kChunk;
    if (c == 0) continue;
    with_element_type(t.scalar_type(), [&](auto element) {
      using T = decltype(element);
      chunk_squares_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(t.const_data_ptr<T>(), t.numel(),
                                                                                partials + base);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    base += c;
  }
  decide_kernel<<<1, kWarpSize, 0, stream>>>(s, chunks, std::max<int64_t>(n, 1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    with_element_type(t.scalar_type(), [&](auto element) {
      using T = decltype(element);
      exact_squares_kernel<T><<<blocks_for(t.numel(), kThreads), kThreads, 0, stream>>>(t.const_data_ptr<T>(),
                                                                                       t.numel(), s);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  at::Tensor out = at::empty({}, tensors[0].options().dtype(at::kFloat));
  finish_kernel<<<1, 1, 0, stream>>>(s, take_sqrt, out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace carbon
