// Host-side interface of carbon's two-argument functions atan2(y, x),
// hypot(x, y) and pow(x, exponent): out = RN_F(core(a, b)) elementwise in the
// inputs' format F (two_argument_math.h). The inputs have one shape, dtype
// and device (the Python layer broadcasts and promotes first). Used by
// carbon.enable for torch.atan2 / torch.hypot / torch.pow of two tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include "two_argument_math.h"

namespace carbon {

at::Tensor atan2_op(const at::Tensor& y, const at::Tensor& x);
at::Tensor hypot_op(const at::Tensor& x, const at::Tensor& y);
at::Tensor pow_tensor_tensor(const at::Tensor& x, const at::Tensor& exponent);

// Device kernels over contiguous tensors of one dtype and size.
void two_argument_cpu(TwoArgumentFn fn, const at::Tensor& a, const at::Tensor& b, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void two_argument_cuda(TwoArgumentFn fn, const at::Tensor& a, const at::Tensor& b, at::Tensor& out);
#endif

}  // namespace carbon
