// Host-side interface of the optimizer family: fused AdamW / Adam / SGD
// steps, the exact sum of squares of a list of tensors (gradient norms) and
// the gradient-clipping scale. docs/contract.md §12 defines every result.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "optim_kernel.h"

namespace carbon {

void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList max_exp_avg_sqs, double lr, double beta1, double beta2, double eps, double weight_decay,
                double bias_correction1, double bias_correction2_sqrt, bool decoupled, bool maximize);
// The same step with t (steps[i], already advanced by the caller) and,
// optionally, lr read from tensors where the kernel runs: no host value
// changes from step to step, so a CUDA graph can capture it.
void adam_step_capturable_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps,
                           double lr, const std::optional<at::Tensor>& lr_tensor, double beta1, double beta2,
                           double eps, double weight_decay, bool decoupled, bool maximize);
void sgd_step_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
               double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
               bool first_step);
at::Tensor sum_squares(at::TensorList tensors, bool sqrt);
void clip_scale_(at::TensorList grads, const at::Tensor& total_norm, double max_norm, double eps);

#ifdef CARBON_WITH_CUDA
// Lists of tensors (contiguous and matching, checked by the caller; empty tensors are skipped), on the current
// stream, one launch per run of up to 32 parameters of one dtype. w: AMSGrad's max_exp_avg_sqs, or empty.
// steps: capturable Adam's t per parameter (the kernel sets c's t- and lr-dependent constants from device memory
// and `source`), or empty. b: SGD's momentum buffers, or empty.
void adam_step_cuda(at::TensorList p, at::TensorList g, at::TensorList m, at::TensorList v, at::TensorList w,
                    at::TensorList steps, const AdamConstants& c, const AdamStepSource& source);
void sgd_step_cuda(at::TensorList p, at::TensorList g, at::TensorList b, const SgdConstants& c);
at::Tensor sum_squares_cuda(at::TensorList tensors, bool sqrt);
void clip_scale_cuda(at::TensorList grads, const at::Tensor& total_norm, double max_norm, double eps);
#endif

}  // namespace carbon
