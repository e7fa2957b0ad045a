// The elementwise math ops: input checks and the CPU kernel.
#include "elementwise.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/fp_env.h"

namespace carbon {
namespace {

// One function, one direction, one format: the loops the compiler sees have
// constants for everything (specialized per function and format). Each
// block of kBlock elements goes through three loops that vectorize: decode,
// the fp64 core, round and encode; decode and encode take the branch-free
// normal-range paths of float_format.h and redo the block with the general
// ones when some value is not normal.
// The values are those of elementwise_one, element by element.
constexpr int64_t kBlock = 256;

template <math::Fn kFn, bool kBackward, typename F>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void elementwise_range(
    const typename F::Bits* __restrict__ x, const typename F::Bits* __restrict__ g, typename F::Bits* __restrict__ out,
    int64_t begin, int64_t end) {
  constexpr FloatFormat f = F::get();
  double v[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    uint32_t all_normal = 1;
    for (int64_t i = 0; i < n; ++i) {
      all_normal &= is_normal_bits(x[b + i], f);
      v[i] = decode_normal(x[b + i], f);
    }
    if (!all_normal)
      for (int64_t i = 0; i < n; ++i) v[i] = decode(x[b + i], f);
    if constexpr (math::has_main_branch<kFn, kBackward>()) {
      // The branch-free main branch for every element (vectorizes), then
      // the core for the few it flags (tiny arguments): the core's bits.
      double w[kBlock];
      uint32_t small[kBlock], any_small = 0;
      for (int64_t i = 0; i < n; ++i) w[i] = math::main_branch<kFn, kBackward>(v[i]);
      for (int64_t i = 0; i < n; ++i) {  // a loop of its own: fused, gelu_tanh's gradient did not vectorize
        small[i] = math::takes_rare_branch<kFn, kBackward>(v[i]);
        any_small |= small[i];
      }
      if (any_small)
        for (int64_t i = 0; i < n; ++i)
          if (small[i]) w[i] = kBackward ? math::grad_core<kFn>(v[i]) : math::forward_core<kFn>(v[i]);
      if constexpr (kBackward)
        for (int64_t i = 0; i < n; ++i) v[i] = decode(g[b + i], f) * w[i];
      else
        for (int64_t i = 0; i < n; ++i) v[i] = w[i];
    } else if constexpr (kBackward) {
      for (int64_t i = 0; i < n; ++i) v[i] = math::grad_core<kFn>(v[i]);
      for (int64_t i = 0; i < n; ++i) v[i] = decode(g[b + i], f) * v[i];
    } else if constexpr (kFn == math::Fn::kExp) {
      // Every input is a float32 value and F has at most float32's range:
      // exp_f32_core rounds to the same bits as exp_core, with fewer
      // instructions (elementwise_math.h; checked for all 2^32 patterns).
      for (int64_t i = 0; i < n; ++i) v[i] = math::exp_f32_core(v[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = math::forward_core<kFn>(v[i]);
    }
    uint32_t all_ok = 1;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t ok;
      out[b + i] = static_cast<typename F::Bits>(round_encode_normal(v[i], f, &ok));
      all_ok &= ok;
    }
    if (!all_ok)
      for (int64_t i = 0; i < n; ++i) out[b + i] = static_cast<typename F::Bits>(encode(round_double(v[i], f), f));
  }
}

const char* op_name(math::Fn fn) {
  switch (fn) {
    case math::Fn::kExp: return "exp";
    case math::Fn::kLog: return "log";
    case math::Fn::kTanh: return "tanh";
    case math::Fn::kSigmoid: return "sigmoid";
    case math::Fn::kErf: return "erf";
    case math::Fn::kGelu: return "gelu";
    case math::Fn::kGeluTanh: return "gelu";
    case math::Fn::kSilu: return "silu";
    case math::Fn::kSin: return "sin";
    case math::Fn::kCos: return "cos";
    case math::Fn::kLog1p: return "log1p";
    case math::Fn::kSoftplus: return "softplus";
    case math::Fn::kLogSigmoid: return "log_sigmoid";
    case math::Fn::kExpm1: return "expm1";
    case math::Fn::kLog2: return "log2";
    case math::Fn::kLog10: return "log10";
    case math::Fn::kExp2: return "exp2";
    case math::Fn::kErfc: return "erfc";
    case math::Fn::kSinh: return "sinh";
    case math::Fn::kCosh: return "cosh";
    case math::Fn::kTan: return "tan";
    case math::Fn::kAtan: return "atan";
    case math::Fn::kAsin: return "asin";
    case math::Fn::kAcos: return "acos";
    case math::Fn::kErfinv: return "erfinv";
    case math::Fn::kAsinh: return "asinh";
    case math::Fn::kAcosh: return "acosh";
    case math::Fn::kAtanh: return "atanh";
    case math::Fn::kLgamma: return "lgamma";
    case math::Fn::kDigamma: return "digamma";
    case math::Fn::kTrigamma: return "trigamma";
  }
  return "?";
}

void check_device(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "carbon.", op, ": tensors on ", t.device(),
              " are not supported (CPU and CUDA only)");
}

bool is_binary64(math::Fn fn, const at::Tensor& x) {
  return x.scalar_type() == at::kDouble && has_binary64(fn);
}

void check_dtype(math::Fn fn, const char* op, const char* name, const at::Tensor& t) {
  if (!is_binary64(fn, t)) check_supported_dtype(op, name, t);
}

// Runs the float32/bfloat16/float16 kernels or the float64 ones.
void launch(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out) {
  const bool b64 = is_binary64(fn, x);
  if (x.is_cpu()) {
    if (b64)
      elementwise_binary64_cpu(fn, backward, x, grad, out);
    else
      elementwise_cpu(fn, backward, x, grad, out);
  } else {
#ifdef CARBON_WITH_CUDA
    if (b64)
      elementwise_binary64_cuda(fn, backward, x, grad, out);
    else
      elementwise_cuda(fn, backward, x, grad, out);
#endif
  }
}

at::Tensor run(math::Fn fn, const at::Tensor& x) {
  const char* op = op_name(fn);
  check_dtype(fn, op, "x", x);
  check_device(op, x);
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  launch(fn, false, input, at::Tensor(), out);
  return out;
}

}  // namespace

void elementwise_cpu(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out) {
  with_format(format_of(x.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    const Bits* xp = static_cast<const Bits*>(x.const_data_ptr());
    const Bits* gp = backward ? static_cast<const Bits*>(grad.const_data_ptr()) : nullptr;
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    with_fn(fn, [&](auto fn_tag) {
      constexpr math::Fn kFn = decltype(fn_tag)::value;
      carbon::parallel_for(0, x.numel(), 8192, [&](int64_t begin, int64_t end) {
        if (backward)
          elementwise_range<kFn, true, F>(xp, gp, op, begin, end);
        else
          elementwise_range<kFn, false, F>(xp, gp, op, begin, end);
      });
    });
  });
}

void elementwise_binary64_cpu(math::Fn fn, bool backward, const at::Tensor& x, const at::Tensor& grad, at::Tensor& out) {
  const double* xp = x.const_data_ptr<double>();
  const double* gp = backward ? grad.const_data_ptr<double>() : nullptr;
  double* op = out.mutable_data_ptr<double>();
  carbon::parallel_for(0, x.numel(), 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) op[i] = binary64_one(fn, backward, xp[i], backward ? gp[i] : 0.0);
  });
}

