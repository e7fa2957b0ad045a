// The CPU path's steps before the rounding kernel (matmul_round_cpu in
// matmul.h): exact fp64 copies with their row statistics, the fp64 GEMM, and
// the scratch memory they live in.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "matmul_kernel.h"

namespace carbon {

// The exact double copy of x ([B, R, K], any dtype Carbon supports, any
// strides) into `out` (contiguous), with the statistics of its rows in one
// pass: the 2-norm, the RowSigns summary, `scale` times a power of two
// dividing every element (for values of a format of `precision` bits; 0 for
// a row without a nonzero finite element), and the span [first, end) of the
// row's nonzero elements (int32 pairs; {0, 0} for a row of zeros).
void widen_operand_cpu(const at::Tensor& x, at::Tensor& out, at::Tensor& norms, at::Tensor& signs,
                       int precision, double scale, at::Tensor& quanta, at::Tensor& spans);

// Tier 1's fp64 GEMM: approx [B, M, N] (contiguous) = a64 [B, M, K] times
// bt64 [B, N, K] transposed, skipping the blocks of products that the spans
// show to be exact zeros.
// With lower_only, only the blocks of 64 x 64 outputs (4 x 4 tiles within
// them) that hold an output j <= i are computed; the others are left as they
// are (uninitialized).
// rows_done (may be empty): called, on the computing thread, with each range
// [begin, end) of the B * M rows of approx as soon as those rows are final,
// while they are still in the cache (the caller rounds them there). Returns
// whether it was called for every row; false when the GEMM went to the BLAS
// in one call (dense operands), and then never.
bool fp64_gemm_cpu(const at::Tensor& a64, const at::Tensor& bt64, const at::Tensor& a_spans,
                   const at::Tensor& b_spans, at::Tensor& approx, bool lower_only,
                   const std::function<void(int64_t, int64_t)>& rows_done);

// matmul_round_cpu (matmul.h); with lower_only, only the outputs j <= i are
// rounded (they need only those GEMM values) and the others are set to +0.
void matmul_round_rows_cpu(const MatmulView& v, FormatId format, at::Tensor& out, bool lower_only);

// The same for rows [begin, end) of the B * M output rows only, on the
// calling thread.
void matmul_round_row_range_cpu(const MatmulView& v, FormatId format, at::Tensor& out, bool lower_only,
                                int64_t begin, int64_t end);

// carbon.bmm(a, b) for CPU operands, rounded to out's dtype and written into
// out (contiguous [B, M, N]). With lower_only, only the outputs j <= i are
// computed: each is bmm's output bit for bit (every output is rounded on its
// own, from the exact sum); the others are +0. That is for causal
// attention's scores, whose entries j > i are never read: it skips most of
// the upper triangle of the fp64 GEMM and of the rounding.
void bmm_into_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool lower_only);

// An uninitialized contiguous double tensor of these sizes for use within
// one call on this thread, from memory the thread reuses (see
// matmul_cpu.cpp): it must not outlive the call.
at::Tensor scratch_doubles(at::IntArrayRef sizes);

}  // namespace carbon
