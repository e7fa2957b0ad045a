// The CPU's direct path for products with a short inner dimension and few
// rows (a depthwise convolution's per-channel products): see
// matmul_small_k_cpu.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

constexpr int64_t kSmallK = 16;  // inner dimensions the direct path takes
constexpr int64_t kSmallM = 8;   // rows of a per batch it takes

// out[b] = RN(bias[b] + a3[b] b3[b]) for CPU tensors a3 [B, M, K], b3
// [B, K, N] (any supported dtypes and strides), bias undefined or
// broadcastable to [B, M, N], out contiguous [B, M, N] of the output dtype.
// Returns false, having done nothing, unless K <= kSmallK and M <= kSmallM
// (and CARBON_MATMUL_GENERAL is unset).
bool matmul_small_k_cpu(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out);

}  // namespace carbon
