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
  // Contribution p of the segment (p in [0, count)).
  CARBON_HD double contribution(int64_t p) const { return element_value(source[order[p] * inner]); }
  CARBON_HD double operator()(int64_t t) const {
    if (self) {
      if (t == 0) return element_value(*self);
      --t;
    }
    return contribution(t);
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

// ---- The CUDA path: one thread per destination element --------------------
//
// A frequent token's destination has hundreds or thousands of contributions,
// and its thread would add them one by one, two dependent loads each (the
// position in `order`, then the value). Two measures bound that chain:
//  * the sorted positions are cut into chunks of kScatterChunk; a first kernel
//    adds each chunk that belongs to one destination alone (chunk_partial),
//    and that destination's thread adds the chunk sums in place of the chunk's
//    terms: a segment of m terms costs at most 2 kScatterChunk terms plus
//    m / kScatterChunk chunk sums;
//  * loads are issued kScatterBatch at a time before their adds, so they
//    overlap.
// Both only reshape tier 1's fp64 summation tree. No term passes through
// more than n - 1 rounded adds, as in the sequential loop (a term of chunk
// k of P: at most kScatterChunk - 1 inside the chunk, then P - k + tail
// more, the first of them exact when nothing precedes the chunk), so tier
// 1's bound gamma_n * sum|x| holds for it, and a decided result is
// RN_f(exact sum) either way: the chunking never shows in the bits.
constexpr int64_t kScatterChunk = 64;
constexpr int kScatterBatch = 8;

// Tier 1's fp64 sums over some terms: their sum and the sum of their absolute values.
struct PartialSum {
  double sum;
  double abs_sum;
};

CARBON_HD void add_part(PartialSum& acc, const PartialSum& part) {
  acc.sum = acc.sum + part.sum;
  acc.abs_sum = acc.abs_sum + part.abs_sum;
}

CARBON_HD PartialSum term_part(double v) { return PartialSum{v, abs_value(v)}; }

// Adds part(0), ..., part(n - 1) to acc in that order, loading kScatterBatch
// parts before adding them.
template <typename PartAt>
CARBON_HD void add_in_order(int64_t n, PartAt part, PartialSum& acc) {
  int64_t k = 0;
  for (; k + kScatterBatch <= n; k += kScatterBatch) {
    PartialSum v[kScatterBatch];
#pragma unroll
    for (int i = 0; i < kScatterBatch; ++i) v[i] = part(k + i);
#pragma unroll
    for (int i = 0; i < kScatterBatch; ++i) add_part(acc, v[i]);
  }
  for (; k < n; ++k) add_part(acc, part(k));
}

// Tier 1 over the kScatterChunk contributions at sorted positions `order`
// (source = &source[o, 0, c]): the chunk sum a destination's thread adds in
// place of those terms.
template <typename T>
CARBON_HD PartialSum chunk_partial(const T* source, const int64_t* order, int64_t inner) {
  PartialSum acc{0.0, 0.0};
  add_in_order(kScatterChunk, [&](int64_t k) { return term_part(element_value(source[order[k] * inner])); }, acc);
  return acc;
}

// All tiers for one destination element whose segment is sorted positions
// [begin, begin + terms.count). `chunks` points at the chunk sums of (o, c)
// (chunk q at chunks[q * inner]), or is nullptr when none were computed; the
// chunks lying wholly inside the segment are used.
template <typename T>
CARBON_HD double scatter_element(const DestinationTerms<T>& terms, int64_t begin, const PartialSum* chunks,
                                 const FloatFormat& f) {
  PartialSum acc{0.0, 0.0};
  if (terms.self) add_part(acc, term_part(element_value(*terms.self)));
  const auto contribution = [&](int64_t p) { return term_part(terms.contribution(p)); };
  const int64_t end = begin + terms.count;
  const int64_t first = (begin + kScatterChunk - 1) / kScatterChunk, last = end / kScatterChunk;
  if (chunks && first < last) {
    const int64_t head = first * kScatterChunk - begin, tail = last * kScatterChunk - begin;
    add_in_order(head, contribution, acc);
    add_in_order(last - first, [&](int64_t q) { return chunks[(first + q) * terms.inner]; }, acc);
    add_in_order(terms.count - tail, [&](int64_t p) { return contribution(tail + p); }, acc);
  } else {
    add_in_order(terms.count, contribution, acc);
  }
  return scatter_finish(terms, acc.sum, acc.abs_sum, scatter_bound_factor(terms.terms()), f);
}

}  // namespace carbon
