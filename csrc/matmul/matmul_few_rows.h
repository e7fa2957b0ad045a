// The CPU's direct path for products with few rows per batch (a decoding
// step's activations times a weight, a small batch through nn.Linear): see
// matmul_few_rows_cpu.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

constexpr int64_t kFewRows = 32;  // rows of a per batch the direct path takes

// out[b] = RN(bias[b] + a3[b] b3[b]) for CPU tensors a3 [B, M, K], b3
// [B, K, N] (any supported dtypes; a any strides; b with its rows or its
// columns contiguous), bias undefined or broadcastable to [B, M, N], out
// contiguous [B, M, N] of the output dtype. Returns false, having done
// nothing, unless 1 <= M <= kFewRows, K >= 1, b has a contiguous dimension
// and CARBON_MATMUL_GENERAL is unset.
bool matmul_few_rows_cpu(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out);

}  // namespace carbon
