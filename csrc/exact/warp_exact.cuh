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

// The warp's per-lane accumulators: limbs[lane] is lane `lane`'s array.
using WarpLimbs = int64_t[kWarpSize][kLimbs];
// warp_merge_limbs gives one limb to each lane.
static_assert(kLimbs <= kWarpSize, "warp_merge_limbs needs a lane per limb");

// Adds every lane's limbs into limbs[0] (exact integer sums; each limb total
// stays below 2^63 for fewer than 2^31 terms) and ORs the lanes' flags. Every
// lane must call it; afterwards lane 0 may round limbs[0].
__device__ __forceinline__ uint32_t warp_merge_limbs(WarpLimbs& limbs, uint32_t flags) {
  const int lane = lane_id();
  flags = warp_or(flags);
  __syncwarp();
  int64_t total = 0;
  if (lane < kLimbs)
    for (int l = 0; l < kWarpSize; ++l) total += limbs[l][lane];
  __syncwarp();
  if (lane < kLimbs) limbs[0][lane] = total;
  __syncwarp();
  return flags;
}

// Broadcast lane 0's value, then make limbs[0] safe to reuse.
__device__ __forceinline__ double warp_broadcast_from_lane0(double x) {
  x = __shfl_sync(kFullWarp, x, 0);
  __syncwarp();
  return x;
}

}  // namespace carbon
