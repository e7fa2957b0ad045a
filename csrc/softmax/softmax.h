// Host-side interface of the softmax family: softmax, log_softmax, their
// gradients, and cross-entropy (built on log_softmax's rows).
#pragma once

#include <ATen/core/Tensor.h>

#include "../exact/float_format.h"

namespace carbon {

// masked_rows_nan: a row of -inf only gives NaN (torch's _softmax) instead of
// carbon's 0 (log_softmax: -inf); carbon.enable's routes set it.
at::Tensor softmax(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, bool masked_rows_nan);
at::Tensor log_softmax(const at::Tensor& x, int64_t dim, std::optional<at::ScalarType> dtype, bool masked_rows_nan);
at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& y, int64_t dim, at::ScalarType input_dtype);
at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& y, int64_t dim,
                                at::ScalarType input_dtype);

// reduction: 0 none, 1 mean, 2 sum (torch's Reduction enum). Returns the
// loss, the float32 log-probabilities (saved for backward) and the number of
// rows whose target is not ignore_index (int64, 0-dim).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                                             int64_t reduction, int64_t ignore_index,
                                                             double label_smoothing);
at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                  const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                  double label_smoothing, at::ScalarType input_dtype);

// Device kernels over contiguous [rows, n] tensors; out has the same shape.
void softmax_rows_cpu(const at::Tensor& x, bool log, bool masked_nan, FormatId format, at::Tensor& out);
void softmax_backward_rows_cpu(const at::Tensor& grad, const at::Tensor& y, bool log, FormatId format,
                               at::Tensor& out);
// Cross-entropy over [N, C] logits: writes log_probs ([N, C] float32),
// loss ([N] in `format` for reduction none, else a 0-dim tensor) and count.
void cross_entropy_cpu(const at::Tensor& logits, const at::Tensor& target, int64_t reduction, int64_t ignore_index,
                       double label_smoothing, FormatId format, at::Tensor& loss, at::Tensor& log_probs,
                       at::Tensor& count);
void cross_entropy_backward_cpu(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                double label_smoothing, FormatId format, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void softmax_rows_cuda(const at::Tensor& x, bool log, bool masked_nan, FormatId format, at::Tensor& out);
void softmax_backward_rows_cuda(const at::Tensor& grad, const at::Tensor& y, bool log, FormatId format,
                                at::Tensor& out);
void cross_entropy_cuda(const at::Tensor& logits, const at::Tensor& target, int64_t reduction, int64_t ignore_index,
                        double label_smoothing, FormatId format, at::Tensor& loss, at::Tensor& log_probs,
                        at::Tensor& count);
void cross_entropy_backward_cuda(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                 const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                 double label_smoothing, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
