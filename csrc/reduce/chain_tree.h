// The CPU's fixed summation tree: kChains interleaved fp64 chains (one or two
// SIMD registers of doubles), then a pairwise fold. Every CPU kernel that
// sums this way takes its tier-1 error bound from chain_depth, so the tree
// and its depth are defined here once.
#pragma once

#include <cstdint>

namespace carbon {

constexpr int kChains = 8;

// No value passes through more additions than this when n values are summed
// in kChains chains: floor(n / kChains) in its chain, up to kChains - 1 more
// for chain 0 (the tail), then the log2(kChains) = 3 pairwise levels.
constexpr int64_t chain_depth(int64_t n) { return n / kChains + (kChains - 1) + 3; }

// The pairwise fold of kChains partial sums (fixed order); returns s[0].
inline double fold_chains(double* s) {
  for (int width = kChains / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) s[l] = s[l] + s[l + width];
  return s[0];
}

}  // namespace carbon
