// CUDA kernels of softmax, log_softmax and cross-entropy, forward and
// backward. Long rows, or few of them: one block per row (blocks loop over
// rows). Many short rows (n <= 1024, at least 32 rows per SM: attention's
// rows): one warp per row, reduced by shuffles instead of a block's
// shared-memory tree and its barriers. The row's maximum is order-free; its
// one sum is decided by tier 1 from any tree (the bound holds for the
// tree's depth), and the rare undecided row is finished exactly (by thread
// 0, or by the row's warp). So the bits equal the CPU's, whatever the grid
// and whichever kernel runs. Nothing here synchronizes with the host.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "../convert/round_to.h"
#include "../cuda_launch.cuh"
#include "../dtypes.h"
#include "../exact/warp_exact.cuh"
#include "../reduce/warp_tiers.cuh"
#include "softmax.h"
#include "softmax_kernel.h"

namespace carbon {
namespace {

constexpr int kThreads = 256;
constexpr int kTreeDepth = 8;  // log2(kThreads)

// Each thread's strided sequence has at most this many additions, then the
// shared-memory tree adds kTreeDepth more.
__device__ int64_t block_depth(int64_t n) { return (n + kThreads - 1) / kThreads + kTreeDepth + 1; }

// Sums (and maxes) over the block through shared memory; every thread gets
// the result. Ends with a barrier, so the scratch can be reused at once.
struct BlockScratch {
  double a[kThreads];
  double b[kThreads];
};

__device__ void block_sum2(BlockScratch& sh, double& x, double& y) {
  const int tid = threadIdx.x;
  sh.a[tid] = x;
  sh.b[tid] = y;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (tid < width) {
      sh.a[tid] = sh.a[tid] + sh.a[tid + width];
      sh.b[tid] = sh.b[tid] + sh.b[tid + width];
    }
    __syncthreads();
  }
  x = sh.a[0];
  y = sh.b[0];
  __syncthreads();
}

__device__ RowMax block_max(BlockScratch& sh, const RowMax& mine) {
  const int tid = threadIdx.x;
  sh.a[tid] = mine.m;
  sh.b[tid] = mine.nan ? 1.0 : 0.0;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (tid < width) {
      if (sh.a[tid + width] > sh.a[tid]) sh.a[tid] = sh.a[tid + width];
      if (sh.b[tid + width] > sh.b[tid]) sh.b[tid] = sh.b[tid + width];
    }
    __syncthreads();
  }
  RowMax all;
  all.m = static_cast<float>(sh.a[0]);
  all.nan = sh.b[0] != 0.0;
  __syncthreads();
  return all;
}

template <typename F>
__device__ typename F::Bits bits_of(double value) {
  return static_cast<typename F::Bits>(encode(value, F::get()));
}

// One row on the whole block. Returns through *shared_value the row's S
// (softmax) or L (log_softmax), after writing the row.
template <typename T, typename F, bool kLog>
__device__ void softmax_row(const T* row, int64_t n, typename F::Bits* o, BlockScratch& sh, double* shared_value,
                            bool masked_nan = false) {
  constexpr FloatFormat f = F::get();
  const int tid = threadIdx.x;
  RowMax mine;
  for (int64_t j = tid; j < n; j += kThreads) row_max_add(mine, static_cast<float>(element_value(row[j])));
  const RowMax mx = block_max(sh, mine);
  const RowCase c = row_case(mx);
  if (c != RowCase::kNormal) {
    const double fill = special_row_fill(c, kLog, masked_nan);
    for (int64_t j = tid; j < n; j += kThreads) o[j] = bits_of<F>(fill);
    return;
  }
  double s = 0.0, unused = 0.0;
  for (int64_t j = tid; j < n; j += kThreads) s = s + softmax_exp(static_cast<float>(element_value(row[j])), mx.m);
  block_sum2(sh, s, unused);
  if (tid == 0) {
    double S;
    if (!softmax_sum_if_decided(s, block_depth(n), &S))
      S = reduce_exact_values(
          n, [&](int64_t k) { return static_cast<double>(softmax_exp(static_cast<float>(element_value(row[k])), mx.m)); },
          s, false, float32_format());
    *shared_value = kLog ? static_cast<double>(log32(static_cast<float>(S))) : S;
  }
  __syncthreads();
  const double v = *shared_value;
  for (int64_t j = tid; j < n; j += kThreads) {
    const float xj = static_cast<float>(element_value(row[j]));
    o[j] = bits_of<F>(kLog ? log_softmax_value(xj, mx.m, v, f) : softmax_value(softmax_exp(xj, mx.m), v, f));
  }
  __syncthreads();  // *shared_value is rewritten by the next row
}

