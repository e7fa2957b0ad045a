// Prefix sums of one span of a row of cumsum_rows, shared by the CPU loop
// and the CUDA threads (cumsum.h states the definition), so both give the
// same bits.
#pragma once

#include "reduce_kernel.h"

namespace carbon {

// out[i] = RN_F(x[0] + ... + x[i]) for i in [begin, end). (s, a) are the fp64
// sum and absolute sum of x[0 .. begin), computed by a tree in which no
// element passed through more than `depth` additions (0, 0, 0 at the start
// of the row). Each prefix continues that running sum (one more addition on
// every path), decided by the monotone test; the first undecided prefix
// starts an exact accumulator over x[0 .. i], kept from there on.
template <typename T, typename F>
CARBON_HD void cumsum_span(const T* x, int64_t begin, int64_t end, double s, double a, int64_t depth,
                           typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  int64_t limb[kLimbs], copy[kLimbs];
  uint32_t flags = 0;
  bool exact = false;  // limb holds the exact prefix sum from here on
  for (int64_t i = begin; i < end; ++i) {
    const double v = element_value(x[i]);
    s = s + v;
    a = a + abs_value(v);
    ++depth;
    if (exact) exact_sum_add(limb, flags, v);
    double value;
    if (!reduce_round_fast(s, a, 1, depth, false, f, &value)) {
      if (!exact) {
        exact_sum_clear(limb, flags);
        for (int64_t k = 0; k <= i; ++k) exact_sum_add(limb, flags, element_value(x[k]));
        exact = true;
      }
      for (int l = 0; l < kLimbs; ++l) copy[l] = limb[l];  // rounding normalizes its argument in place
      value = exact_sum_round(copy, flags, f);
    }
    out[i] = static_cast<typename F::Bits>(encode(value, f));
  }
}

// A whole row in one thread: a sequential chain (depth i + 1 at prefix i).
template <typename T, typename F>
CARBON_HD void cumsum_row(const T* x, int64_t n, typename F::Bits* out) {
  cumsum_span<T, F>(x, 0, n, 0.0, 0.0, 0, out);
}

}  // namespace carbon