at::Tensor exp_op(const at::Tensor& x) { return run(math::Fn::kExp, x); }
at::Tensor log_op(const at::Tensor& x) { return run(math::Fn::kLog, x); }
at::Tensor tanh_op(const at::Tensor& x) { return run(math::Fn::kTanh, x); }
at::Tensor sigmoid_op(const at::Tensor& x) { return run(math::Fn::kSigmoid, x); }
at::Tensor erf_op(const at::Tensor& x) { return run(math::Fn::kErf, x); }
at::Tensor silu_op(const at::Tensor& x) { return run(math::Fn::kSilu, x); }
at::Tensor sin_op(const at::Tensor& x) { return run(math::Fn::kSin, x); }
at::Tensor cos_op(const at::Tensor& x) { return run(math::Fn::kCos, x); }
at::Tensor log1p_op(const at::Tensor& x) { return run(math::Fn::kLog1p, x); }
at::Tensor expm1_op(const at::Tensor& x) { return run(math::Fn::kExpm1, x); }
at::Tensor log2_op(const at::Tensor& x) { return run(math::Fn::kLog2, x); }
at::Tensor log10_op(const at::Tensor& x) { return run(math::Fn::kLog10, x); }
at::Tensor exp2_op(const at::Tensor& x) { return run(math::Fn::kExp2, x); }
at::Tensor erfc_op(const at::Tensor& x) { return run(math::Fn::kErfc, x); }
at::Tensor sinh_op(const at::Tensor& x) { return run(math::Fn::kSinh, x); }
at::Tensor cosh_op(const at::Tensor& x) { return run(math::Fn::kCosh, x); }
at::Tensor tan_op(const at::Tensor& x) { return run(math::Fn::kTan, x); }
at::Tensor atan_op(const at::Tensor& x) { return run(math::Fn::kAtan, x); }
at::Tensor asin_op(const at::Tensor& x) { return run(math::Fn::kAsin, x); }
at::Tensor acos_op(const at::Tensor& x) { return run(math::Fn::kAcos, x); }
at::Tensor erfinv_op(const at::Tensor& x) { return run(math::Fn::kErfinv, x); }
at::Tensor asinh_op(const at::Tensor& x) { return run(math::Fn::kAsinh, x); }
at::Tensor acosh_op(const at::Tensor& x) { return run(math::Fn::kAcosh, x); }
at::Tensor atanh_op(const at::Tensor& x) { return run(math::Fn::kAtanh, x); }
at::Tensor softplus_op(const at::Tensor& x) { return run(math::Fn::kSoftplus, x); }
at::Tensor log_sigmoid_op(const at::Tensor& x) { return run(math::Fn::kLogSigmoid, x); }
at::Tensor lgamma_op(const at::Tensor& x) { return run(math::Fn::kLgamma, x); }
at::Tensor digamma_op(const at::Tensor& x) { return run(math::Fn::kDigamma, x); }
at::Tensor trigamma_op(const at::Tensor& x) { return run(math::Fn::kTrigamma, x); }

