// The one place where Carbon's ops are declared and bound to kernels.
// Autograd and fake (meta) implementations are registered from Python
// (carbon/_autograd.py, carbon/_fake.py).
#include <Python.h>
#include <torch/library.h>

#include "matmul/matmul.h"

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
}

// The matmul ops are device-generic at this level (they pick the CPU or CUDA
// kernels for the final rounding step themselves).
TORCH_LIBRARY_IMPL(carbon, CPU, m) {
  m.impl("mm", &carbon::mm);
  m.impl("addmm", &carbon::addmm);
  m.impl("bmm", &carbon::bmm);
  m.impl("baddbmm", &carbon::baddbmm);
}

#ifdef CARBON_WITH_CUDA
TORCH_LIBRARY_IMPL(carbon, CUDA, m) {
  m.impl("mm", &carbon::mm);
  m.impl("addmm", &carbon::addmm);
  m.impl("bmm", &carbon::bmm);
  m.impl("baddbmm", &carbon::baddbmm);
}
#endif
