// Host-side interface of carbon's pow ops: x^p (tensor base, number exponent)
// and b^y (number base, tensor exponent), and the square root; out = RN_F(pow_core) in the
// tensor's format F (pow_math.h). Used by carbon.enable for torch.pow with a
// non-integer exponent (integer exponents there are exact products). float64
// tensors take binary64_math.h's double-double pow_core instead.
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

at::Tensor pow_tensor_scalar(const at::Tensor& x, double exponent);
at::Tensor pow_scalar_tensor(double base, const at::Tensor& exponent);
// RN(sqrt x) in x's dtype (float32, bfloat16, float16 or float64): pow_math.h's
// sqrt_core, rounded once to the format; NaN canonical.
at::Tensor sqrt_op(const at::Tensor& x);

// Device kernels over contiguous tensors: out[i] = RN(x[i]^p) when the tensor
// holds the bases (tensor_is_base), else RN(p^x[i]) with p the base.
void pow_cpu(const at::Tensor& x, double scalar, bool tensor_is_base, at::Tensor& out);
void sqrt_cpu(const at::Tensor& x, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void pow_cuda(const at::Tensor& x, double scalar, bool tensor_is_base, at::Tensor& out);
void sqrt_cuda(const at::Tensor& x, at::Tensor& out);
#endif

}  // namespace carbon
