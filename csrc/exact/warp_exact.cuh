// Warp-cooperative building blocks of the exact tiers, shared by every CUDA
// kernel. A warp splits one reduction over its 32 lanes; these combine the
// lanes' partial results. Combining fp64 sums or compensated sums in any
// tree keeps their error bounds (the bounds hold for every order); combining
// exact accumulators is integer addition, so the result is exact.
#pragma once

#include "exact_sum.h"
#include "rounding_test.h"

namespace carbon {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

__device__ __forceinline__ int lane_id() { return threadIdx.x % kWarpSize; }

// Plain fp64 sum of the lanes' values (butterfly: every lane gets the result).
__device__ __forceinline__ double warp_sum(double x) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) x = x + __shfl_xor_sync(kFullWarp, x, off);
  return x;
}

__device__ __forceinline__ uint32_t warp_or(uint32_t x) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) x |= __shfl_xor_sync(kFullWarp, x, off);
  return x;
}

// Compensated sums of the lanes merged with TwoSum (every lane gets the result).
__device__ __forceinline__ CompensatedSum warp_merge(CompensatedSum acc) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    CompensatedSum other;
    other.s = __shfl_xor_sync(kFullWarp, acc.s, off);
    other.t = __shfl_xor_sync(kFullWarp, acc.t, off);
    acc = compensated_merge(acc, other);
  }
  return acc;
}

// Depth bound for a compensated sum of n terms split over a warp and merged:
// at most n + 31 TwoSums and error additions on any path.
__host__ __device__ __forceinline__ int64_t warp_compensated_depth(int64_t n) { return n + 64; }

// A lane's exact accumulator is an array of kLimbs limbs in the lane's
// local memory: `int64_t storage[kLimbs]; int64_t* limb =
// lane_limbs(storage);`. The empty asm hides the array from the optimizer,
// which would otherwise hold all 20 limbs of this rarely taken tier in
// registers and so raise the register count (and lower the occupancy) of
// every kernel that carries it.
__device__ __forceinline__ int64_t* lane_limbs(int64_t* storage) {
#if defined(__CUDACC__)
  asm volatile("" : "+l"(storage));
#endif
  return storage;
}

// Merges the lanes' exact accumulators: each lane's limbs (its own array,
// in the lane's local memory) become the sums over all 32 lanes, by integer
// butterflies (exact: each limb total stays below 2^63 for fewer than 2^31
// terms, and so does any partial sum), and the flags are ORed. Every lane
// must call it; afterwards every lane holds the warp's accumulator and
// rounds it to the same value. (No shared memory: a block's 20 KB of
// accumulators for a path that rarely runs would cap the occupancy of the
// memory-bound kernels that carry it.)
__device__ __forceinline__ uint32_t warp_merge_limbs(int64_t* limb, uint32_t flags) {
  // Not unrolled: the limbs stay in local memory rather than taking 40
  // registers in every kernel that carries this rare path.
#pragma unroll 1
  for (int l = 0; l < kLimbs; ++l) {
    int64_t x = limb[l];
    for (int off = kWarpSize / 2; off > 0; off /= 2) x += __shfl_xor_sync(kFullWarp, x, off);
    limb[l] = x;
  }
  return warp_or(flags);
}

}  // namespace carbon
