// The one place where Carbon's ops are declared and bound to kernels.
// Autograd and fake (meta) implementations are registered from Python
// (carbon/_autograd.py, carbon/_fake.py).
#include <Python.h>
#include <torch/library.h>

#include "convert/round_to.h"
#include "matmul/matmul.h"
#include "norm/norm.h"
#include "reduce/reduce.h"

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

  // ---- normalization (csrc/norm/): layer_norm, rms_norm and their backwards
  m.def("layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_backward(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor mean, Tensor rstd, "
        "Tensor? weight=None) -> Tensor");
  m.def("rms_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor rstd, Tensor? weight=None) "
        "-> Tensor");
  m.def("norm_param_grads(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor? mean, Tensor rstd, "
        "bool weight=True, bool bias=True) -> (Tensor, Tensor)");
}

// The ops are device-generic at this level: each checks its inputs and
// picks the CPU or CUDA kernels itself.
TORCH_LIBRARY_IMPL(carbon, CPU, m) {
  m.impl("mm", &carbon::mm);
  m.impl("addmm", &carbon::addmm);
  m.impl("bmm", &carbon::bmm);
  m.impl("baddbmm", &carbon::baddbmm);
  m.impl("sum", &carbon::sum);
  m.impl("mean", &carbon::mean);
  m.impl("round_to", &carbon::round_to);
  // ---- normalization
  m.impl("layer_norm", &carbon::layer_norm);
  m.impl("layer_norm_backward", &carbon::layer_norm_backward);
  m.impl("rms_norm", &carbon::rms_norm);
  m.impl("rms_norm_backward", &carbon::rms_norm_backward);
  m.impl("norm_param_grads", &carbon::norm_param_grads);
}

#ifdef CARBON_WITH_CUDA
TORCH_LIBRARY_IMPL(carbon, CUDA, m) {
  m.impl("mm", &carbon::mm);
  m.impl("addmm", &carbon::addmm);
  m.impl("bmm", &carbon::bmm);
  m.impl("baddbmm", &carbon::baddbmm);
  m.impl("sum", &carbon::sum);
  m.impl("mean", &carbon::mean);
  m.impl("round_to", &carbon::round_to);
  // ---- normalization
  m.impl("layer_norm", &carbon::layer_norm);
  m.impl("layer_norm_backward", &carbon::layer_norm_backward);
  m.impl("rms_norm", &carbon::rms_norm);
  m.impl("rms_norm_backward", &carbon::rms_norm_backward);
  m.impl("norm_param_grads", &carbon::norm_param_grads);
}
#endif
