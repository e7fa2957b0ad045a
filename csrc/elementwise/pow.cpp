// The pow ops and the square root: input checks and the CPU kernels (pow.h).
#include "pow.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "binary64_math.h"
#include "pow_math.h"

namespace carbon {
namespace {

// Checks t (float32, bfloat16, float16 or float64; CPU or CUDA) and returns
// its contiguous copy and an empty output of its shape and dtype.
std::pair<at::Tensor, at::Tensor> checked_input_and_output(const char* op, const char* name, const at::Tensor& t) {
  if (t.scalar_type() != at::kDouble) check_supported_dtype(op, name, t);
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "carbon.", op, ": tensors on ", t.device(),
              " are not supported (CPU and CUDA only)");
  return {t.contiguous(), at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous))};
}

at::Tensor run(const char* op, const at::Tensor& t, double scalar, bool tensor_is_base) {
  auto [input, out] = checked_input_and_output(op, tensor_is_base ? "x" : "exponent", t);
  if (out.numel() == 0) return out;
  if (t.is_cpu()) {
    pow_cpu(input, scalar, tensor_is_base, out);
  } else {
#ifdef CARBON_WITH_CUDA
    pow_cuda(input, scalar, tensor_is_base, out);
#endif
  }
  return out;
}

// out[i] = binary64(x[i]) for a float64 x, else RN_f of rounded(decode(x[i]), f) in x's format f, the elements
// split over threads (grain64 / grain elements at least per task).
template <typename Binary64, typename Rounded>
void map_elements(const at::Tensor& x, int64_t grain64, int64_t grain, at::Tensor& out, Binary64 binary64,
                  Rounded rounded) {
  if (x.scalar_type() == at::kDouble) {
    const double* xp = x.const_data_ptr<double>();
    double* op = out.mutable_data_ptr<double>();
    carbon::parallel_for(0, x.numel(), grain64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) op[i] = binary64(xp[i]);
    });
    return;
  }
  with_format(format_of(x.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    constexpr FloatFormat f = F::get();
    const Bits* xp = static_cast<const Bits*>(x.const_data_ptr());
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    carbon::parallel_for(0, x.numel(), grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) op[i] = static_cast<Bits>(encode(rounded(decode(xp[i], f), f), f));
    });
  });
}

}  // namespace

void pow_cpu(const at::Tensor& x, double scalar, bool tensor_is_base, at::Tensor& out) {
  map_elements(  // float64: the double-double core
      x, 1024, 8192, out, [&](double t) { return pow_binary64_one(t, scalar, tensor_is_base); },
      [&](double v, const FloatFormat& f) {
        return round_double(tensor_is_base ? math::pow_core(v, scalar) : math::pow_core(scalar, v), f);
      });
}

void sqrt_cpu(const at::Tensor& x, at::Tensor& out) {
  map_elements(
      x, 16384, 16384, out, [](double t) { return sqrt_binary64_one(t); },
      [](double v, const FloatFormat& f) { return sqrt_one(v, f); });
}

at::Tensor sqrt_op(const at::Tensor& x) {
  auto [input, out] = checked_input_and_output("sqrt", "x", x);
  if (out.numel() == 0) return out;
  if (x.is_cpu()) {
    sqrt_cpu(input, out);
  } else {
#ifdef CARBON_WITH_CUDA
    sqrt_cuda(input, out);
#endif
  }
  return out;
}

at::Tensor pow_tensor_scalar(const at::Tensor& x, double exponent) {
  return run("pow_tensor_scalar", x, exponent, true);
}

at::Tensor pow_scalar_tensor(double base, const at::Tensor& exponent) {
  return run("pow_scalar_tensor", exponent, base, false);
}

}  // namespace carbon