template <typename T, typename F, bool kLog>
__global__ void softmax_rows_kernel(const T* x, int64_t rows, int64_t n, bool masked_nan, typename F::Bits* out) {
  __shared__ BlockScratch sh;
  __shared__ double value;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_row<T, F, kLog>(x + r * n, n, out + r * n, sh, &value, masked_nan);
}

// The terms of a gradient row's sum: g_k (log_softmax) or g_k y_k (softmax), exact in fp64.
template <typename T, bool kLog>
struct GradRow {
  const T* g;
  const T* y;
  __device__ double operator()(int64_t k) const {
    return kLog ? element_value(g[k]) : element_value(g[k]) * element_value(y[k]);
  }
};

// One thread's share of those terms (k = first, first + step, ...): their fp64 sum and absolute sum, and
// whether one of them is not -0.
struct GradPartial {
  double s = 0.0, a = 0.0;
  bool not_negative_zero = false;
};
template <typename Terms>
__device__ GradPartial grad_partial(const Terms& term, int64_t first, int64_t n, int64_t step) {
  GradPartial p;
  for (int64_t k = first; k < n; k += step) {
    const double t = term(k);
    p.s = p.s + t;
    p.a = p.a + abs_value(t);
    p.not_negative_zero |= double_to_bits(t) != kSignBit;
  }
  return p;
}

template <typename T, typename F, bool kLog>
__global__ void softmax_backward_rows_kernel(const T* g, const T* y, int64_t rows, int64_t n,
                                             typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  __shared__ BlockScratch sh;
  __shared__ double shared_sum;
  const int tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    const GradRow<T, kLog> term{gr, yr};
    const GradPartial p = grad_partial(term, tid, n, kThreads);
    double s = p.s, a = p.a;
    const bool not_negative_zero = p.not_negative_zero;
    block_sum2(sh, s, a);
    // a == 0: every term is ±0 (a row with no incoming gradient, e.g. a padded position), so D is an exact zero,
    // -0 iff every term is -0 (exact_zero's rule, as the exact tiers would give), without thread 0's two serial
    // passes. __syncthreads_or is reached by the whole block (the row loop is block-uniform).
    const bool some_not_negative_zero = __syncthreads_or(not_negative_zero) != 0;
    if (tid == 0) {
      double D;
      if (a == 0.0)
        D = exact_zero(kSawTerm | (some_not_negative_zero ? kSawNonNegZero : 0u));
      else if (!grad_sum_if_decided(s, a, block_depth(n), &D))
        D = reduce_exact_values(n, term, a, false, float32_format());
      shared_sum = D;
    }
    __syncthreads();
    const double D = shared_sum;
    for (int64_t j = tid; j < n; j += kThreads) {
      const double yj = element_value(yr[j]), gj = element_value(gr[j]);
      out[r * n + j] = bits_of<F>(kLog ? log_softmax_grad_value(yj, gj, D, f) : softmax_grad_value(yj, gj, D, f));
    }
    __syncthreads();
  }
}

// ---- many short rows: one warp per row.
constexpr int kRowWarps = 4;             // warps (rows at a time) per block
constexpr int64_t kWarpRowMax = 1024;    // at most 32 elements per lane
constexpr int64_t kWarpRowsPerSm = 32;   // fewer rows than this per SM keep a block per row

__device__ __forceinline__ int64_t warp_row_depth(int64_t n) { return (n + kWarpSize - 1) / kWarpSize + 6; }

__device__ RowMax warp_max(RowMax r) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    RowMax other;
    other.m = __shfl_xor_sync(kFullWarp, r.m, off);
    other.nan = __shfl_xor_sync(kFullWarp, r.nan ? 1 : 0, off) != 0;
    r = row_max_merge(r, other);
  }
  return r;
}

