// The pow ops: input checks and the CPU kernel (pow.h).
#include "pow.h"

#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "binary64_math.h"
#include "pow_math.h"

namespace carbon {
namespace {

at::Tensor run(const char* op, const at::Tensor& t, double scalar, bool tensor_is_base) {
  if (t.scalar_type() != at::kDouble) check_supported_dtype(op, tensor_is_base ? "x" : "exponent", t);
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "carbon.", op, ": tensors on ", t.device(),
              " are not supported (CPU and CUDA only)");
  const at::Tensor input = t.contiguous();
  at::Tensor out = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
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

}  // namespace

void pow_cpu(const at::Tensor& x, double scalar, bool tensor_is_base, at::Tensor& out) {
  if (x.scalar_type() == at::kDouble) {  // float64: the double-double core
    const double* xp = x.const_data_ptr<double>();
    double* op = out.mutable_data_ptr<double>();
    carbon::parallel_for(0, x.numel(), 1024, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) op[i] = pow_binary64_one(xp[i], scalar, tensor_is_base);
    });
    return;
  }
  with_format(format_of(x.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    constexpr FloatFormat f = F::get();
    const Bits* xp = static_cast<const Bits*>(x.const_data_ptr());
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    carbon::parallel_for(0, x.numel(), 8192, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const double v = decode(xp[i], f);
        const double r = tensor_is_base ? math::pow_core(v, scalar) : math::pow_core(scalar, v);
        op[i] = static_cast<Bits>(encode(round_double(r, f), f));
      }
    });
  });
}

at::Tensor pow_tensor_scalar(const at::Tensor& x, double exponent) {
  return run("pow_tensor_scalar", x, exponent, true);
}

at::Tensor pow_scalar_tensor(double base, const at::Tensor& exponent) {
  return run("pow_scalar_tensor", exponent, base, false);
}

}  // namespace carbon
