// The one place where Carbon's ops are declared and bound to kernels.
// Autograd and fake (meta) implementations are registered from Python
// (carbon/_autograd.py, carbon/_fake.py).
#include <ATen/core/Tensor.h>
#include <Python.h>
#include <torch/library.h>

#include "attention/attention.h"
#include "attention/attention_cpu.h"
#include "convert/round_to.h"
#include "exact/fp_env.h"
// ---- elementwise math (exp, log, tanh, sigmoid, erf, gelu, silu, sin, cos, log1p, softplus, log_sigmoid, expm1,
// log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos, erfinv, asinh, acosh, atanh, lgamma, digamma,
// trigamma) ----
#include "elementwise/elementwise.h"
#include "elementwise/pow.h"
#include "elementwise/two_argument.h"
// ---- end elementwise math ----
#include "matmul/matmul.h"
#include "norm/norm.h"
#include "norm/variance.h"
// ---- random (Philox; csrc/random/) ----
#include "random/random.h"
// ---- end random ----
// ---- optimizers (csrc/optim/) ----
#include "optim/optim.h"
// ---- end optimizers ----
#include "reduce/cumsum.h"
#include "reduce/reduce.h"
#include "reduce/sum_divided.h"
// ---- indexed accumulation (csrc/scatter/) ----
#include "scatter/scatter.h"
// ---- end indexed accumulation ----
#include "softmax/softmax.h"

// `import carbon._C` loads this library, which runs the registrations below.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "Carbon's compiled kernels", -1, nullptr};
  return PyModule_Create(&module);
}

