// Host-side interface of the matmul family: the ops registered in
// registration.cpp and the per-device kernels they call.
#pragma once

#include <ATen/core/Tensor.h>

#include "matmul_kernel.h"

namespace carbon {

// Ops (schemas in registration.cpp). out_dtype defaults to the promoted input
// dtype. bias broadcasts to the output shape.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype);
at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                 std::optional<at::ScalarType> out_dtype);
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype);
at::Tensor baddbmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                   std::optional<at::ScalarType> out_dtype);

// Device kernels (the CPU path's other steps are in matmul_cpu.h).
// Writes RN_f(c) for every output into `out` (contiguous [B, M, N]).
void matmul_round_cpu(const MatmulView& view, FormatId format, at::Tensor& out);

#ifdef CARBON_WITH_CUDA
// dst[b * R + r, k] = src[b, r, k] exactly (src float32 / bfloat16 / float16, any strides; dst fp64,
// contiguous), with the rows' 2-norms (fp64, any order) and RowSigns, in one pass.
void widen_rows_cuda(const at::Tensor& src, at::Tensor& dst, at::Tensor& norms, at::Tensor& signs);
void matmul_round_cuda(const MatmulView& view, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
