// The cross-entropy ops: input checks, then the device's kernels, which
// compute log_softmax rows, each row's loss and the exact reduction.
// docs/contract.md §8.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "../dtypes.h"
#include "softmax.h"

namespace carbon {
namespace {

void check_reduction(const char* op, int64_t reduction) {
  TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, "carbon.", op, ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ",
                    reduction);
}

void check_smoothing(const char* op, double label_smoothing) {
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, "carbon.", op,
                    ": label_smoothing must be in [0, 1], got ", label_smoothing);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                                             int64_t reduction, int64_t ignore_index,
                                                             double label_smoothing) {
  const char* op = "cross_entropy";
  check_supported_dtype(op, "input", logits);
  TORCH_CHECK_VALUE(logits.is_cpu() || logits.is_cuda(), "carbon.", op, ": tensors on ", logits.device(),
                    " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(logits.dim() == 2, "carbon.", op, ": expected 2-D logits [N, C], got shape ", logits.sizes());
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, "carbon.", op,
                   ": target must hold class indices of dtype int64, got ", target.scalar_type());
  TORCH_CHECK_VALUE(target.device() == logits.device(), "carbon.", op,
                    ": expected all tensors on one device, but input is on ", logits.device(), " and target is on ",
                    target.device());
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == logits.size(0), "carbon.", op, ": target has shape ",
                    target.sizes(), " but input has shape ", logits.sizes(), " (expected target of shape [N])");
  TORCH_CHECK_VALUE(logits.size(0) < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 rows are supported");
  TORCH_CHECK_VALUE(logits.size(1) > 0 || logits.size(0) == 0, "carbon.", op, ": input has no classes");
  check_reduction(op, reduction);
  check_smoothing(op, label_smoothing);
  const int64_t N = logits.size(0), C = logits.size(1);
  const at::Tensor x = logits.contiguous(), t = target.contiguous();
  at::Tensor log_probs = at::empty({N, C}, x.options().dtype(at::kFloat));
  at::Tensor loss = reduction == 0 ? at::empty({N}, x.options()) : at::empty({}, x.options());
  at::Tensor count = at::empty({}, x.options().dtype(at::kLong));
  if (x.is_cpu()) {
    cross_entropy_cpu(x, t, reduction, ignore_index, label_smoothing, format_of(x.scalar_type()), loss, log_probs,
                      count);
  } else {
#ifdef CARBON_WITH_CUDA
    cross_entropy_cuda(x, t, reduction, ignore_index, label_smoothing, format_of(x.scalar_type()), loss, log_probs,
                       count);
#endif
  }
  return {loss, log_probs, count};
}

at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                  const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                  double label_smoothing, at::ScalarType input_dtype) {
  const char* op = "cross_entropy_backward";
  check_supported_dtype(op, "grad", grad);
  const at::ScalarType out_dtype = checked_out_dtype(op, input_dtype);
  check_reduction(op, reduction);
  check_smoothing(op, label_smoothing);
  TORCH_CHECK_VALUE(log_probs.dim() == 2 && log_probs.scalar_type() == at::kFloat, "carbon.", op,
                    ": log_probs must be the float32 [N, C] tensor saved by carbon.cross_entropy");
  const int64_t N = log_probs.size(0);
  TORCH_CHECK_VALUE(grad.numel() == (reduction == 0 ? N : 1), "carbon.", op, ": grad has ", grad.numel(),
                    " elements, expected ", (reduction == 0 ? N : 1));
  for (const at::Tensor* t : {&grad, &target, &count})
    TORCH_CHECK_VALUE(t->device() == log_probs.device(), "carbon.", op, ": expected all tensors on one device");
  // The kernels read target[i] for every row and count[0] (the CUDA kernel
  // unchecked, on the device): a shorter target would be read out of bounds.
  TORCH_CHECK_VALUE(target.scalar_type() == at::kLong && target.dim() == 1 && target.size(0) == N, "carbon.", op,
                    ": target must be the int64 [N] class indices, got ", target.scalar_type(), " of shape ",
                    target.sizes(), " for ", N, " rows");
  TORCH_CHECK_VALUE(count.scalar_type() == at::kLong && count.numel() == 1, "carbon.", op,
                    ": count must be the int64 count saved by carbon.cross_entropy");
  at::Tensor out = at::empty(log_probs.sizes(), log_probs.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const at::Tensor g = grad.contiguous(), t = target.contiguous(), lp = log_probs.contiguous();
  if (lp.is_cpu()) {
    cross_entropy_backward_cpu(g, lp, t, count, reduction, ignore_index, label_smoothing, format_of(out_dtype), out);
  } else {
#ifdef CARBON_WITH_CUDA
    cross_entropy_backward_cuda(g, lp, t, count, reduction, ignore_index, label_smoothing, format_of(out_dtype), out);
#endif
  }
  return out;
}

}  // namespace carbon
