// Host-side interface of the elementwise math ops: exp, log, tanh, sigmoid,
// erf, gelu (erf form or tanh approximation), silu, sin, cos, log1p, softplus,
// log_sigmoid, expm1, log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos,
// erfinv, asinh, acosh, atanh, lgamma, digamma, trigamma and their backward.
// out = RN_F(f_core(x)) and grad_x = RN_F(g * f'_core(x)) in x's format F,
// with the shared host/device cores of elementwise_math.h and gamma_math.h
// (elementwise_fns.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <type_traits>

#include "../exact/float_format.h"
#include "binary64_math.h"
#include "elementwise_fns.h"

namespace carbon {

at::Tensor exp_op(const at::Tensor& x);
at::Tensor log_op(const at::Tensor& x);
at::Tensor tanh_op(const at::Tensor& x);
at::Tensor sigmoid_op(const at::Tensor& x);
at::Tensor erf_op(const at::Tensor& x);
at::Tensor gelu_op(const at::Tensor& x, c10::string_view approximate);
at::Tensor silu_op(const at::Tensor& x);
at::Tensor sin_op(const at::Tensor& x);
at::Tensor cos_op(const at::Tensor& x);
at::Tensor log1p_op(const at::Tensor& x);
at::Tensor expm1_op(const at::Tensor& x);
at::Tensor log2_op(const at::Tensor& x);
at::Tensor log10_op(const at::Tensor& x);
at::Tensor exp2_op(const at::Tensor& x);
at::Tensor erfc_op(const at::Tensor& x);
at::Tensor sinh_op(const at::Tensor& x);
at::Tensor cosh_op(const at::Tensor& x);
at::Tensor tan_op(const at::Tensor& x);
at::Tensor atan_op(const at::Tensor& x);
at::Tensor asin_op(const at::Tensor& x);
at::Tensor acos_op(const at::Tensor& x);
at::Tensor erfinv_op(const at::Tensor& x);
at::Tensor asinh_op(const at::Tensor& x);
at::Tensor acosh_op(const at::Tensor& x);
at::Tensor atanh_op(const at::Tensor& x);
at::Tensor softplus_op(const at::Tensor& x);
at::Tensor log_sigmoid_op(const at::Tensor& x);
at::Tensor lgamma_op(const at::Tensor& x);
at::Tensor digamma_op(const at::Tensor& x);
at::Tensor trigamma_op(const at::Tensor& x);
// grad_x of function `fn` ("exp", "log", "tanh", "sigmoid", "erf", "gelu",
// "gelu_tanh", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid", "expm1",
// "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh", "acosh",
// "atanh", "lgamma", "digamma", "trigamma") at x for the incoming gradient `grad` (same shape and dtype).
at::Tensor elementwise_backward(const at::Tensor& grad, const at::Tensor& x, c10::string_view fn);

// float64 tensors: exp, log, sin and cos only, from binary64_math.h's
// double-double cores (the other functions raise for float64).
CARBON_HD bool has_binary64(math::Fn fn) {
  return fn == math::Fn::kExp || fn == math::Fn::kLog || fn == math::Fn::kSin || fn == math::Fn::kCos;
}

// One float64 output element. Forward: RN(f(x)) (binary64_math.h). Backward:
// torch's formulas with one rounding each, RN(g * RN(f'(x))) for exp
// (f' = exp), sin (cos) and cos (-sin), RN(g / x) for log. NaN results have
// the canonical bits (CPUs and GPUs propagate NaN payloads differently).
CARBON_HD double binary64_one(math::Fn fn, bool backward, double x, double g) {
  double v;
  switch (fn) {
    case math::Fn::kExp: v = math::b64::exp_core(x); v = backward ? g * v : v; break;
    case math::Fn::kLog: v = backward ? g / x : math::b64::log_core(x); break;
    case math::Fn::kSin: v = backward ? g * math::b64::cos_core(x) : math::b64::sin_core(x); break;
    case math::Fn::kCos: v = backward ? g * -math::b64::sin_core(x) : math::b64::cos_core(x); break;
    default: v = math::quiet_nan(); break;
  }
  return is_nan(v) ? math::quiet_nan() : v;
}

// Device kernels over contiguous tensors of one dtype and size. grad is
// undefined for the forward pass.
void elementwise_cpu(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out);
void elementwise_binary64_cpu(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void elementwise_cuda(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out);
void elementwise_binary64_cuda(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad,
                               at::Tensor& out);
#endif

// Calls body(std::integral_constant<math::Fn, f>{}) for f known at run time.
template <typename Body>
void with_fn(math::Fn f, Body&& body) {
  using math::Fn;
  switch (f) {
    case Fn::kExp: return body(std::integral_constant<Fn, Fn::kExp>{});
    case Fn::kLog: return body(std::integral_constant<Fn, Fn::kLog>{});
    case Fn::kTanh: return body(std::integral_constant<Fn, Fn::kTanh>{});
    case Fn::kSigmoid: return body(std::integral_constant<Fn, Fn::kSigmoid>{});
    case Fn::kErf: return body(std::integral_constant<Fn, Fn::kErf>{});
    case Fn::kGelu: return body(std::integral_constant<Fn, Fn::kGelu>{});
    case Fn::kGeluTanh: return body(std::integral_constant<Fn, Fn::kGeluTanh>{});
    case Fn::kSilu: return body(std::integral_constant<Fn, Fn::kSilu>{});
    case Fn::kSin: return body(std::integral_constant<Fn, Fn::kSin>{});
    case Fn::kCos: return body(std::integral_constant<Fn, Fn::kCos>{});
    case Fn::kLog1p: return body(std::integral_constant<Fn, Fn::kLog1p>{});
    case Fn::kSoftplus: return body(std::integral_constant<Fn, Fn::kSoftplus>{});
    case Fn::kLogSigmoid: return body(std::integral_constant<Fn, Fn::kLogSigmoid>{});
    case Fn::kExpm1: return body(std::integral_constant<Fn, Fn::kExpm1>{});
    case Fn::kLog2: return body(std::integral_constant<Fn, Fn::kLog2>{});
    case Fn::kLog10: return body(std::integral_constant<Fn, Fn::kLog10>{});
    case Fn::kExp2: return body(std::integral_constant<Fn, Fn::kExp2>{});
    case Fn::kErfc: return body(std::integral_constant<Fn, Fn::kErfc>{});
    case Fn::kSinh: return body(std::integral_constant<Fn, Fn::kSinh>{});
    case Fn::kCosh: return body(std::integral_constant<Fn, Fn::kCosh>{});
    case Fn::kTan: return body(std::integral_constant<Fn, Fn::kTan>{});
    case Fn::kAtan: return body(std::integral_constant<Fn, Fn::kAtan>{});
    case Fn::kAsin: return body(std::integral_constant<Fn, Fn::kAsin>{});
    case Fn::kAcos: return body(std::integral_constant<Fn, Fn::kAcos>{});
    case Fn::kErfinv: return body(std::integral_constant<Fn, Fn::kErfinv>{});
    case Fn::kAsinh: return body(std::integral_constant<Fn, Fn::kAsinh>{});
    case Fn::kAcosh: return body(std::integral_constant<Fn, Fn::kAcosh>{});
    case Fn::kAtanh: return body(std::integral_constant<Fn, Fn::kAtanh>{});
    case Fn::kLgamma: return body(std::integral_constant<Fn, Fn::kLgamma>{});
    case Fn::kDigamma: return body(std::integral_constant<Fn, Fn::kDigamma>{});
    case Fn::kTrigamma: return body(std::integral_constant<Fn, Fn::kTrigamma>{});
  }
}

// One output element: RN_F(f(x)) or RN_F(g * f'(x)), as bits of F.
template <math::Fn kFn, bool kBackward, typename F>
CARBON_HD typename F::Bits elementwise_one(typename F::Bits x, typename F::Bits g) {
  constexpr FloatFormat f = F::get();
  const double xv = decode(x, f);
  double v;
  if constexpr (kBackward) {
    v = decode(g, f) * math::grad_core<kFn>(xv);
  } else {
    v = math::forward_core<kFn>(xv);
  }
  return static_cast<typename F::Bits>(encode(round_double(v, f), f));
}

}  // namespace carbon