template <typename T, typename F, bool kLog>
__global__ void __launch_bounds__(kWarpSize* kRowWarps)
    softmax_warp_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, bool masked_nan,
                             typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  // Warp-uniform loop: every lane of a warp works on the same row.
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const T* row = x + r * n;
    typename F::Bits* o = out + r * n;
    auto at = [&](int64_t k) { return static_cast<float>(element_value(row[k])); };
    RowMax mine;
    for (int64_t k = lane; k < n; k += kWarpSize) row_max_add(mine, at(k));
    const RowMax mx = warp_max(mine);
    const RowCase c = row_case(mx);
    if (c != RowCase::kNormal) {
      const double fill = special_row_fill(c, kLog, masked_nan);
      for (int64_t k = lane; k < n; k += kWarpSize) o[k] = bits_of<F>(fill);
      continue;
    }
    double s = 0.0;
    for (int64_t k = lane; k < n; k += kWarpSize) s = s + softmax_exp(at(k), mx.m);
    s = warp_sum(s);
    double S;
    if (!softmax_sum_if_decided(s, warp_row_depth(n), &S))  // terms >= 0: s is their absolute sum too
      S = warp_round_exact_terms(
          n, [&](int64_t k) { return static_cast<double>(softmax_exp(at(k), mx.m)); }, s, false, float32_format());
    const double v = kLog ? static_cast<double>(log32(static_cast<float>(S))) : S;
    for (int64_t k = lane; k < n; k += kWarpSize)
      o[k] = bits_of<F>(kLog ? log_softmax_value(at(k), mx.m, v, f) : softmax_value(softmax_exp(at(k), mx.m), v, f));
  }
}

template <typename T, typename F, bool kLog>
__global__ void __launch_bounds__(kWarpSize* kRowWarps)
    softmax_backward_warp_rows_kernel(const T* __restrict__ g, const T* __restrict__ y, int64_t rows, int64_t n,
                                      typename F::Bits* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  const int warp = threadIdx.x / kWarpSize, lane = lane_id();
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    const GradRow<T, kLog> term{gr, yr};
    const GradPartial p = grad_partial(term, lane, n, kWarpSize);
    const double s = warp_sum(p.s), a = warp_sum(p.a);
    const bool some_not_negative_zero = __any_sync(kFullWarp, p.not_negative_zero);
    double D;
    if (a == 0.0)  // every term is +-0: an exact zero, -0 iff every term is -0 (as in the block kernel)
      D = exact_zero(kSawTerm | (some_not_negative_zero ? kSawNonNegZero : 0u));
    else if (!grad_sum_if_decided(s, a, warp_row_depth(n), &D))
      D = warp_round_exact_terms(n, term, a, false, float32_format());
    for (int64_t k = lane; k < n; k += kWarpSize) {
      const double yk = element_value(yr[k]), gk = element_value(gr[k]);
      out[r * n + k] = bits_of<F>(kLog ? log_softmax_grad_value(yk, gk, D, f) : softmax_grad_value(yk, gk, D, f));
    }
  }
}

// Whether rows of n go to the warp kernels.
bool warp_rows(int64_t rows, int64_t n) {
  const int64_t sms = current_sm_count();
  return n <= kWarpRowMax && rows >= sms * kWarpRowsPerSm;
}

int warp_row_blocks(int64_t rows) { return blocks_for(rows * kWarpSize, kWarpSize * kRowWarps); }

