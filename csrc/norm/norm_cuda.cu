// CUDA kernels of layer_norm and rms_norm: one warp per row (a grid-stride
// loop over rows, so nothing depends on the grid). The lanes split the row
// (lane l takes elements l, l + 32, ...), sum in fp64 and combine with a
// butterfly (every lane ends with the same bits, so the tier decisions are
// warp-uniform): depth ceil(n / 32) + 5 additions. Undecided statistics
// merge per-lane exact accumulators (integer sums, exact). The formulas and
// decisions are those of norm_kernel.h, shared with the CPU, hence the same
// bits. Forward: the row is read from global memory once when it fits in
// shared memory (n <= 4096 on sm_80 / sm_90: each warp keeps its row as
// float32, exact for every input format), else re-read for each pass (statistics, then
// outputs; the re-reads are mostly served by L1/L2). Backward re-reads x and
// dy (two passes). The weight and bias gradients are exact column sums over
// the rows (column_sums.cuh: x and dy read once, in place). No host
// synchronization; launches on the current stream.
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <mutex>
#include <tuple>
#include <vector>

#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "../reduce/column_sums.cuh"
#include "norm.h"
#include "norm_kernel.h"

namespace carbon {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpSize * kWarpsPerBlock;
// Row cache per block (dynamic shared memory, the kernels' only shared
// memory): up to 24 KB without the opt-in attribute (n <= 1536: nine blocks
// per SM by shared memory, sixteen by threads); up to 64 KB (n <= 4096, three
// blocks per SM on sm_90) with it, where the device allows it. Larger rows
// are re-read instead.
constexpr size_t kDefaultCacheBytes = 24 * 1024;
constexpr size_t kMaxCacheBytes = 64 * 1024;

__device__ __forceinline__ int64_t warp_depth(int64_t n) { return (n + kWarpSize - 1) / kWarpSize + 6; }

// Exact tier on a warp: RN32(sum of the terms / n), the terms of element k
// added by add(limb, flags, k). Every lane returns the value.
template <typename Add>
__device__ double warp_exact_mean(int64_t n, Add add) {
  int64_t storage[kLimbs];
  int64_t* limb = lane_limbs(storage);
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = lane_id(); k < n; k += kWarpSize) add(limb, flags, k);
  flags = warp_merge_limbs(limb, flags);
  return exact_mean_round(limb, flags, n);
}

__device__ __forceinline__ uint32_t bits32(double v) { return encode(v, F32::get()); }

