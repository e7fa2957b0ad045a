// The normalization ops: input checks, x folded into [rows, n] (n = numel of
// normalized_shape), then the device's row kernel. docs/contract.md §7 states
// what is guaranteed.
#include "norm.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "../dtypes.h"
#include "norm_kernel.h"

namespace carbon {
namespace {

struct Rows {
  int64_t rows = 1, n = 1;
  std::vector<int64_t> lead;  // x.shape[:-len(normalized_shape)]
};

Rows check_x(const char* op, const at::Tensor& x, at::IntArrayRef normalized_shape) {
  check_supported_dtype(op, "x", x);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK_VALUE(k >= 1, "carbon.", op, ": normalized_shape must have at least one dimension");
  TORCH_CHECK_VALUE(k <= x.dim() && x.sizes().slice(x.dim() - k) == normalized_shape, "carbon.", op,
                    ": normalized_shape ", normalized_shape, " does not match the trailing dimensions of x, of shape ",
                    x.sizes());
  Rows r;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < x.dim() - k) {
      r.lead.push_back(x.size(d));
      r.rows *= x.size(d);
    } else {
      r.n *= x.size(d);
    }
  }
  // Three exact-tier terms per element must stay below the accumulator's 2^31.
  TORCH_CHECK_VALUE(r.n <= (int64_t(1) << 29), "carbon.", op, ": at most 2^29 elements can be normalized together");
  return r;
}

// weight / bias: x's dtype and device, shape normalized_shape.
at::Tensor check_param(const char* op, const char* name, const std::optional<at::Tensor>& p, const at::Tensor& x,
                       at::IntArrayRef normalized_shape) {
  if (!p.has_value() || !p->defined()) return at::Tensor();
  TORCH_CHECK_TYPE(p->scalar_type() == x.scalar_type(), "carbon.", op, ": ", name, " has dtype ", p->scalar_type(),
                   " but x has dtype ", x.scalar_type(), "; they must be equal");
  TORCH_CHECK_VALUE(p->device() == x.device(), "carbon.", op, ": expected all tensors on one device, but x is on ",
                    x.device(), " and ", name, " is on ", p->device());
  TORCH_CHECK_VALUE(p->sizes() == normalized_shape, "carbon.", op, ": ", name, " has shape ", p->sizes(),
                    " but normalized_shape is ", normalized_shape);
  return p->contiguous();
}

double checked_eps32(const char* op, double eps) {
  TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "carbon.", op, ": eps must be finite and >= 0, got ", eps);
  return rn32(eps);
}

// A float32 statistic of shape `lead` (one per row).
at::Tensor check_stat(const char* op, const char* name, const at::Tensor& s, const at::Tensor& x, const Rows& r) {
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "carbon.", op, ": ", name, " must be float32, got ",
                   s.scalar_type());
  TORCH_CHECK_VALUE(s.device() == x.device(), "carbon.", op, ": expected all tensors on one device, but x is on ",
                    x.device(), " and ", name, " is on ", s.device());
  TORCH_CHECK_VALUE(s.numel() == r.rows, "carbon.", op, ": ", name, " has shape ", s.sizes(), ", expected ",
                    at::IntArrayRef(r.lead));
  return s.contiguous().view({r.rows});
}

at::Tensor check_grad(const char* op, const at::Tensor& dy, const at::Tensor& x) {
  TORCH_CHECK_TYPE(dy.scalar_type() == x.scalar_type(), "carbon.", op, ": grad_out has dtype ", dy.scalar_type(),
                   " but x has dtype ", x.scalar_type());
  TORCH_CHECK_VALUE(dy.device() == x.device(), "carbon.", op, ": expected all tensors on one device, but x is on ",
                    x.device(), " and grad_out is on ", dy.device());
  TORCH_CHECK_VALUE(dy.sizes() == x.sizes(), "carbon.", op, ": grad_out has shape ", dy.sizes(), " but x has shape ",
                    x.sizes());
  return dy.contiguous();
}

void run_forward(NormArgs& a, at::Tensor& y) {
  if (a.x.is_cpu()) {
    norm_forward_cpu(a, y);
  } else {
#ifdef CARBON_WITH_CUDA
    norm_forward_cuda(a, y);
#endif
  }
}

void run_backward(NormArgs& a, const at::Tensor& dy, at::Tensor& dx) {
  if (a.x.is_cpu()) {
    norm_backward_cpu(a, dy, dx);
  } else {
#ifdef CARBON_WITH_CUDA
    norm_backward_cuda(a, dy, dx);
#endif
  }
}

