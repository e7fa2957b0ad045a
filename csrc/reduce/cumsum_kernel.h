// One row of cumsum_rows, shared by the CPU loop and the CUDA thread that
// owns the row (cumsum.h states the definition), so both give the same bits.
#pragma once

#include "reduce_kernel.h"

namespace carbon {

template <typename T, typename F>
CARBON_HD void cumsum_row(const T* x, int64_t n, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  double s = 0.0, a = 0.0;
  int64_t limb[kLimbs], copy[kLimbs];
  uint32_t flags = 0;
  bool exact = false;  // limb holds the exact prefix sum from here on
  for (int64_t i = 0; i < n; ++i) {
    const double v = element_value(x[i]);
    s = s + v;  // a sequential chain: no value passes through more than i + 1 additions
    a = a + abs_value(v);
    if (exact) exact_sum_add(limb, flags, v);
    double value;
    if (!reduce_round_fast(s, a, 1, i + 1, false, f, &value)) {
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

}  // namespace carbon