template <typename T, bool kCached>
__global__ void __launch_bounds__(kThreads)
    norm_forward_kernel(const T* __restrict__ x, int64_t rows, int64_t n, const T* __restrict__ w,
                        const T* __restrict__ b, double eps32, bool rms, typename FormatOf<T>::type::Bits* __restrict__ y,
                        uint32_t* __restrict__ mean, uint32_t* __restrict__ rstd) {
  using F = typename FormatOf<T>::type;
  constexpr FloatFormat f = F::get();
  extern __shared__ float row_cache[];  // kCached: kWarpsPerBlock rows of n floats
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  float* cache = row_cache + (kCached ? static_cast<int64_t>(warp) * n : 0);
  const int64_t depth = warp_depth(n);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = x + r * n;
    // First read of element k (by lane k % 32): from global memory, kept in
    // the cache; later reads by the same lane come from the cache.
    auto first = [&](int64_t k) {
      const double v = element_value(row[k]);
      if (kCached) cache[k] = static_cast<float>(v);  // exact: v is a float32 value
      return v;
    };
    auto value = [&](int64_t k) { return kCached ? static_cast<double>(cache[k]) : element_value(row[k]); };
    double mu = 0.0, var;
    if (rms) {
      double t = 0.0;
      for (int64_t k = lane; k < n; k += kWarpSize) {
        const double v = first(k);
        t = t + v * v;
      }
      t = warp_sum(t);
      if (!mean_of_squares_fast(t, n, depth, 0, &var))
        var = warp_exact_mean(n, [&](int64_t* l, uint32_t& fl, int64_t k) {
          const double v = value(k);
          exact_sum_add_product(l, fl, v, v);
        });
    } else {
      double s = 0.0, a = 0.0;
      for (int64_t k = lane; k < n; k += kWarpSize) {
        const double v = first(k);
        s = s + v;
        a = a + abs_value(v);
      }
      s = warp_sum(s);
      a = warp_sum(a);
      if (!mean_fast(s, a, n, depth, &mu))
        mu = warp_exact_mean(n, [&](int64_t* l, uint32_t& fl, int64_t k) { exact_sum_add(l, fl, value(k)); });
      if (!is_finite(mu)) {
        var = canonical_nan();
      } else {
        double t = 0.0;
        for (int64_t k = lane; k < n; k += kWarpSize) {
          const double d = value(k) - mu;
          t = t + d * d;
        }
        t = warp_sum(t);
        if (!mean_of_squares_fast(t, n, depth, 3, &var))
          var = warp_exact_mean(n, [&](int64_t* l, uint32_t& fl, int64_t k) {
            add_centered_square(l, fl, value(k), mu);
          });
      }
    }
    const double rs = rstd_of(var, eps32);
    if (lane == 0) {
      if (!rms) mean[r] = bits32(mu);
      rstd[r] = bits32(rs);
    }
    auto* out = y + r * n;
    for (int64_t k = lane; k < n; k += kWarpSize) {
      const double v = value(k);
      const double xh = rms ? rms_xhat(v, rs) : ln_xhat(v, mu, rs);
      double wk = 1.0, bk = 0.0;
      if (w) wk = element_value(w[k]);
      if (b) bk = element_value(b[k]);
      out[k] = static_cast<typename F::Bits>(encode(round_double(affine(xh, w ? &wk : nullptr, b ? &bk : nullptr), f), f));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy, int64_t rows, int64_t n,
                         const T* __restrict__ w, bool rms, const uint32_t* __restrict__ mean,
                         const uint32_t* __restrict__ rstd, typename FormatOf<T>::type::Bits* __restrict__ dx) {
  using F = typename FormatOf<T>::type;
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  const int64_t depth = warp_depth(n);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* xrow = x + r * n;
    const T* dyrow = dy + r * n;
    const double mu = rms ? 0.0 : decode(mean[r], F32::get());
    const double rs = decode(rstd[r], F32::get());
    // xhat and g of element k (recomputed, identical every time).
    auto terms = [&](int64_t k, double& xh, double& g) {
      const double v = element_value(xrow[k]);
      xh = rms ? rms_xhat(v, rs) : ln_xhat(v, mu, rs);
      double wk = 1.0;
      if (w) wk = element_value(w[k]);
      g = scaled_grad(element_value(dyrow[k]), w ? &wk : nullptr);
    };
    double gs = 0.0, ga = 0.0, ps = 0.0, pa = 0.0;
    for (int64_t k = lane; k < n; k += kWarpSize) {
      double xh, g;
      terms(k, xh, g);
      const double p = g * xh;
      gs = gs + g;
      ga = ga + abs_value(g);
      ps = ps + p;
      pa = pa + abs_value(p);
    }
    double A = 0.0, B;
    if (!rms) {
      gs = warp_sum(gs);
      ga = warp_sum(ga);
      if (!mean_fast(gs, ga, n, depth, &A))
        A = warp_exact_mean(n, [&](int64_t* l, uint32_t& fl, int64_t k) {
          double xh, g;
          terms(k, xh, g);
          exact_sum_add(l, fl, g);
        });
    }
    ps = warp_sum(ps);
    pa = warp_sum(pa);
    if (!mean_fast(ps, pa, n, depth, &B))
      B = warp_exact_mean(n, [&](int64_t* l, uint32_t& fl, int64_t k) {
        double xh, g;
        terms(k, xh, g);
        exact_sum_add_product(l, fl, g, xh);
      });
    auto* out = dx + r * n;
    for (int64_t k = lane; k < n; k += kWarpSize) {
      double xh, g;
      terms(k, xh, g);
      const double v = rms ? rms_dx(g, xh, B, rs) : ln_dx(g, xh, A, B, rs);
      out[k] = static_cast<typename F::Bits>(encode(round_double(v, f), f));
    }
  }
}

// The column terms of the parameter gradients: dweight's dy (x) xhat (exact:
// two float32 values) and dbias's dy, for the families wanted.
template <typename T, bool kW, bool kB>
struct ParamGradTerms {
  static constexpr int kQ = static_cast<int>(kW) + static_cast<int>(kB);
  const T* x;
  const T* dy;
  const uint32_t* mean;  // null for rms_norm
  const uint32_t* rstd;
  int64_t n;
  __device__ void operator()(int64_t r, int64_t c, double (&t)[kQ]) const {
    const double g = element_value(dy[r * n + c]);
    if constexpr (kW) {
      const double v = element_value(x[r * n + c]);
      const double rs = decode(rstd[r], F32::get());
      t[0] = g * (mean ? ln_xhat(v, decode(mean[r], F32::get()), rs) : rms_xhat(v, rs));
    }
    if constexpr (kB) t[kQ - 1] = g;
  }
};

