// Host-side interface of the reduction family (sum, mean).
#pragma once

#include <ATen/core/Tensor.h>

#include "../exact/float_format.h"

namespace carbon {

at::Tensor sum(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype);
at::Tensor mean(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype);

// Device kernels: reduce each row of the contiguous [rows, n] tensor `x` into
// out[row] (contiguous, `format`): RN(sum of the row), or RN(sum / n).
void reduce_rows_cpu(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out);
// The same for each column of a contiguous [n, columns] tensor (reducing
// leading dimensions without a transposing copy).
void reduce_columns_cpu(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void reduce_rows_cuda(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out);
// x: contiguous [n, cols]; out[c] = the reduction of column c (column_sums.cuh).
void reduce_columns_cuda(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
