// The two-argument functions atan2, hypot and pow: input checks and the CPU
// kernel (two_argument.h).
#include "two_argument.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/float_format.h"
#include "../exact/fp_env.h"
#include "two_argument_math.h"

namespace carbon {
namespace {

at::Tensor run(TwoArgumentFn fn, const char* op, const char* name_a, const char* name_b, const at::Tensor& a,
               const at::Tensor& b) {
  check_supported_dtype(op, name_a, a);
  check_supported_dtype(op, name_b, b);
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "carbon.", op, ": ", name_a, " has dtype ", a.scalar_type(),
                   " but ", name_b, " has dtype ", b.scalar_type(), " (they must agree)");
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), "carbon.", op, ": ", name_a, " has shape ", a.sizes(), " but ", name_b,
                    " has shape ", b.sizes(), " (they must agree; broadcast first)");
  TORCH_CHECK_VALUE(a.device() == b.device(), "carbon.", op, ": expected all tensors on one device, but ", name_a,
                    " is on ", a.device(), " and ", name_b, " is on ", b.device());
  TORCH_CHECK(a.is_cpu() || a.is_cuda(), "carbon.", op, ": tensors on ", a.device(),
              " are not supported (CPU and CUDA only)");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (a.is_cpu()) {
    two_argument_cpu(fn, ac, bc, out);
  } else {
#ifdef CARBON_WITH_CUDA
    two_argument_cuda(fn, ac, bc, out);
#endif
  }
  return out;
}

}  // namespace

void two_argument_cpu(TwoArgumentFn fn, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  with_format(format_of(a.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    constexpr FloatFormat f = F::get();
    const Bits* ap = static_cast<const Bits*>(a.const_data_ptr());
    const Bits* bp = static_cast<const Bits*>(b.const_data_ptr());
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    carbon::parallel_for(0, a.numel(), 8192, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const double u = decode(ap[i], f), v = decode(bp[i], f);
        const double r = two_argument_core(fn, u, v);
        op[i] = static_cast<Bits>(encode(round_double(r, f), f));
      }
    });
  });
}

at::Tensor atan2_op(const at::Tensor& y, const at::Tensor& x) {
  return run(TwoArgumentFn::kAtan2, "atan2", "y", "x", y, x);
}

at::Tensor hypot_op(const at::Tensor& x, const at::Tensor& y) {
  return run(TwoArgumentFn::kHypot, "hypot", "x", "y", x, y);
}

at::Tensor pow_tensor_tensor(const at::Tensor& x, const at::Tensor& exponent) {
  return run(TwoArgumentFn::kPow, "pow_tensor_tensor", "x", "exponent", x, exponent);
}

}  // namespace carbon