at::Tensor gelu_op(const at::Tensor& x, c10::string_view approximate) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                    "carbon.gelu: approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
  return run(approximate == "tanh" ? math::Fn::kGeluTanh : math::Fn::kGelu, x);
}

at::Tensor elementwise_backward(const at::Tensor& grad, const at::Tensor& x, c10::string_view fn_name) {
  static const std::pair<const char*, math::Fn> kNames[] = {
      {"exp", math::Fn::kExp},         {"log", math::Fn::kLog},   {"tanh", math::Fn::kTanh},
      {"sigmoid", math::Fn::kSigmoid}, {"erf", math::Fn::kErf},   {"gelu", math::Fn::kGelu},
      {"gelu_tanh", math::Fn::kGeluTanh}, {"silu", math::Fn::kSilu}, {"sin", math::Fn::kSin},
      {"cos", math::Fn::kCos},         {"log1p", math::Fn::kLog1p}, {"softplus", math::Fn::kSoftplus},
      {"log_sigmoid", math::Fn::kLogSigmoid}, {"expm1", math::Fn::kExpm1},
      {"log2", math::Fn::kLog2},       {"log10", math::Fn::kLog10}, {"exp2", math::Fn::kExp2},
      {"erfc", math::Fn::kErfc},       {"sinh", math::Fn::kSinh},   {"cosh", math::Fn::kCosh},
      {"tan", math::Fn::kTan},         {"atan", math::Fn::kAtan},   {"asin", math::Fn::kAsin},
      {"acos", math::Fn::kAcos},       {"erfinv", math::Fn::kErfinv}, {"asinh", math::Fn::kAsinh},
      {"acosh", math::Fn::kAcosh},     {"atanh", math::Fn::kAtanh}, {"lgamma", math::Fn::kLgamma},
      {"digamma", math::Fn::kDigamma}, {"trigamma", math::Fn::kTrigamma},
  };
  const math::Fn* found = nullptr;
  for (const auto& entry : kNames)
    if (fn_name == entry.first) found = &entry.second;
  TORCH_CHECK_VALUE(found != nullptr, "carbon.elementwise_backward: unknown function '", std::string(fn_name),
                    "'; expected exp, log, tanh, sigmoid, erf, gelu, gelu_tanh, silu, sin, cos, log1p, softplus, log_sigmoid, expm1, "
                    "log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos, erfinv, asinh, acosh, atanh, lgamma, digamma "
                    "or trigamma");
  const char* op = "elementwise_backward";
  check_dtype(*found, op, "x", x);
  check_dtype(*found, op, "grad", grad);
  TORCH_CHECK_TYPE(grad.scalar_type() == x.scalar_type(), "carbon.elementwise_backward: grad has dtype ",
                   grad.scalar_type(), " but x has dtype ", x.scalar_type(), " (they must agree)");
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), "carbon.elementwise_backward: grad has shape ", grad.sizes(),
                    " but x has shape ", x.sizes(), " (they must agree)");
  TORCH_CHECK_VALUE(grad.device() == x.device(), "carbon.elementwise_backward: expected all tensors on one device, but grad is on ",
                    grad.device(), " and x is on ", x.device());
  check_device(op, x);
  const at::Tensor xc = x.contiguous(), gc = grad.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  launch(*found, true, xc, gc, out);
  return out;
}

}  // namespace carbon
