// The elementwise functions as compile-time tags (math::Fn) and their cores:
// elementwise_math.h's and gamma_math.h's, for the kernels of elementwise.h.
#pragma once

#include "elementwise_math.h"
#include "gamma_math.h"

namespace carbon {
namespace math {

// ---- dispatch ------------------------------------------------------------------
// The functions as compile-time tags, so kernels specialize per function.
enum class Fn { kExp, kLog, kTanh, kSigmoid, kErf, kGelu, kGeluTanh, kSilu, kSin, kCos, kLog1p, kSoftplus, kLogSigmoid,
                kExpm1, kLog2, kLog10, kExp2, kErfc, kSinh, kCosh, kTan, kAtan, kAsin, kAcos, kErfinv, kAsinh, kAcosh,
                kAtanh, kLgamma, kDigamma, kTrigamma };
constexpr int kNumFns = 31;

template <Fn kFn>
CARBON_HD double forward_core(double x) {
  if constexpr (kFn == Fn::kExp) return exp_core(x);
  if constexpr (kFn == Fn::kLog) return log_core(x);
  if constexpr (kFn == Fn::kTanh) return tanh_core(x);
  if constexpr (kFn == Fn::kSigmoid) return sigmoid_core(x);
  if constexpr (kFn == Fn::kErf) return erf_core(x);
  if constexpr (kFn == Fn::kGelu) return gelu_core(x);
  if constexpr (kFn == Fn::kGeluTanh) return gelu_tanh_core(x);
  if constexpr (kFn == Fn::kSilu) return silu_core(x);
  if constexpr (kFn == Fn::kSin) return sin_core(x);
  if constexpr (kFn == Fn::kCos) return cos_core(x);
  if constexpr (kFn == Fn::kLog1p) return log1p_core(x);
  if constexpr (kFn == Fn::kSoftplus) return softplus_core(x);
  if constexpr (kFn == Fn::kLogSigmoid) return log_sigmoid_core(x);
  if constexpr (kFn == Fn::kExpm1) return expm1_core(x);
  if constexpr (kFn == Fn::kLog2) return log2_core(x);
  if constexpr (kFn == Fn::kLog10) return log10_core(x);
  if constexpr (kFn == Fn::kExp2) return exp2_core(x);
  if constexpr (kFn == Fn::kErfc) return erfc_core(x);
  if constexpr (kFn == Fn::kSinh) return sinh_core(x);
  if constexpr (kFn == Fn::kCosh) return cosh_core(x);
  if constexpr (kFn == Fn::kTan) return tan_core(x);
  if constexpr (kFn == Fn::kAtan) return atan_core(x);
  if constexpr (kFn == Fn::kAsin) return asin_core(x);
  if constexpr (kFn == Fn::kAcos) return acos_core(x);
  if constexpr (kFn == Fn::kErfinv) return erfinv_core(x);
  if constexpr (kFn == Fn::kAsinh) return asinh_core(x);
  if constexpr (kFn == Fn::kAcosh) return acosh_core(x);
  if constexpr (kFn == Fn::kAtanh) return atanh_core(x);
  if constexpr (kFn == Fn::kLgamma) return lgamma_core(x);
  if constexpr (kFn == Fn::kDigamma) return digamma_core(x);
  if constexpr (kFn == Fn::kTrigamma) return trigamma_core(x);
}

template <Fn kFn>
CARBON_HD double grad_core(double x) {
  if constexpr (kFn == Fn::kExp) return exp_grad_core(x);
  if constexpr (kFn == Fn::kLog) return log_grad_core(x);
  if constexpr (kFn == Fn::kTanh) return tanh_grad_core(x);
  if constexpr (kFn == Fn::kSigmoid) return sigmoid_grad_core(x);
  if constexpr (kFn == Fn::kErf) return erf_grad_core(x);
  if constexpr (kFn == Fn::kGelu) return gelu_grad_core(x);
  if constexpr (kFn == Fn::kGeluTanh) return gelu_tanh_grad_core(x);
  if constexpr (kFn == Fn::kSilu) return silu_grad_core(x);
  if constexpr (kFn == Fn::kSin) return sin_grad_core(x);
  if constexpr (kFn == Fn::kCos) return cos_grad_core(x);
  if constexpr (kFn == Fn::kLog1p) return log1p_grad_core(x);
  if constexpr (kFn == Fn::kSoftplus) return softplus_grad_core(x);
  if constexpr (kFn == Fn::kLogSigmoid) return log_sigmoid_grad_core(x);
  if constexpr (kFn == Fn::kExpm1) return expm1_grad_core(x);
  if constexpr (kFn == Fn::kLog2) return log2_grad_core(x);
  if constexpr (kFn == Fn::kLog10) return log10_grad_core(x);
  if constexpr (kFn == Fn::kExp2) return exp2_grad_core(x);
  if constexpr (kFn == Fn::kErfc) return erfc_grad_core(x);
  if constexpr (kFn == Fn::kSinh) return sinh_grad_core(x);
  if constexpr (kFn == Fn::kCosh) return cosh_grad_core(x);
  if constexpr (kFn == Fn::kTan) return tan_grad_core(x);
  if constexpr (kFn == Fn::kAtan) return atan_grad_core(x);
  if constexpr (kFn == Fn::kAsin) return asin_grad_core(x);
  if constexpr (kFn == Fn::kAcos) return acos_grad_core(x);
  if constexpr (kFn == Fn::kErfinv) return erfinv_grad_core(x);
  if constexpr (kFn == Fn::kAsinh) return asinh_grad_core(x);
  if constexpr (kFn == Fn::kAcosh) return acosh_grad_core(x);
  if constexpr (kFn == Fn::kAtanh) return atanh_grad_core(x);
  if constexpr (kFn == Fn::kLgamma) return lgamma_grad_core(x);
  if constexpr (kFn == Fn::kDigamma) return digamma_grad_core(x);
  if constexpr (kFn == Fn::kTrigamma) return trigamma_grad_core(x);
}

// ---- main branches, for vector loops ------------------------------------------
// Where a core takes a rare branch only for tiny arguments (sigmoid's Taylor
// form for |x| < 2^-10, which silu and gelu_tanh reach through it), the CPU
// evaluates main_branch over a whole block -- it has no branches, so the loop
// vectorizes -- and then the core itself for the elements flagged `small`.
// main_branch performs the core's own operations wherever it does not flag
// the element (each core above calls the same *_large function), so the bits
// are the core's. has_main_branch says which functions have one.
template <Fn kFn, bool kBackward>
constexpr bool has_main_branch() {
  return kFn == Fn::kSigmoid ? !kBackward : (kFn == Fn::kSilu || kFn == Fn::kGeluTanh);
}

template <Fn kFn, bool kBackward>
CARBON_HD double main_branch(double x) {
  if constexpr (kFn == Fn::kSigmoid && !kBackward) return sigmoid_large(x);
  if constexpr (kFn == Fn::kSilu) return kBackward ? silu_grad_large(x) : silu_large(x);
  if constexpr (kFn == Fn::kGeluTanh) return kBackward ? gelu_tanh_grad_large(x) : gelu_tanh_large(x);
  return x;
}

// Whether the core takes another branch than main_branch for x: the tiny-argument
// forms, and for the derivatives the series near their roots. (gelu_tanh and its
// derivative clamp x to +-1e10 and -1e10 alike before y: x below -1e10 gives the
// same y either way.)
template <Fn kFn, bool kBackward>
CARBON_HD bool takes_rare_branch(double x) {
  if constexpr (kFn == Fn::kGeluTanh) {
    return gelu_tanh_is_small(x) || (kBackward && near_root(x, kGeluTanhGradRootHi));
  }
  if constexpr (kFn == Fn::kSilu) return sigmoid_is_small(x) || (kBackward && near_root(x, kSiluGradRootHi));
  return sigmoid_is_small(x);
}

}  // namespace math
}  // namespace carbon
