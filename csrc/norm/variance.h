// Host-side interface of var_mean: the statistics of layer_norm (§7) with a
// divisor of n - correction, for torch.var / std / var_mean / std_mean under
// carbon.enable. Per row of n values (docs/contract.md §7):
//   mean = RN32(sum x / n)                         exact sum, one rounding
//   var  = RN32(sum (x - mean)^2 / max(0, n - c))  exact, one rounding
// (the centred sum is exact around the rounded mean, as in layer_norm).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace carbon {

// x: [rows, n] (any supported dtype); returns float32 (var[rows], mean[rows]).
std::tuple<at::Tensor, at::Tensor> var_mean_rows(const at::Tensor& x, int64_t correction);

void var_mean_rows_cpu(const at::Tensor& x, int64_t divisor, at::Tensor& var, at::Tensor& mean);
#ifdef CARBON_WITH_CUDA
void var_mean_rows_cuda(const at::Tensor& x, int64_t divisor, at::Tensor& var, at::Tensor& mean);
#endif

}  // namespace carbon
