// Host-side interface of the normalization family (layer_norm, rms_norm).
// docs/contract.md §7 states what they return.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>

namespace carbon {

// (y, mean, rstd); mean and rstd are float32 of shape x.shape[:-len(normalized_shape)].
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps);
// (y, rstd).
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                            const std::optional<at::Tensor>& weight, std::optional<double> eps);

// (dx, dweight, dbias) in one call; output_mask says which are wanted (one not
// asked for is an empty tensor). mean undefined: rms_norm (then dbias is still
// the column sum of grad_out). dweight = RN(sum over rows of grad_out * xhat),
// dbias = RN(sum over rows of grad_out), in x's dtype. When dx and a column sum
// are both wanted, one CPU pass over x and grad_out computes them all.
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                             at::IntArrayRef normalized_shape,
                                                             const std::optional<at::Tensor>& mean,
                                                             const at::Tensor& rstd,
                                                             const std::optional<at::Tensor>& weight,
                                                             std::array<bool, 3> output_mask);

// Device kernels. x, dy, y, dx: contiguous [rows, n] in x's dtype; weight,
// bias: contiguous [n] (or undefined); mean, rstd: contiguous float32 [rows].
// rms: mean is undefined and the row statistic is the mean square.
struct NormArgs {
  at::Tensor x, weight, bias, mean, rstd;
  double eps32 = 0.0;  // RN32(eps)
  bool rms = false;
};
void norm_forward_cpu(const NormArgs& a, at::Tensor& y);
void norm_backward_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx);
// Column sums over the rows: dw / db contiguous [n] (undefined: not wanted).
void norm_param_grads_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db);
// dx and the column sums in one pass (dw and/or db defined).
void norm_backward_fused_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx, at::Tensor& dw,
                             at::Tensor& db);
#ifdef CARBON_WITH_CUDA
void norm_forward_cuda(const NormArgs& a, at::Tensor& y);
void norm_backward_cuda(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx);
void norm_param_grads_cuda(const NormArgs& a, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db);
#endif

}  // namespace carbon
