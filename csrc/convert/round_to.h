// Correctly rounded conversion between formats, optionally of a quotient:
// round_to(x, dtype, divisor) = RN_dtype(x / divisor), one rounding of the
// exact value. Used directly and by gradients (a mean's backward is
// RN(grad / n)). Shared per-element code for the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include "../exact/exact_sum.h"
#include "../exact/rounding_test.h"

namespace carbon {

at::Tensor round_to(const at::Tensor& x, at::ScalarType dtype, int64_t divisor);

// Device kernels over contiguous tensors of the same number of elements.
void round_to_cpu(const at::Tensor& x, uint32_t divisor, FormatId to, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void round_to_cuda(const at::Tensor& x, uint32_t divisor, FormatId to, at::Tensor& out);
#endif

// RN_f(x / divisor) for a value x of a supported format and 0 < divisor < 2^32.
// The fp64 quotient is within half an ulp of the exact one; when the ulps on
// either side round alike it decides, otherwise an exact long division does.
CARBON_HD double round_quotient(double x, uint32_t divisor, const FloatFormat& f) {
  if (divisor == 1 || !is_finite(x) || x == 0.0) return round_double(x / divisor, f);
  const double q = x / divisor;
  double out;
  if (round_interval_if_decided(next_down(q), next_up(q), f, &out)) return out;
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  exact_sum_add(limb, flags, x);
  return exact_sum_round_divided(limb, flags, divisor, f);
}

}  // namespace carbon