// Cross-entropy rows: log_probs and each row's float32 loss (NaN for a
// target out of range: checking it would need a host synchronization).
template <typename T>
__global__ void cross_entropy_rows_kernel(const T* x, const int64_t* target, int64_t N, int64_t C,
                                          int64_t ignore_index, double eps, float* log_probs, float* row_loss) {
  using F32 = Format<FormatId::kFloat32>;
  __shared__ BlockScratch sh;
  __shared__ double value;
  const int tid = threadIdx.x;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    // softmax_row writes the row's bits as uint32_t; read them back through
    // the same type (a float* read of memory stored through a uint32_t* is
    // undefined behaviour, which a compiler may reorder before the store).
    uint32_t* lsm_bits = reinterpret_cast<uint32_t*>(log_probs + i * C);
    auto lsm = [lsm_bits](int64_t j) { return __uint_as_float(lsm_bits[j]); };
    softmax_row<T, F32, true>(x + i * C, C, lsm_bits, sh, &value);
    const int64_t t = target[i];
    if (t == ignore_index) {
      if (tid == 0) row_loss[i] = 0.0f;
      continue;
    }
    double s = 0.0, a = 0.0;
    if (eps != 0.0)
      for (int64_t j = tid; j < C; j += kThreads) {
        s = s + lsm(j);
        a = a + abs_value(lsm(j));
      }
    block_sum2(sh, s, a);  // also makes every thread's lsm writes visible
    if (tid == 0) {
      if (t < 0 || t >= C) {
        row_loss[i] = __int_as_float(0x7FC00000);
      } else {
        double smooth = 0.0;
        if (eps != 0.0) {
          double mean;
          if (!reduce_round_fast(s, a, C, block_depth(C), true, float32_format(), &mean))
            mean = reduce_exact_values(
                C, [&](int64_t k) { return static_cast<double>(lsm(k)); }, a, true, float32_format());
          smooth = -mean;
        }
        row_loss[i] = static_cast<float>(cross_entropy_loss(0.0f - lsm(t), eps, smooth));
      }
    }
  }
}

// The reduction of the row losses, on one block: count of rows not
// ignored, then none / sum / mean (mean of no row: NaN).
template <typename F>
__global__ void cross_entropy_reduce_kernel(const float* row_loss, const int64_t* target, int64_t N,
                                            int64_t reduction, int64_t ignore_index, typename F::Bits* loss,
                                            int64_t* count) {
  __shared__ BlockScratch sh;
  const int tid = threadIdx.x;
  double s = 0.0, a = 0.0, valid = 0.0, unused = 0.0;
  for (int64_t i = tid; i < N; i += kThreads) {
    s = s + row_loss[i];
    a = a + abs_value(row_loss[i]);
    valid = valid + (target[i] != ignore_index ? 1.0 : 0.0);  // exact: integers below 2^53
  }
  block_sum2(sh, valid, unused);
  block_sum2(sh, s, a);
  const int64_t valid_rows = static_cast<int64_t>(valid);
  if (tid == 0) *count = valid_rows;
  if (reduction == 0) {
    for (int64_t i = tid; i < N; i += kThreads) loss[i] = bits_of<F>(round_double(row_loss[i], F::get()));
    return;
  }
  if (tid != 0) return;
  const bool mean = reduction == 1;
  double value;
  if (mean && valid_rows == 0) {
    value = canonical_nan();
  } else if (N == 0) {
    value = 0.0;
  } else {
    const int64_t divisor = mean ? valid_rows : N;
    if (!reduce_round_fast(s, a, divisor, block_depth(N), mean, F::get(), &value))
      value = reduce_exact_values(
          N, [&](int64_t k) { return static_cast<double>(row_loss[k]); }, a, mean, F::get(), divisor);
  }
  *loss = bits_of<F>(value);
}

template <typename G, typename F>
__global__ void cross_entropy_backward_kernel(const G* grad, const float* log_probs, const int64_t* target,
                                              const int64_t* count, int64_t N, int64_t C, int64_t reduction,
                                              int64_t ignore_index, double eps, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    typename F::Bits* o = out + i * C;
    const int64_t t = target[i];
    if (t == ignore_index) {
      for (int64_t j = threadIdx.x; j < C; j += kThreads) o[j] = 0;
      continue;
    }
    if (t < 0 || t >= C) {
      for (int64_t j = threadIdx.x; j < C; j += kThreads) o[j] = bits_of<F>(canonical_nan());
      continue;
    }
    double coef;
    if (reduction == 0)
      coef = element_value(grad[i]);
    else if (reduction == 2)
      coef = element_value(grad[0]);
    else
      coef = round_quotient(element_value(grad[0]), static_cast<uint32_t>(*count), float32_format());
    const float* lsm = log_probs + i * C;
    for (int64_t j = threadIdx.x; j < C; j += kThreads)
      o[j] = bits_of<F>(cross_entropy_grad_value(coef, lsm[j], j == t, eps, C, f));
  }
}

