// Per-row decisions of var_mean shared by the CPU and CUDA kernels
// (variance.h states the definition). The sums are formed by the kernels'
// own trees; the tiers are those of layer_norm's statistics (norm_kernel.h).
#pragma once

#include "norm_kernel.h"

namespace carbon {

// A row holding NaN or +-inf: mean is NaN (a NaN, or both infinities) or the
// infinity; var is NaN. `flags` has bit 0 for NaN, 1 for +inf, 2 for -inf.
CARBON_HD void nonfinite_var_mean(uint32_t flags, double* var, double* mean) {
  const double inf = bits_to_double(kExpMask);
  *var = canonical_nan();
  if ((flags & 1u) || (flags & 6u) == 6u)
    *mean = canonical_nan();
  else
    *mean = (flags & 2u) ? inf : -inf;
}

CARBON_HD uint32_t nonfinite_flags(double v) {
  if (is_nan(v)) return 1u;
  if (is_inf(v)) return v > 0 ? 2u : 4u;
  return 0u;
}

// var from the centred sum when the divisor is 0 (n <= correction): 0/0 is
// NaN, a positive sum over 0 is +inf (torch's rule). T == 0 iff the exact sum is 0.
CARBON_HD double var_without_divisor(double T) { return T == 0.0 ? canonical_nan() : bits_to_double(kExpMask); }

}  // namespace carbon
