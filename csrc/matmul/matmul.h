// Host-side interface of the matmul family: the ops registered in
// registration.cpp and the per-device kernels they call.
#pragma once

#include <ATen/ATen.h>

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
void row_stats_cuda(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs);
void matmul_round_cuda(const MatmulView& view, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
