// The one place where Carbon's ops are declared and bound to kernels.
// Autograd and fake (meta) implementations are registered from Python
// (carbon/_autograd.py, carbon/_fake.py).
#include <Python.h>
#include <torch/library.h>

#include "attention/attention.h"
#include "attention/attention_cpu.h"
#include "convert/round_to.h"
// ---- elementwise math (exp, log, tanh, sigmoid, erf, gelu, silu, sin, cos, log1p, softplus, log_sigmoid, expm1,
// log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos) ----
#include "elementwise/elementwise.h"
#include "elementwise/pow.h"
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
  m.def("softmax(Tensor x, int dim, ScalarType? dtype=None) -> Tensor");
  m.def("log_softmax(Tensor x, int dim, ScalarType? dtype=None) -> Tensor");
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
  m.def("softplus(Tensor x) -> Tensor");
  m.def("log_sigmoid(Tensor x) -> Tensor");
  m.def("pow_tensor_scalar(Tensor x, float exponent) -> Tensor");
  m.def("pow_scalar_tensor(float base, Tensor exponent) -> Tensor");
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
  m.def("sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float lr, float momentum, "
        "float dampening, float weight_decay, bool nesterov, bool maximize, bool first_step) -> ()");
  m.def("sum_squares(Tensor[] tensors, bool sqrt=False) -> Tensor");
  m.def("clip_scale_(Tensor(a!)[] grads, Tensor total_norm, float max_norm, float eps=1e-06) -> ()");
  // ---- end optimizers ----
}

// ---- random: the factory ops have no tensor argument to dispatch on; they
// pick the CPU or CUDA kernel from their `device` argument.
TORCH_LIBRARY_IMPL(carbon, CompositeExplicitAutograd, m) {
  m.impl("uniform", &carbon::uniform_op);
  m.impl("normal", &carbon::normal_op);
  m.impl("trunc_normal", &carbon::trunc_normal_op);
  // the state tensor may be in host memory for a draw on a CUDA device, so
  // these, too, go by `device`
  m.impl("uniform.state", &carbon::uniform_state_op);
  m.impl("normal.state", &carbon::normal_state_op);
  m.impl("trunc_normal.state", &carbon::trunc_normal_state_op);
}
// ---- end random ----

// The ops are device-generic at this level: each checks its inputs and
// picks the CPU or CUDA kernels itself, so both dispatch keys bind the same
// functions.
namespace {
void bind_kernels(torch::Library& m) {
  m.impl("mm", &carbon::mm);
  m.impl("addmm", &carbon::addmm);
  m.impl("bmm", &carbon::bmm);
  m.impl("baddbmm", &carbon::baddbmm);
  m.impl("sum", &carbon::sum);
  m.impl("mean", &carbon::mean);
  m.impl("round_to", &carbon::round_to);
  m.impl("sum_divided", &carbon::sum_divided);
  m.impl("cumsum_rows", &carbon::cumsum_rows);
  m.impl("softmax", &carbon::softmax);
  m.impl("log_softmax", &carbon::log_softmax);
  m.impl("softmax_backward", &carbon::softmax_backward);
  m.impl("log_softmax_backward", &carbon::log_softmax_backward);
  m.impl("cross_entropy", &carbon::cross_entropy);
  m.impl("cross_entropy_backward", &carbon::cross_entropy_backward);
  m.impl("attention_logits", &carbon::attention_logits);
  m.impl("attention_probs", &carbon::attention_probs);
  m.impl("attention_probs_backward", &carbon::attention_probs_backward);
  // ---- elementwise math ----
  m.impl("exp", &carbon::exp_op);
  m.impl("log", &carbon::log_op);
  m.impl("tanh", &carbon::tanh_op);
  m.impl("sigmoid", &carbon::sigmoid_op);
  m.impl("erf", &carbon::erf_op);
  m.impl("gelu", &carbon::gelu_op);
  m.impl("silu", &carbon::silu_op);
  m.impl("sin", &carbon::sin_op);
  m.impl("cos", &carbon::cos_op);
  m.impl("log1p", &carbon::log1p_op);
  m.impl("expm1", &carbon::expm1_op);
  m.impl("log2", &carbon::log2_op);
  m.impl("log10", &carbon::log10_op);
  m.impl("exp2", &carbon::exp2_op);
  m.impl("erfc", &carbon::erfc_op);
  m.impl("sinh", &carbon::sinh_op);
  m.impl("cosh", &carbon::cosh_op);
  m.impl("tan", &carbon::tan_op);
  m.impl("atan", &carbon::atan_op);
  m.impl("asin", &carbon::asin_op);
  m.impl("acos", &carbon::acos_op);
  m.impl("softplus", &carbon::softplus_op);
  m.impl("log_sigmoid", &carbon::log_sigmoid_op);
  m.impl("pow_tensor_scalar", &carbon::pow_tensor_scalar);
  m.impl("pow_scalar_tensor", &carbon::pow_scalar_tensor);
  m.impl("elementwise_backward", &carbon::elementwise_backward);
  // ---- end elementwise math ----
  // ---- normalization
  m.impl("layer_norm", &carbon::layer_norm);
  m.impl("rms_norm", &carbon::rms_norm);
  m.impl("var_mean_rows", &carbon::var_mean_rows);
  m.impl("norm_backward", &carbon::norm_backward);
  // ---- indexed accumulation ----
  m.impl("index_add", &carbon::index_add);
  m.impl("scatter_add", &carbon::scatter_add);
  m.impl("embedding", &carbon::embedding);
  m.impl("embedding_backward", &carbon::embedding_backward);
  // ---- end indexed accumulation ----
  // ---- random ----
  m.impl("bernoulli", &carbon::bernoulli_op);
  m.impl("dropout", &carbon::dropout_op);
  m.impl("bernoulli.state", &carbon::bernoulli_state_op);
  m.impl("dropout.state", &carbon::dropout_state_op);
  // ---- end random ----
  // ---- optimizers, gradient clipping ----
  m.impl("adam_step_", &carbon::adam_step_);
  m.impl("sgd_step_", &carbon::sgd_step_);
  m.impl("sum_squares", &carbon::sum_squares);
  m.impl("clip_scale_", &carbon::clip_scale_);
  // ---- end optimizers ----
}
}  // namespace

TORCH_LIBRARY_IMPL(carbon, CPU, m) { bind_kernels(m); }

#ifdef CARBON_WITH_CUDA
TORCH_LIBRARY_IMPL(carbon, CUDA, m) { bind_kernels(m); }
#endif
