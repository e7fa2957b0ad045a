// sum_divided(x, divisor) = RN_F(sum of all x / divisor), the exact sum
// divided by an integer held in a 0-dim int64 tensor on x's device and
// rounded once (F = x's dtype): a mean over a count that is only known on the
// device (e.g. the rows nll_loss does not ignore), with no host sync on CUDA.
// divisor <= 0 gives NaN (the mean of nothing).
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

at::Tensor sum_divided(const at::Tensor& x, const at::Tensor& divisor);

void sum_divided_cpu(const at::Tensor& x, int64_t divisor, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void sum_divided_cuda(const at::Tensor& x, const at::Tensor& divisor, at::Tensor& out);
#endif

}  // namespace carbon
