// Tiers 2 and 3 of an exact reduction (reduce_kernel.h) on one warp, shared
// by the CUDA kernels that reduce rows (reduce_cuda.cu) and columns
// (column_sums.cuh). The lanes split the n terms (lane l takes terms l,
// l + 32, ...); compensated sums merge by TwoSum in a butterfly (the bound
// holds for any tree), exact accumulators as integers (exact).
#pragma once

#include "../exact/warp_exact.cuh"
#include "reduce_kernel.h"

namespace carbon {

// RN_f of the exact sum of value_at(0), ..., value_at(n - 1) (divided by
// `divisor`, default n, with `mean`), each an exact fp64 term; abs_sum is
// tier 1's fp64 sum of their magnitudes. Every lane of the warp must call it
// with the same arguments; every lane returns the value.
template <typename ValueAt>
__device__ double warp_round_exact_terms(int64_t n, ValueAt value_at, double abs_sum, bool mean,
                                         const FloatFormat& f, int64_t divisor = -1) {
  if (divisor < 0) divisor = n;
  const int lane = lane_id();
  double value = 0.0;
  CompensatedSum acc;
  for (int64_t k = lane; k < n; k += kWarpSize) compensated_add(acc, value_at(k));
  acc = warp_merge(acc);
  if (reduce_round_compensated(acc, abs_sum * kBoundSlack, divisor, warp_compensated_depth(n), mean, f, &value))
    return value;
  int64_t storage[kLimbs];
  int64_t* limb = lane_limbs(storage);
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = lane; k < n; k += kWarpSize) exact_sum_add(limb, flags, value_at(k));
  flags = warp_merge_limbs(limb, flags);
  return reduce_round_exact_sum(limb, flags, divisor, mean, f);
}

}  // namespace carbon
