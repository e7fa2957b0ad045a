// The softmax ops: input checks, the softmax dim moved last (rows of n
// contiguous values), then the device's row kernel. docs/contract.md §8.
#include "softmax.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "../dtypes.h"

namespace carbon {
namespace {

void check_device(const char* op, const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
                    " are not supported (CPU and CUDA only)");
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  const int64_t range = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 and -1
  TORCH_CHECK_VALUE(dim >= -range && dim < range, "carbon.", op, ": dim ", dim,
                    " is out of range for a tensor with ", ndim, " dimensions");
  return dim < 0 ? dim + range : dim;
}

// x viewed as contiguous [rows, n] rows along `dim`.
at::Tensor as_rows(const at::Tensor& x, int64_t dim) {
  if (x.dim() == 0) return x.reshape({1, 1});
  const at::Tensor moved = x.movedim(dim, -1).contiguous();
  return moved.view({-1, std::max<int64_t>(moved.size(-1), 1)});
}

// The [rows, n] result back in x's shape, contiguous (as the fakes promise).
at::Tensor from_rows(const at::Tensor& rows, const at::Tensor& x, int64_t dim) {
  if (x.dim() == 0) return rows.reshape({});
  std::vector<int64_t> moved_shape(x.sizes().begin(), x.sizes().end());
  moved_shape.erase(moved_shape.begin() + dim);
  moved_shape.push_back(x.size(dim));
  return rows.view(moved_shape).movedim(-1, dim).contiguous();
}

at::Tensor forward(const char* op, const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, bool log,
                   bool masked_nan) {
  check_supported_dtype(op, "x", x);
  check_device(op, x);
  const at::ScalarType out_dtype = checked_out_dtype(op, dtype.value_or(x.scalar_type()));
  dim = wrap_dim(op, dim, x.dim());
  if (x.numel() == 0) return at::empty(x.sizes(), x.options().dtype(out_dtype));
  const at::Tensor rows = as_rows(x, dim);
  at::Tensor out = at::empty(rows.sizes(), rows.options().dtype(out_dtype));
  if (x.is_cpu()) {
    softmax_rows_cpu(rows, log, masked_nan, format_of(out_dtype), out);
  } else {
#ifdef CARBON_WITH_CUDA
    softmax_rows_cuda(rows, log, masked_nan, format_of(out_dtype), out);
#endif
  }
  return from_rows(out, x, dim);
}

at::Tensor backward(const char* op, const at::Tensor& grad, const at::Tensor& y, int64_t dim,
                    at::ScalarType input_dtype, bool log) {
  check_supported_dtype(op, "grad", grad);
  check_supported_dtype(op, "y", y);
  check_device(op, y);
  const at::ScalarType out_dtype = checked_out_dtype(op, input_dtype);
  TORCH_CHECK_VALUE(grad.device() == y.device(), "carbon.", op, ": expected all tensors on one device, but grad is on ",
                    grad.device(), " and y is on ", y.device());
  TORCH_CHECK_VALUE(grad.sizes() == y.sizes(), "carbon.", op, ": grad has shape ", grad.sizes(),
                    " but the output has shape ", y.sizes());
  TORCH_CHECK_TYPE(grad.scalar_type() == y.scalar_type(), "carbon.", op, ": grad has dtype ", grad.scalar_type(),
                   " but the output has dtype ", y.scalar_type());
  dim = wrap_dim(op, dim, y.dim());
  if (y.numel() == 0) return at::empty(y.sizes(), y.options().dtype(out_dtype));
  const at::Tensor y_rows = as_rows(y, dim), g_rows = as_rows(grad, dim);
  at::Tensor out = at::empty(y_rows.sizes(), y_rows.options().dtype(out_dtype));
  if (y.is_cpu()) {
    softmax_backward_rows_cpu(g_rows, y_rows, log, format_of(out_dtype), out);
  } else {
#ifdef CARBON_WITH_CUDA
    softmax_backward_rows_cuda(g_rows, y_rows, log, format_of(out_dtype), out);
#endif
  }
  return from_rows(out, y, dim);
}

}  // namespace

at::Tensor softmax(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, bool masked_rows_nan) {
  return forward("softmax", x, dim, dtype, false, masked_rows_nan);
}

at::Tensor log_softmax(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, bool masked_rows_nan) {
  return forward("log_softmax", x, dim, dtype, true, masked_rows_nan);
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& y, int64_t dim, at::ScalarType input_dtype) {
  return backward("softmax_backward", grad, y, dim, input_dtype, false);
}

at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& y, int64_t dim,
                                at::ScalarType input_dtype) {
  return backward("log_softmax_backward", grad, y, dim, input_dtype, true);
}

}  // namespace carbon
