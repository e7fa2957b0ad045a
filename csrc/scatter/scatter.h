// Host-side interface of the indexed accumulations (index_add, scatter_add,
// embedding and its backward). docs/contract.md §11 states what is
// guaranteed: every destination element is RN(exact sum of its old value, if
// any, and all of its contributions), whatever their order or duplication.
#pragma once

#include <ATen/core/Tensor.h>

#include "../exact/float_format.h"

namespace carbon {

at::Tensor index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source);
at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src);
// padding_idx (-1: none) only matters to the backward; the forward checks it.
at::Tensor embedding(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx);
at::Tensor embedding_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                              int64_t padding_idx);

// The one kernel behind all of them. With S destinations along the middle
// dimension, `source` (outer, N, inner) contiguous and `index` (N) int64
// contiguous, `out` (outer, S, inner) contiguous of `format`:
//   out[o, j, c] = RN( self[o, j, c] + sum over k with index[k] == j of source[o, k, c] )
// where the self term is absent when `self` is undefined (then a destination
// with no contribution is +0). Indices outside [0, S) contribute nothing
// (the callers check them on the CPU). `order` (N) is the stable sort of
// index (positions k by destination), `keys` (N, CUDA only) the sorted index
// values, and `offsets` (S + 1) the start of each destination's segment in it.
void scatter_rows_cpu(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                      const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void scatter_rows_cuda(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                       const at::Tensor& keys, const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner,
                       at::Tensor& out);
#endif

}  // namespace carbon