// The dynamic shared memory a kernel may opt into is an attribute of the kernel on a device, not of a launch.
// Setting it to each call's own size would race with another host thread doing the same for another size
// between its set and its launch; so it is raised once per device to the largest size any call there uses.
template <typename T>
void allow_largest_cache(size_t optin) {
  static std::mutex mutex;
  static std::vector<bool> raised;  // by device index
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(raised.size()) <= device) raised.resize(static_cast<size_t>(device) + 1, false);
  if (raised[static_cast<size_t>(device)]) return;
  const size_t largest = std::min(kMaxCacheBytes, optin - 1024);
  C10_CUDA_CHECK(cudaFuncSetAttribute(norm_forward_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(largest)));
  raised[static_cast<size_t>(device)] = true;
}

template <typename T>
const T* param_ptr(const at::Tensor& p) {
  return p.defined() ? p.const_data_ptr<T>() : nullptr;
}

}  // namespace

void norm_forward_cuda(const NormArgs& a, at::Tensor& y) {
  const c10::cuda::CUDAGuard guard(a.x.device());
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const int blocks = blocks_for(rows * kWarpSize, kThreads);
  const auto stream = current_stream();
  uint32_t* mean = a.rms ? nullptr : static_cast<uint32_t*>(a.mean.mutable_data_ptr());
  uint32_t* rstd = static_cast<uint32_t*>(a.rstd.mutable_data_ptr());
  with_element_type(a.x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    using Bits = typename FormatOf<T>::type::Bits;
    const auto args = std::make_tuple(a.x.const_data_ptr<T>(), rows, n, param_ptr<T>(a.weight), param_ptr<T>(a.bias),
                                      a.eps32, a.rms, static_cast<Bits*>(y.mutable_data_ptr()), mean, rstd);
    const size_t cache_bytes = static_cast<size_t>(kWarpsPerBlock) * static_cast<size_t>(n) * sizeof(float);
    const size_t optin = current_shared_memory_per_block_optin();
    const bool cached = cache_bytes <= kDefaultCacheBytes ||
                        (cache_bytes <= kMaxCacheBytes && cache_bytes + 1024 <= optin);
    if (cached) {
      if (cache_bytes > kDefaultCacheBytes) allow_largest_cache<T>(optin);
      std::apply([&](auto... p) { norm_forward_kernel<T, true><<<blocks, kThreads, cache_bytes, stream>>>(p...); },
                 args);
    } else {
      std::apply([&](auto... p) { norm_forward_kernel<T, false><<<blocks, kThreads, 0, stream>>>(p...); }, args);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void norm_backward_cuda(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx) {
  const c10::cuda::CUDAGuard guard(a.x.device());
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const int blocks = blocks_for(rows * kWarpSize, kThreads);
  const auto stream = current_stream();
  const uint32_t* mean = a.rms ? nullptr : static_cast<const uint32_t*>(a.mean.const_data_ptr());
  const uint32_t* rstd = static_cast<const uint32_t*>(a.rstd.const_data_ptr());
  with_element_type(a.x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    using Bits = typename FormatOf<T>::type::Bits;
    norm_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(a.x.const_data_ptr<T>(), dy.const_data_ptr<T>(), rows,
                                                             n, param_ptr<T>(a.weight), a.rms, mean, rstd,
                                                             static_cast<Bits*>(dx.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void norm_param_grads_cuda(const NormArgs& a, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db) {
  const c10::cuda::CUDAGuard guard(a.x.device());
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const uint32_t* mean = a.rms ? nullptr : static_cast<const uint32_t*>(a.mean.const_data_ptr());
  const uint32_t* rstd = static_cast<const uint32_t*>(a.rstd.const_data_ptr());
  with_element_type(a.x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    using F = typename FormatOf<T>::type;
    using Bits = typename F::Bits;
    const T* x = a.x.const_data_ptr<T>();
    const T* g = dy.const_data_ptr<T>();
    auto* w = dw.defined() ? static_cast<Bits*>(dw.mutable_data_ptr()) : nullptr;
    auto* b = db.defined() ? static_cast<Bits*>(db.mutable_data_ptr()) : nullptr;
    if (w && b)
      column_sums_cuda<F>(ParamGradTerms<T, true, true>{x, g, mean, rstd, n}, rows, n, false, {w, b}, a.x.options());
    else if (w)
      column_sums_cuda<F>(ParamGradTerms<T, true, false>{x, g, mean, rstd, n}, rows, n, false, {w}, a.x.options());
    else if (b)
      column_sums_cuda<F>(ParamGradTerms<T, false, true>{x, g, mean, rstd, n}, rows, n, false, {b}, a.x.options());
  });
}

}  // namespace carbon
