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

// Device kernels. widen_operand_cpu writes the exact double copy of x
// ([B, R, K], any dtype Carbon supports, any strides) into `out`
// (contiguous), with the statistics of its rows in one pass: the 2-norm,
// the RowSigns summary, `scale` times a power of two dividing every element
// (for values of a format of `precision` bits; 0 for a row without a
// nonzero finite element), and the span [first, end) of the row's nonzero
// elements (int32 pairs; {0, 0} for a row of zeros).
void widen_operand_cpu(const at::Tensor& x, at::Tensor& out, at::Tensor& norms, at::Tensor& signs,
                       int precision, double scale, at::Tensor& quanta, at::Tensor& spans);
// Tier 1's fp64 GEMM, a64 [B, M, K] times bt64 [B, N, K] transposed, into a
// contiguous [B, M, N]: skips the blocks of products that the spans show
// to be exact zeros.
at::Tensor fp64_gemm_cpu(const at::Tensor& a64, const at::Tensor& bt64, const at::Tensor& a_spans,
                         const at::Tensor& b_spans);
// Writes RN_f(c) for every output into `out` (contiguous [B, M, N]).
void matmul_round_cpu(const MatmulView& view, FormatId format, at::Tensor& out);

#ifdef CARBON_WITH_CUDA
void row_stats_cuda(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs);
void matmul_round_cuda(const MatmulView& view, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