TORCH_LIBRARY(carbon, m) {
  m.def("mm(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
  m.def("addmm(Tensor bias, Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
  m.def("bmm(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
  m.def("baddbmm(Tensor bias, Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
  m.def("sum(Tensor x, int[]? dim=None, bool keepdim=False, ScalarType? dtype=None) -> Tensor");
  m.def("mean(Tensor x, int[]? dim=None, bool keepdim=False, ScalarType? dtype=None) -> Tensor");
  m.def("round_to(Tensor x, ScalarType dtype, int divisor=1) -> Tensor");
  m.def("sum_divided(Tensor x, Tensor divisor) -> Tensor");
  m.def("cumsum_rows(Tensor x, ScalarType? dtype=None) -> Tensor");
  // softmax family (csrc/softmax/)
  m.def("softmax(Tensor x, int dim, ScalarType? dtype=None, bool masked_rows_nan=False) -> Tensor");
  m.def("log_softmax(Tensor x, int dim, ScalarType? dtype=None, bool masked_rows_nan=False) -> Tensor");
  m.def("softmax_backward(Tensor grad, Tensor y, int dim, ScalarType input_dtype) -> Tensor");
  m.def("log_softmax_backward(Tensor grad, Tensor y, int dim, ScalarType input_dtype) -> Tensor");
  m.def("cross_entropy(Tensor input, Tensor target, int reduction=1, int ignore_index=-100, "
        "float label_smoothing=0.0) -> (Tensor loss, Tensor log_probs, Tensor count)");
  m.def("cross_entropy_backward(Tensor grad, Tensor log_probs, Tensor target, Tensor count, int reduction, "
        "int ignore_index, float label_smoothing, ScalarType input_dtype) -> Tensor");
  // attention (csrc/attention/; the rest of attention is bmm and softmax)
  m.def("attention_logits(Tensor scores, float scale, Tensor? mask=None, bool causal=False) -> Tensor");
  m.def("attention_probs(Tensor q, Tensor k, float scale, Tensor? mask=None, bool causal=False) -> Tensor");
  m.def("attention_probs_backward(Tensor grad, Tensor probs, float scale) -> Tensor");
  // ---- elementwise math ----
  m.def("exp(Tensor x) -> Tensor");
  m.def("log(Tensor x) -> Tensor");
  m.def("tanh(Tensor x) -> Tensor");
  m.def("sigmoid(Tensor x) -> Tensor");
  m.def("erf(Tensor x) -> Tensor");
  m.def("gelu(Tensor x, str approximate='none') -> Tensor");
  m.def("silu(Tensor x) -> Tensor");
  m.def("sin(Tensor x) -> Tensor");
  m.def("cos(Tensor x) -> Tensor");
  m.def("log1p(Tensor x) -> Tensor");
  m.def("expm1(Tensor x) -> Tensor");
  m.def("log2(Tensor x) -> Tensor");
  m.def("log10(Tensor x) -> Tensor");
  m.def("exp2(Tensor x) -> Tensor");
  m.def("erfc(Tensor x) -> Tensor");
  m.def("sinh(Tensor x) -> Tensor");
  m.def("cosh(Tensor x) -> Tensor");
  m.def("tan(Tensor x) -> Tensor");
  m.def("atan(Tensor x) -> Tensor");
  m.def("asin(Tensor x) -> Tensor");
  m.def("acos(Tensor x) -> Tensor");
  m.def("erfinv(Tensor x) -> Tensor");
  m.def("asinh(Tensor x) -> Tensor");
  m.def("acosh(Tensor x) -> Tensor");
  m.def("atanh(Tensor x) -> Tensor");
  m.def("softplus(Tensor x) -> Tensor");
  m.def("log_sigmoid(Tensor x) -> Tensor");
  m.def("lgamma(Tensor x) -> Tensor");
  m.def("digamma(Tensor x) -> Tensor");
  m.def("trigamma(Tensor x) -> Tensor");
  m.def("pow_tensor_scalar(Tensor x, float exponent) -> Tensor");
  m.def("pow_scalar_tensor(float base, Tensor exponent) -> Tensor");
  m.def("sqrt(Tensor x) -> Tensor");
  m.def("atan2(Tensor y, Tensor x) -> Tensor");
  m.def("hypot(Tensor x, Tensor y) -> Tensor");
  m.def("pow_tensor_tensor(Tensor x, Tensor exponent) -> Tensor");
  m.def("elementwise_backward(Tensor grad, Tensor x, str fn) -> Tensor");
  // ---- end elementwise math ----

  // ---- normalization (csrc/norm/): layer_norm, rms_norm, their backward (norm_backward), var_mean_rows
  m.def("layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("rms_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor, Tensor)");
  m.def("var_mean_rows(Tensor x, int correction=1) -> (Tensor, Tensor)");
  m.def("norm_backward(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor? mean, Tensor rstd, "
        "Tensor? weight=None, bool[3] output_mask=[True, True, True]) -> (Tensor, Tensor, Tensor)");
  // ---- indexed accumulation (csrc/scatter/): docs/contract.md §11 ----
  m.def("index_add(Tensor self, int dim, Tensor index, Tensor source) -> Tensor");
  m.def("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor");
  m.def("embedding(Tensor weight, Tensor indices, int padding_idx=-1) -> Tensor");
  m.def("embedding_backward(Tensor grad, Tensor indices, int num_weights, int padding_idx=-1) -> Tensor");
  // ---- end indexed accumulation ----

  // ---- random (csrc/random/; docs/contract.md §10) ----
  // seed: the generator's 64-bit seed as a signed int (two's complement);
  // offset: the generator's offset (>= 0) at the time of the draw.
  m.def("uniform(int[] size, int seed, int offset, float low, float high, ScalarType dtype, Device device) -> Tensor");
  m.def("normal(int[] size, int seed, int offset, float mean, float std, ScalarType dtype, Device device) -> Tensor");
  m.def("trunc_normal(int[] size, int seed, int offset, float mean, float std, float a, float b, "
        "ScalarType dtype, Device device) -> Tensor");
  m.def("bernoulli(Tensor probs, int seed, int offset, float? p=None) -> Tensor");
  m.def("dropout(Tensor x, float p, int seed, int offset) -> Tensor");
  // The .state overloads take (seed, offset) as a tensor, int64 [seed, offset]
  // in host memory or on the draw's device (carbon.Generator's draws): under
  // torch.compile a graph input rather than constants, in a CUDA graph read
  // by the kernel at each replay.
  m.def("uniform.state(int[] size, Tensor state, float low, float high, ScalarType dtype, Device device) -> Tensor");
  m.def("normal.state(int[] size, Tensor state, float mean, float std, ScalarType dtype, Device device) -> Tensor");
  m.def("trunc_normal.state(int[] size, Tensor state, float mean, float std, float a, float b, "
        "ScalarType dtype, Device device) -> Tensor");
  m.def("bernoulli.state(Tensor probs, Tensor state, float? p=None) -> Tensor");
  m.def("dropout.state(Tensor x, float p, Tensor state) -> Tensor");
  // ---- end random ----
  // ---- optimizers, gradient clipping (csrc/optim/; contract §12) ----
  // max_exp_avg_sqs: AMSGrad's states (torch's name and place in _fused_adam_), empty without AMSGrad.
  m.def("adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)[] max_exp_avg_sqs, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "float bias_correction1, float bias_correction2_sqrt, bool decoupled, bool maximize) -> ()");
  // steps: each parameter's t (torch's state_steps, already advanced); lr_tensor, when given, replaces lr.
  // Both are read where the kernel runs, so a CUDA graph can capture the step.
  m.def("adam_step_capturable_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor[] steps, float lr, Tensor? lr_tensor, "
        "float beta1, float beta2, float eps, float weight_decay, bool decoupled, bool maximize) -> ()");
  m.def("sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float lr, float momentum, "
        "float dampening, float weight_decay, bool nesterov, bool maximize, bool first_step) -> ()");
  m.def("sum_squares(Tensor[] tensors, bool sqrt=False) -> Tensor");
  m.def("clip_scale_(Tensor(a!)[] grads, Tensor total_norm, float max_norm, float eps=1e-06) -> ()");
  // ---- end optimizers ----
}

// ---- random: the factory ops have no tensor argument to dispatch on; they
// pick the CPU or CUDA kernel from their `device` argument.
TORCH_LIBRARY_IMPL(carbon, CompositeExplicitAutograd, m) {
  m.impl("uniform", &carbon::in_default_fp_env<&carbon::uniform_op>::call);
  m.impl("normal", &carbon::in_default_fp_env<&carbon::normal_op>::call);
  m.impl("trunc_normal", &carbon::in_default_fp_env<&carbon::trunc_normal_op>::call);
  // the state tensor may be in host memory for a draw on a CUDA device, so
  // these, too, go by `device`
  m.impl("uniform.state", &carbon::in_default_fp_env<&carbon::uniform_state_op>::call);
  m.impl("normal.state", &carbon::in_default_fp_env<&carbon::normal_state_op>::call);
  m.impl("trunc_normal.state", &carbon::in_default_fp_env<&carbon::trunc_normal_state_op>::call);
}
// ---- end random ----

// The ops are device-generic at this level: each checks its inputs and
// picks the CPU or CUDA kernels itself, so both dispatch keys bind the same
// functions. Every op runs with its thread in the default floating-point
// environment (exact/fp_env.h), so a caller's flush-to-zero setting
// changes no bit.
namespace {
void bind_kernels(torch::Library& m) {
  m.impl("mm", &carbon::in_default_fp_env<&carbon::mm>::call);
  m.impl("addmm", &carbon::in_default_fp_env<&carbon::addmm>::call);
  m.impl("bmm", &carbon::in_default_fp_env<&carbon::bmm>::call);
  m.impl("baddbmm", &carbon::in_default_fp_env<&carbon::baddbmm>::call);
  m.impl("sum", &carbon::in_default_fp_env<&carbon::sum>::call);
  m.impl("mean", &carbon::in_default_fp_env<&carbon::mean>::call);
  m.impl("round_to", &carbon::in_default_fp_env<&carbon::round_to>::call);
  m.impl("sum_divided", &carbon::in_default_fp_env<&carbon::sum_divided>::call);
  m.impl("cumsum_rows", &carbon::in_default_fp_env<&carbon::cumsum_rows>::call);
  m.impl("softmax", &carbon::in_default_fp_env<&carbon::softmax>::call);
  m.impl("log_softmax", &carbon::in_default_fp_env<&carbon::log_softmax>::call);
  m.impl("softmax_backward", &carbon::in_default_fp_env<&carbon::softmax_backward>::call);
  m.impl("log_softmax_backward", &carbon::in_default_fp_env<&carbon::log_softmax_backward>::call);
  m.impl("cross_entropy", &carbon::in_default_fp_env<&carbon::cross_entropy>::call);
  m.impl("cross_entropy_backward", &carbon::in_default_fp_env<&carbon::cross_entropy_backward>::call);
  m.impl("attention_logits", &carbon::in_default_fp_env<&carbon::attention_logits>::call);
  m.impl("attention_probs", &carbon::in_default_fp_env<&carbon::attention_probs>::call);
  m.impl("attention_probs_backward", &carbon::in_default_fp_env<&carbon::attention_probs_backward>::call);
  // ---- elementwise math ----
  m.impl("exp", &carbon::in_default_fp_env<&carbon::exp_op>::call);
  m.impl("log", &carbon::in_default_fp_env<&carbon::log_op>::call);
  m.impl("tanh", &carbon::in_default_fp_env<&carbon::tanh_op>::call);
  m.impl("sigmoid", &carbon::in_default_fp_env<&carbon::sigmoid_op>::call);
  m.impl("erf", &carbon::in_default_fp_env<&carbon::erf_op>::call);
  m.impl("gelu", &carbon::in_default_fp_env<&carbon::gelu_op>::call);
  m.impl("silu", &carbon::in_default_fp_env<&carbon::silu_op>::call);
  m.impl("sin", &carbon::in_default_fp_env<&carbon::sin_op>::call);
  m.impl("cos", &carbon::in_default_fp_env<&carbon::cos_op>::call);
  m.impl("log1p", &carbon::in_default_fp_env<&carbon::log1p_op>::call);
  m.impl("expm1", &carbon::in_default_fp_env<&carbon::expm1_op>::call);
  m.impl("log2", &carbon::in_default_fp_env<&carbon::log2_op>::call);
  m.impl("log10", &carbon::in_default_fp_env<&carbon::log10_op>::call);
  m.impl("exp2", &carbon::in_default_fp_env<&carbon::exp2_op>::call);
  m.impl("erfc", &carbon::in_default_fp_env<&carbon::erfc_op>::call);
  m.impl("sinh", &carbon::in_default_fp_env<&carbon::sinh_op>::call);
  m.impl("cosh", &carbon::in_default_fp_env<&carbon::cosh_op>::call);
  m.impl("tan", &carbon::in_default_fp_env<&carbon::tan_op>::call);
  m.impl("atan", &carbon::in_default_fp_env<&carbon::atan_op>::call);
  m.impl("asin", &carbon::in_default_fp_env<&carbon::asin_op>::call);
  m.impl("acos", &carbon::in_default_fp_env<&carbon::acos_op>::call);
  m.impl("erfinv", &carbon::in_default_fp_env<&carbon::erfinv_op>::call);
  m.impl("asinh", &carbon::in_default_fp_env<&carbon::asinh_op>::call);
  m.impl("acosh", &carbon::in_default_fp_env<&carbon::acosh_op>::call);
  m.impl("atanh", &carbon::in_default_fp_env<&carbon::atanh_op>::call);
  m.impl("softplus", &carbon::in_default_fp_env<&carbon::softplus_op>::call);
  m.impl("log_sigmoid", &carbon::in_default_fp_env<&carbon::log_sigmoid_op>::call);
  m.impl("lgamma", &carbon::in_default_fp_env<&carbon::lgamma_op>::call);
  m.impl("digamma", &carbon::in_default_fp_env<&carbon::digamma_op>::call);
  m.impl("trigamma", &carbon::in_default_fp_env<&carbon::trigamma_op>::call);
  m.impl("pow_tensor_scalar", &carbon::in_default_fp_env<&carbon::pow_tensor_scalar>::call);
  m.impl("pow_scalar_tensor", &carbon::in_default_fp_env<&carbon::pow_scalar_tensor>::call);
  m.impl("sqrt", &carbon::in_default_fp_env<&carbon::sqrt_op>::call);
  m.impl("atan2", &carbon::in_default_fp_env<&carbon::atan2_op>::call);
  m.impl("hypot", &carbon::in_default_fp_env<&carbon::hypot_op>::call);
  m.impl("pow_tensor_tensor", &carbon::in_default_fp_env<&carbon::pow_tensor_tensor>::call);
  m.impl("elementwise_backward", &carbon::in_default_fp_env<&carbon::elementwise_backward>::call);
  // ---- end elementwise math ----
  // ---- normalization
  m.impl("layer_norm", &carbon::in_default_fp_env<&carbon::layer_norm>::call);
  m.impl("rms_norm", &carbon::in_default_fp_env<&carbon::rms_norm>::call);
  m.impl("var_mean_rows", &carbon::in_default_fp_env<&carbon::var_mean_rows>::call);
  m.impl("norm_backward", &carbon::in_default_fp_env<&carbon::norm_backward>::call);
  // ---- indexed accumulation ----
  m.impl("index_add", &carbon::in_default_fp_env<&carbon::index_add>::call);
  m.impl("scatter_add", &carbon::in_default_fp_env<&carbon::scatter_add>::call);
  m.impl("embedding", &carbon::in_default_fp_env<&carbon::embedding>::call);
  m.impl("embedding_backward", &carbon::in_default_fp_env<&carbon::embedding_backward>::call);
  // ---- end indexed accumulation ----
  // ---- random ----
  m.impl("bernoulli", &carbon::in_default_fp_env<&carbon::bernoulli_op>::call);
  m.impl("dropout", &carbon::in_default_fp_env<&carbon::dropout_op>::call);
  m.impl("bernoulli.state", &carbon::in_default_fp_env<&carbon::bernoulli_state_op>::call);
  m.impl("dropout.state", &carbon::in_default_fp_env<&carbon::dropout_state_op>::call);
  // ---- end random ----
  // ---- optimizers, gradient clipping ----
  m.impl("adam_step_", &carbon::in_default_fp_env<&carbon::adam_step_>::call);
  m.impl("adam_step_capturable_", &carbon::in_default_fp_env<&carbon::adam_step_capturable_>::call);
  m.impl("sgd_step_", &carbon::in_default_fp_env<&carbon::sgd_step_>::call);
  m.impl("sum_squares", &carbon::in_default_fp_env<&carbon::sum_squares>::call);
  m.impl("clip_scale_", &carbon::in_default_fp_env<&carbon::clip_scale_>::call);
  // ---- end optimizers ----
}
}  // namespace

TORCH_LIBRARY_IMPL(carbon, CPU, m) { bind_kernels(m); }

#ifdef CARBON_WITH_CUDA
TORCH_LIBRARY_IMPL(carbon, CUDA, m) { bind_kernels(m); }
#endif