// Shared forward: fills y and the statistics (n = 0: the statistics are
// 0/0 = NaN, y is empty).
void forward(NormArgs& a, const Rows& r, at::Tensor& y) {
  if (r.rows == 0) return;
  if (r.n == 0) {
    if (a.mean.defined()) a.mean.fill_(std::numeric_limits<double>::quiet_NaN());
    a.rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  run_forward(a, y);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "layer_norm";
  const Rows r = check_x(op, x, normalized_shape);
  NormArgs a;
  a.weight = check_param(op, "weight", weight, x, normalized_shape);
  a.bias = check_param(op, "bias", bias, x, normalized_shape);
  a.eps32 = checked_eps32(op, eps);
  a.x = x.contiguous().view({r.rows, r.n});
  at::Tensor y = at::empty({r.rows, r.n}, a.x.options());
  a.mean = at::empty({r.rows}, x.options().dtype(at::kFloat));
  a.rstd = at::empty({r.rows}, x.options().dtype(at::kFloat));
  forward(a, r, y);
  return {y.view(x.sizes()), a.mean.view(r.lead), a.rstd.view(r.lead)};
}

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                            const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const char* op = "rms_norm";
  const Rows r = check_x(op, x, normalized_shape);
  NormArgs a;
  a.rms = true;
  a.weight = check_param(op, "weight", weight, x, normalized_shape);
  // torch's default: the float32 machine epsilon, whatever x's dtype.
  a.eps32 = checked_eps32(op, eps.value_or(static_cast<double>(std::numeric_limits<float>::epsilon())));
  a.x = x.contiguous().view({r.rows, r.n});
  at::Tensor y = at::empty({r.rows, r.n}, a.x.options());
  a.rstd = at::empty({r.rows}, x.options().dtype(at::kFloat));
  forward(a, r, y);
  return {y.view(x.sizes()), a.rstd.view(r.lead)};
}

namespace {

// dw / db (each undefined when not wanted): the column sums, by the device's
// kernels.
void param_grads(const NormArgs& a, const Rows& r, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db) {
  if (r.n == 0) return;
  if (a.x.is_cpu()) {
    norm_param_grads_cpu(a, dy, dw, db);
  } else {
#ifdef CARBON_WITH_CUDA
    norm_param_grads_cuda(a, dy, dw, db);
#endif
  }
}

void check_param_grad_rows(const char* op, const Rows& r) {
  TORCH_CHECK_VALUE(r.rows < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 rows");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                             at::IntArrayRef normalized_shape,
                                                             const std::optional<at::Tensor>& mean,
                                                             const at::Tensor& rstd,
                                                             const std::optional<at::Tensor>& weight,
                                                             std::array<bool, 3> output_mask) {
  const char* op = "norm_backward";
  const Rows r = check_x(op, x, normalized_shape);
  const bool want_x = output_mask[0], want_w = output_mask[1], want_b = output_mask[2];
  if (want_w || want_b) check_param_grad_rows(op, r);
  NormArgs a;
  a.rms = !(mean.has_value() && mean->defined());
  a.weight = check_param(op, "weight", weight, x, normalized_shape);
  const at::Tensor dy = check_grad(op, grad_out, x).view({r.rows, r.n});
  if (!a.rms) a.mean = check_stat(op, "mean", *mean, x, r);
  a.rstd = check_stat(op, "rstd", rstd, x, r);
  a.x = x.contiguous().view({r.rows, r.n});
  at::Tensor dx = want_x ? at::empty({r.rows, r.n}, x.options()) : at::Tensor();
  at::Tensor dw = want_w ? at::empty({r.n}, x.options()) : at::Tensor();
  at::Tensor db = want_b ? at::empty({r.n}, x.options()) : at::Tensor();
  const bool any_rows = r.rows > 0 && r.n > 0;
  if (want_x && (want_w || want_b) && any_rows && x.is_cpu()) {
    norm_backward_fused_cpu(a, dy, dx, dw, db);
  } else {
    if (want_x && any_rows) run_backward(a, dy, dx);
    param_grads(a, r, dy, dw, db);
  }
  // A fresh empty tensor for each output not asked for (outputs must not alias).
  const auto none = [&] { return at::empty({0}, x.options()); };
  return {want_x ? dx.view(x.sizes()) : none(), want_w ? dw.view(normalized_shape) : none(),
          want_b ? db.view(normalized_shape) : none()};
}

}  // namespace carbon
