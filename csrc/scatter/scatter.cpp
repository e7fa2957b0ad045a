// The indexed accumulations: input checks, the contributions grouped by
// destination (a counting sort on the CPU, a stable device sort on CUDA, no
// host synchronization), then the device's kernel. docs/contract.md §11.
#include "scatter.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <vector>

#include "../convert/round_to.h"
#include "../dtypes.h"

namespace carbon {
namespace {

void check_device(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "carbon.", op, ": tensors on ", t.device(),
              " are not supported (CPU and CUDA only)");
}

void check_same_device(const char* op, const at::Tensor& a, const char* a_name, const at::Tensor& b,
                       const char* b_name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "carbon.", op, ": expected all tensors on one device, but ", a_name,
                    " is on ", a.device(), " and ", b_name, " is on ", b.device());
}

void check_index_dtype(const char* op, const char* name, const at::Tensor& index) {
  TORCH_CHECK_TYPE(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, "carbon.", op, ": ", name,
                   " has dtype ", index.scalar_type(), "; expected int64 or int32");
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  TORCH_CHECK_VALUE(dim >= -ndim && dim < ndim, "carbon.", op, ": dim ", dim, " is out of range for a tensor with ",
                    ndim, " dimensions");
  return dim < 0 ? dim + ndim : dim;
}

// On the CPU every index must lie in [0, size); on CUDA a check would need a
// host synchronization, so out-of-range indices are ignored there (contract §11).
void check_index_range(const char* op, const char* name, const at::Tensor& index, int64_t size) {
  if (!index.is_cpu()) return;
  const at::Tensor idx = index.to(at::kLong).contiguous();
  const int64_t* p = idx.const_data_ptr<int64_t>();
  for (int64_t k = 0; k < idx.numel(); ++k)
    TORCH_CHECK_INDEX(p[k] >= 0 && p[k] < size, "carbon.", op, ": ", name, " ", p[k],
                      " is out of range for a dimension of size ", size);
}

// Reduces the contributions source (outer, N, inner), going to index[k]
// (N, int64), into (outer, S, inner) destinations, plus `self` when defined.
at::Tensor scatter_rows(const at::Tensor& self, const at::Tensor& index, const at::Tensor& source, int64_t outer,
                        int64_t S, int64_t inner, at::ScalarType out_dtype) {
  const int64_t N = index.numel();
  TORCH_CHECK_VALUE(N < (int64_t(1) << 31) - 2, "carbon.scatter: at most 2^31 - 3 contributions");
  at::Tensor out = at::empty({outer, S, inner}, source.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  at::Tensor order, offsets;
  if (index.is_cpu()) {
    // Counting sort of the positions by destination (stable; any order would do).
    offsets = at::zeros({S + 1}, index.options());
    order = at::empty({N}, index.options());
    int64_t* off = offsets.mutable_data_ptr<int64_t>();
    int64_t* ord = order.mutable_data_ptr<int64_t>();
    const int64_t* idx = index.const_data_ptr<int64_t>();
    for (int64_t k = 0; k < N; ++k) ++off[idx[k] + 1];
    for (int64_t j = 0; j < S; ++j) off[j + 1] += off[j];
    std::vector<int64_t> next(off, off + S);
    for (int64_t k = 0; k < N; ++k) ord[next[idx[k]]++] = k;
    scatter_rows_cpu(self, source, order, offsets, outer, S, inner, out);
  } else {
#ifdef CARBON_WITH_CUDA
    at::Tensor keys;
    if (N == 0) {
      keys = order = at::empty({0}, index.options());
      offsets = at::zeros({S + 1}, index.options());
    } else {
      auto sorted = at::sort(index, /*stable=*/true, /*dim=*/0, /*descending=*/false);
      keys = std::get<0>(sorted).contiguous();
      order = std::get<1>(sorted).contiguous();
      // offsets[j] = first sorted position >= j; indices outside [0, S) fall
      // before offsets[0] or after offsets[S] and are ignored.
      offsets = at::searchsorted(keys, at::arange(S + 1, index.options()));
    }
    scatter_rows_cuda(self, source, order, keys, offsets, outer, S, inner, out);
#endif
  }
  return out;
}

void check_values(const char* op, const at::Tensor& self, const char* name, const at::Tensor& t) {
  check_supported_dtype(op, "self", self);
  check_supported_dtype(op, name, t);
  TORCH_CHECK_TYPE(self.scalar_type() == t.scalar_type(), "carbon.", op, ": ", name, " has dtype ", t.scalar_type(),
                   " but self has dtype ", self.scalar_type(), "; they must agree");
  check_device(op, self);
  check_same_device(op, self, "self", t, name);
}

}  // namespace

at::Tensor index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  const char* op = "index_add";
  check_values(op, self, "source", source);
  check_index_dtype(op, "index", index);
  check_same_device(op, self, "self", index, "index");
  TORCH_CHECK_VALUE(self.dim() >= 1, "carbon.index_add: self must have at least one dimension");
  TORCH_CHECK_VALUE(index.dim() <= 1, "carbon.index_add: index must be 0-D or 1-D, got ", index.dim(), "-D");
  const int64_t d = wrap_dim(op, dim, self.dim());
  const int64_t N = index.numel();
  bool shapes_ok = source.dim() == self.dim() && source.size(d) == N;
  for (int64_t i = 0; shapes_ok && i < self.dim(); ++i) shapes_ok = i == d || source.size(i) == self.size(i);
  TORCH_CHECK_VALUE(shapes_ok, "carbon.index_add: source of shape ", source.sizes(), " does not match self of shape ",
                    self.sizes(), " with ", N, " indices along dim ", dim);
  const int64_t S = self.size(d);
  check_index_range(op, "index", index, S);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= self.size(i);
  for (int64_t i = d + 1; i < self.dim(); ++i) inner *= self.size(i);
  const at::Tensor out = scatter_rows(self.contiguous(), index.reshape({N}).to(at::kLong).contiguous(),
                                      source.contiguous(), outer, S, inner, self.scalar_type());
  return out.reshape(self.sizes());
}

