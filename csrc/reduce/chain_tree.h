// The CPU's fixed summation tree: kChains interleaved fp64 chains (one or two
// SIMD registers of doubles), then a pairwise fold. Every CPU kernel that
// sums this way takes its tier-1 error bound from chain_depth, so the tree
// and its depth are defined here once.
#pragma once

#include <cstdint>

namespace carbon {

constexpr int kChains = 8;

constexpr int log2_of(int chains) { return chains <= 1 ? 0 : 1 + log2_of(chains / 2); }

// No value passes through more additions than this when n values are summed
// in Chains chains (a power of two): floor(n / Chains) in its chain, up to
// Chains - 1 more for chain 0 (the tail), then the log2(Chains) pairwise
// levels (3 for kChains). A kernel with wider registers (softmax's 32 chains)
// instantiates the same tree with its own count.
template <int Chains = kChains>
constexpr int64_t chain_depth(int64_t n) { return n / Chains + (Chains - 1) + log2_of(Chains); }

// The pairwise fold of Chains partial sums (fixed order); returns s[0].
template <int Chains = kChains>
inline double fold_chains(double* s) {
  for (int width = Chains / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) s[l] = s[l] + s[l + width];
  return s[0];
}

}  // namespace carbon
