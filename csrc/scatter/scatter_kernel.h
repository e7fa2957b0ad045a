// Per-destination logic of the indexed accumulations, shared by the CPU and
// CUDA kernels. One destination element receives
//     RN_f( self + sum of its contributions )       (self optional)
// decided by the tiers of carbon.sum (csrc/reduce/reduce_kernel.h):
//   1. fp64 sum and absolute sum, added sequentially (depth = number of terms):
//      |fl - c| <= gamma_terms * sum|x| for any order of the terms;
//   2./3. compensated sum, then the exact accumulator (reduce_exact_values).
// Every tier's answer, when it gives one, is RN_f(c), so neither the order of
// the segment nor the tier that decides can change the bits.
#pragma once

#include "../reduce/reduce_kernel.h"

namespace carbon {

// The terms of destination (o, j, c): term 0 is self (when present), the
// others are source[o, order[p], c] for p in [begin, end).
template <typename T>
struct DestinationTerms {
  const T* self;        // &self[o, j, c], or nullptr when there is no self term
  const T* source;      // &source[o, 0, c]
  const int64_t* order; // order + begin
  int64_t count;        // end - begin
  int64_t inner;        // stride between source rows

  CARBON_HD int64_t terms() const { return count + (self ? 1 : 0); }
  CARBON_HD double operator()(int64_t t) const {
    if (self) {
      if (t == 0) return element_value(*self);
      --t;
    }
    return element_value(source[order[t] * inner]);
  }
};

// The factor of tier 1's error bound for n terms summed sequentially in any
// order: |fl(sum) - sum| <= gamma_n * sum|x|, with slack for the rounding of
// the bound itself (as reduce_round_fast). Computed once per destination row.
CARBON_HD double scatter_bound_factor(int64_t n) { return gamma_n(n) * kBoundSlack; }

// Tier 1's decision from its sequential sums (sum, abs_sum) of every term,
// then tiers 2 and 3. `factor` is scatter_bound_factor(terms.terms()). An
// empty destination (no self, no contribution) is +0.
template <typename T>
CARBON_HD double scatter_finish(const DestinationTerms<T>& terms, double sum, double abs_sum, double factor,
                                const FloatFormat& f) {
  const int64_t n = terms.terms();
  if (n == 0) return 0.0;
  double out;
  if (round_if_decided(sum, factor * abs_sum, f, &out)) return out;
  return reduce_exact_values(n, terms, abs_sum, false, f);
}

// All tiers for one destination element, sequentially (the CUDA path: one
// thread per element).
template <typename T>
CARBON_HD double scatter_element(const DestinationTerms<T>& terms, const FloatFormat& f) {
  double sum = 0.0, abs_sum = 0.0;
  const int64_t n = terms.terms();
  for (int64_t t = 0; t < n; ++t) {
    const double v = terms(t);
    sum = sum + v;
    abs_sum = abs_sum + abs_value(v);
  }
  return scatter_finish(terms, sum, abs_sum, scatter_bound_factor(n), f);
}

}  // namespace carbon
