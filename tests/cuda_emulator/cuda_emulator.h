// A CPU emulator for Carbon's CUDA kernels, for machines without a GPU.
//
// tests/cuda_emulator/build.py compiles every csrc/**/*.cu file as C++ with this header force-included, so the
// kernels' own code -- index arithmetic, grid-stride loops, shared memory, barriers, warp shuffles, atomics and the
// device branches (__CUDA_ARCH__) of the shared headers -- runs on the host. Each block runs its threads as
// cooperative fibers on the calling thread; a barrier or a warp collective switches to the next fiber, so a kernel
// behaves as on a GPU as far as its result can depend on what the CUDA model guarantees. On top of that it checks
// what a GPU would not report: a barrier some threads never reach (deadlock), a warp collective whose lanes are
// not all present or disagree on the operation, a shuffle from a lane outside the mask. The order in which fibers
// run between barriers is shuffled (CARBON_CUDA_EMULATOR_SEED), so a missing barrier shows up as a changed result.
//
// Arithmetic is the host's: IEEE binary64/binary32 with the same contract as nvcc's (--fmad=false, no ftz,
// correctly rounded division and square root), so a correct kernel gives the GPU's bits here.
#pragma once

// Torch's headers first, without the device macros below (they must see a host compilation).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "ATen/cuda/CUDAContext.h"

namespace cuda_emu {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3() = default;
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  dim3(I x_) : x(checked(x_)) {}  // NOLINT: implicit like CUDA's dim3
  constexpr dim3(unsigned x_, unsigned y_, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  template <typename I>
  static unsigned checked(I v) {
    TORCH_CHECK(v >= 0 && static_cast<uint64_t>(v) <= 0x7FFFFFFFull, "cuda emulator: launch dimension ", v,
                " out of range");
    return static_cast<unsigned>(v);
  }
  unsigned count() const { return x * y * z; }
};

// What a running thread sees as threadIdx, blockIdx, blockDim and gridDim.
struct ThreadView {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
};

ThreadView& current_thread();
unsigned char* dynamic_shared_memory();
// Static __shared__ variables are host statics here; build.py registers each where it is declared, and every
// block starts with them filled with NaN bytes (as dynamic shared memory), so a read before a write shows.
void track_shared(void* p, size_t bytes);

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes = 0;
  template <typename G, typename B, typename S = size_t, typename Stream = void*>
  LaunchConfig(G g, B b, S s = 0, Stream = nullptr) : grid(g), block(b), shared_bytes(static_cast<size_t>(s)) {}
};

// Runs body() once per thread of the grid, block after block, the block's threads as fibers.
void launch(const LaunchConfig& config, const std::function<void()>& body);

// How many kernels this process has launched (tests check that an op really ran emulated kernels).
int64_t launch_count();
// Restarts the generator that orders the fibers (CARBON_CUDA_EMULATOR_SEED sets the first seed).
void set_schedule_seed(uint64_t seed);

// Collectives (every participating thread calls them).
void block_barrier();
int block_barrier_or(int predicate);
int block_barrier_and(int predicate);
int block_barrier_count(int predicate);
enum class WarpOp { kSync, kShflXor, kShflIdx, kShflDown, kShflUp, kAny, kAll, kBallot };
uint64_t warp_collective(unsigned mask, WarpOp op, uint64_t value, int param, int width);

template <typename T>
uint64_t to_word(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "cuda emulator: shuffles move at most 8 bytes");
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof v);
  return w;
}
template <typename T>
T from_word(uint64_t w) {
  T v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

}  // namespace cuda_emu

// ---- the CUDA language, as the kernels use it
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (::cuda_emu::current_thread().thread_idx)
#define blockIdx (::cuda_emu::current_thread().block_idx)
#define blockDim (::cuda_emu::current_thread().block_dim)
#define gridDim (::cuda_emu::current_thread().grid_dim)
// Carbon's headers take their device branches (the intrinsics below); torch's headers were read above without it.
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900

using cuda_emu::dim3;

inline void __syncthreads() { cuda_emu::block_barrier(); }
inline int __syncthreads_or(int p) { return cuda_emu::block_barrier_or(p); }
inline int __syncthreads_and(int p) { return cuda_emu::block_barrier_and(p); }
inline int __syncthreads_count(int p) { return cuda_emu::block_barrier_count(p); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kSync, 0, 0, 32);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return cuda_emu::from_word<T>(
      cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kShflXor, cuda_emu::to_word(v), lane_mask, width));
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return cuda_emu::from_word<T>(
      cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kShflIdx, cuda_emu::to_word(v), src_lane, width));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return cuda_emu::from_word<T>(cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kShflDown, cuda_emu::to_word(v),
                                                          static_cast<int>(delta), width));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return cuda_emu::from_word<T>(cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kShflUp, cuda_emu::to_word(v),
                                                          static_cast<int>(delta), width));
}
inline int __any_sync(unsigned mask, int p) {
  return static_cast<int>(cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kAny, p != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int p) {
  return static_cast<int>(cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kAll, p != 0, 0, 32));
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return static_cast<unsigned>(cuda_emu::warp_collective(mask, cuda_emu::WarpOp::kBallot, p != 0, 0, 32));
}

// Atomics: the fibers of a launch share one host thread, so a read-modify-write is atomic.
template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = old + v;
  return old;
}
template <typename T>
T atomicOr(T* address, T v) {
  const T old = *address;
  *address = old | v;
  return old;
}
template <typename T>
T atomicMax(T* address, T v) {
  const T old = *address;
  *address = old < v ? v : old;
  return old;
}

// Bit-level intrinsics.
inline long long __double_as_longlong(double x) { return cuda_emu::from_word<long long>(cuda_emu::to_word(x)); }
inline double __longlong_as_double(long long x) { return cuda_emu::from_word<double>(cuda_emu::to_word(x)); }
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}

// CUDA's device min / max of integers (mixed types: the common type, as C++ promotes them). Floating-point
// min / max (fmin's NaN rule) are left undefined here, so a kernel using them fails to compile until added.
template <typename A, typename B, typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <typename A, typename B, typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
