// The reduction ops: input checks, the reduced dimensions moved last and
// flattened into rows, then the device's row kernel. docs/contract.md states
// what is guaranteed.
#include "reduce.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "../dtypes.h"

namespace carbon {
namespace {

at::Tensor reduce(const char* op, const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                  std::optional<at::ScalarType> dtype, bool mean) {
  check_supported_dtype(op, "x", x);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  const at::ScalarType out_dtype = checked_out_dtype(op, dtype.value_or(x.scalar_type()));
  const int64_t ndim = x.dim();
  std::vector<bool> reduced(std::max<int64_t>(ndim, 1), false);
  if (!dim.has_value() || dim->empty()) {
    std::fill(reduced.begin(), reduced.end(), true);
  } else {
    const int64_t range = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 and -1
    for (const int64_t d : *dim) {
      TORCH_CHECK_VALUE(d >= -range && d < range, "carbon.", op, ": dim ", d,
                        " is out of range for a tensor with ", ndim, " dimensions");
      const int64_t w = d < 0 ? d + range : d;
      TORCH_CHECK_VALUE(!reduced[w], "carbon.", op, ": dim ", d, " appears more than once");
      reduced[w] = true;
    }
  }
  std::vector<int64_t> kept_dims, reduced_dims, out_shape;
  int64_t rows = 1, n = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[d]) {
      kept_dims.push_back(d);
      out_shape.push_back(x.size(d));
      rows *= x.size(d);
    } else {
      reduced_dims.push_back(d);
      n *= x.size(d);
      if (keepdim) out_shape.push_back(1);
    }
  }
  std::vector<int64_t> rows_order(kept_dims), columns_order(reduced_dims);
  rows_order.insert(rows_order.end(), reduced_dims.begin(), reduced_dims.end());
  columns_order.insert(columns_order.end(), kept_dims.begin(), kept_dims.end());
  // Fewer than 2^31 terms keeps the exact accumulator's limbs from overflowing.
  TORCH_CHECK_VALUE(n < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 elements can be reduced into one output");
  at::Tensor out = at::empty({rows}, x.options().dtype(out_dtype));
  const at::Tensor as_rows = x.permute(rows_order);
  const at::Tensor as_columns = x.permute(columns_order);
  if (rows > 0) {
    if (x.is_cpu() && !as_rows.is_contiguous() && as_columns.is_contiguous()) {
      // Reducing leading dimensions (e.g. over the tokens of a gradient):
      // sum columns in place rather than transposing.
      reduce_columns_cpu(as_columns.reshape({n, rows}), mean, format_of(out_dtype), out);
    } else if (x.is_cpu()) {
      reduce_rows_cpu(as_rows.reshape({rows, n}).contiguous(), mean, format_of(out_dtype), out);
    } else {
#ifdef CARBON_WITH_CUDA
      // Leading dimensions: the columns are read in place (no transposing copy).
      if (n > 0 && !as_rows.is_contiguous() && as_columns.is_contiguous())
        reduce_columns_cuda(as_columns.reshape({n, rows}), mean, format_of(out_dtype), out);
      else
        reduce_rows_cuda(as_rows.reshape({rows, n}).contiguous(), mean, format_of(out_dtype), out);
#endif
    }
  }
  return out.reshape(out_shape);
}

}  // namespace

at::Tensor sum(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  return reduce("sum", x, dim, keepdim, dtype, false);
}

at::Tensor mean(const at::Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  return reduce("mean", x, dim, keepdim, dtype, true);
}

}  // namespace carbon