at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  const char* op = "scatter_add";
  check_values(op, self, "src", src);
  check_index_dtype(op, "index", index);
  check_same_device(op, self, "self", index, "index");
  TORCH_CHECK_VALUE(self.dim() >= 1, "carbon.scatter_add: self must have at least one dimension");
  const int64_t d = wrap_dim(op, dim, self.dim());
  const int64_t nd = self.dim();
  bool shapes_ok = index.numel() == 0 || (index.dim() == nd && src.dim() == nd);
  for (int64_t i = 0; shapes_ok && index.numel() > 0 && i < nd; ++i)
    shapes_ok = index.size(i) <= src.size(i) && (i == d || index.size(i) <= self.size(i));
  TORCH_CHECK_VALUE(shapes_ok, "carbon.scatter_add: index of shape ", index.sizes(), " does not fit self of shape ",
                    self.sizes(), " and src of shape ", src.sizes(), " (same number of dimensions; index no larger ",
                    "than src in any dimension, nor than self outside dim)");
  check_index_range(op, "index", index, self.size(d));
  const int64_t N = index.numel();
  const at::Tensor flat_self = self.contiguous().reshape({1, self.numel(), 1});
  if (N == 0) {
    const at::Tensor none = at::empty({0}, index.options().dtype(at::kLong));
    return scatter_rows(flat_self, none, src.reshape({-1}).narrow(0, 0, 0).reshape({1, 0, 1}).contiguous(), 1,
                        self.numel(), 1, self.scalar_type())
        .reshape(self.sizes());
  }
  // Each index position p goes to the element of self whose coordinates are
  // p's, with coordinate `dim` replaced by index[p]: its offset in the
  // contiguous self.
  const at::Tensor idx = index.to(at::kLong);
  std::vector<int64_t> strides(nd);
  int64_t stride = 1;
  for (int64_t i = nd - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= self.size(i);
  }
  at::Tensor dest = idx * strides[d];
  for (int64_t i = 0; i < nd; ++i) {
    if (i == d) continue;
    std::vector<int64_t> view(nd, 1);
    view[i] = index.size(i);
    dest = dest + at::arange(index.size(i), idx.options()).mul(strides[i]).view(view);
  }
  if (!index.is_cpu())  // out-of-range indices contribute nothing (no host check on CUDA)
    dest = at::where(idx.ge(0).logical_and(idx.lt(self.size(d))), dest, at::full({}, -1, idx.options()));
  at::Tensor values = src;
  for (int64_t i = 0; i < nd; ++i) values = values.narrow(i, 0, index.size(i));
  const at::Tensor out = scatter_rows(flat_self, dest.reshape({N}).contiguous(), values.reshape({1, N, 1}).contiguous(),
                                      1, self.numel(), 1, self.scalar_type());
  return out.reshape(self.sizes());
}

at::Tensor embedding(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx) {
  const char* op = "embedding";
  check_supported_dtype(op, "weight", weight);
  check_device(op, weight);
  check_index_dtype(op, "indices", indices);
  check_same_device(op, weight, "weight", indices, "indices");
  TORCH_CHECK_VALUE(weight.dim() == 2, "carbon.embedding: weight must be 2-D, got shape ", weight.sizes());
  TORCH_CHECK_VALUE(padding_idx >= -1 && padding_idx < weight.size(0),
                    "carbon.embedding: padding_idx must be -1 (none) or in [0, num_embeddings)");
  check_index_range(op, "index", indices, weight.size(0));
  std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
  shape.push_back(weight.size(1));
  // A gather is exact; round_to only rewrites NaNs with the canonical bits.
  const at::Tensor rows = weight.index_select(0, indices.reshape({-1}));
  return round_to(rows, weight.scalar_type(), 1).reshape(shape);
}

at::Tensor embedding_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                              int64_t padding_idx) {
  const char* op = "embedding_backward";
  check_supported_dtype(op, "grad", grad);
  check_device(op, grad);
  check_index_dtype(op, "indices", indices);
  check_same_device(op, grad, "grad", indices, "indices");
  TORCH_CHECK_VALUE(num_weights >= 0, "carbon.embedding_backward: num_weights must be >= 0");
  TORCH_CHECK_VALUE(padding_idx >= -1 && padding_idx < num_weights,
                    "carbon.embedding_backward: padding_idx must be -1 (none) or in [0, num_weights)");
  const int64_t N = indices.numel();
  TORCH_CHECK_VALUE(grad.dim() == indices.dim() + 1 && grad.sizes().slice(0, indices.dim()) == indices.sizes(),
                    "carbon.embedding_backward: grad of shape ", grad.sizes(), " does not match indices of shape ",
                    indices.sizes());
  check_index_range(op, "index", indices, num_weights);
  const int64_t D = grad.size(-1);
  at::Tensor out = scatter_rows(at::Tensor(), indices.reshape({N}).to(at::kLong).contiguous(),
                                grad.reshape({1, N, D}).contiguous(), 1, num_weights, D, grad.scalar_type())
                       .reshape({num_weights, D});
  if (padding_idx >= 0) out.select(0, padding_idx).zero_();
  return out;
}

}  // namespace carbon