int row_blocks(int64_t rows) { return blocks_for(rows * kThreads, kThreads); }

}  // namespace

void softmax_rows_cuda(const at::Tensor& x, bool log, bool masked_nan, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  const auto stream = current_stream();
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      const T* xp = x.const_data_ptr<T>();
      if (warp_rows(rows, n)) {
        const int blocks = warp_row_blocks(rows);
        if (log)
          softmax_warp_rows_kernel<T, F, true><<<blocks, kWarpSize * kRowWarps, 0, stream>>>(xp, rows, n, masked_nan,
                                                                                            o);
        else
          softmax_warp_rows_kernel<T, F, false><<<blocks, kWarpSize * kRowWarps, 0, stream>>>(xp, rows, n, masked_nan,
                                                                                             o);
      } else if (log) {
        softmax_rows_kernel<T, F, true><<<row_blocks(rows), kThreads, 0, stream>>>(xp, rows, n, masked_nan, o);
      } else {
        softmax_rows_kernel<T, F, false><<<row_blocks(rows), kThreads, 0, stream>>>(xp, rows, n, masked_nan, o);
      }
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void softmax_backward_rows_cuda(const at::Tensor& grad, const at::Tensor& y, bool log, FormatId format,
                                at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(y.device());
  const int64_t rows = y.size(0), n = y.size(1);
  const auto stream = current_stream();
  with_element_type(y.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      const T* g = grad.const_data_ptr<T>();
      const T* yy = y.const_data_ptr<T>();
      if (warp_rows(rows, n)) {
        const int blocks = warp_row_blocks(rows);
        if (log)
          softmax_backward_warp_rows_kernel<T, F, true><<<blocks, kWarpSize * kRowWarps, 0, stream>>>(g, yy, rows, n, o);
        else
          softmax_backward_warp_rows_kernel<T, F, false><<<blocks, kWarpSize * kRowWarps, 0, stream>>>(g, yy, rows, n,
                                                                                                      o);
      } else if (log) {
        softmax_backward_rows_kernel<T, F, true><<<row_blocks(rows), kThreads, 0, stream>>>(g, yy, rows, n, o);
      } else {
        softmax_backward_rows_kernel<T, F, false><<<row_blocks(rows), kThreads, 0, stream>>>(g, yy, rows, n, o);
      }
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void cross_entropy_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t reduction, int64_t ignore_index,
                        double label_smoothing, FormatId format, at::Tensor& loss, at::Tensor& log_probs,
                        at::Tensor& count) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t N = logits.size(0), C = logits.size(1);
  const auto stream = current_stream();
  at::Tensor row_loss = at::empty({N}, logits.options().dtype(at::kFloat));
  if (N > 0) {
    with_element_type(logits.scalar_type(), [&](auto element) {
      using T = decltype(element);
      cross_entropy_rows_kernel<T><<<row_blocks(N), kThreads, 0, stream>>>(
          logits.const_data_ptr<T>(), target.const_data_ptr<int64_t>(), N, C, ignore_index, label_smoothing,
          log_probs.mutable_data_ptr<float>(), row_loss.mutable_data_ptr<float>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    cross_entropy_reduce_kernel<F><<<1, kThreads, 0, stream>>>(
        row_loss.const_data_ptr<float>(), target.const_data_ptr<int64_t>(), N, reduction, ignore_index,
        static_cast<typename F::Bits*>(loss.mutable_data_ptr()), count.mutable_data_ptr<int64_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void cross_entropy_backward_cuda(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                 const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                 double label_smoothing, FormatId format, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(log_probs.device());
  const int64_t N = log_probs.size(0), C = log_probs.size(1);
  const auto stream = current_stream();
  with_element_type(grad.scalar_type(), [&](auto element) {
    using G = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      cross_entropy_backward_kernel<G, F><<<row_blocks(N), kThreads, 0, stream>>>(
          grad.const_data_ptr<G>(), log_probs.const_data_ptr<float>(), target.const_data_ptr<int64_t>(),
          count.const_data_ptr<int64_t>(), N, C, reduction, ignore_index, label_smoothing,
          static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace carbon
