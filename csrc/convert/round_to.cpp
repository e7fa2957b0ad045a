// The round_to op and its CPU kernel.
#include "round_to.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/fp_env.h"

namespace carbon {
namespace {

template <typename From, typename To>
void round_all(const typename From::Bits* x, int64_t n, uint32_t divisor, typename To::Bits* out) {
  constexpr FloatFormat from = From::get(), to = To::get();
  carbon::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = static_cast<typename To::Bits>(encode(round_quotient(decode(x[i], from), divisor, to), to));
  });
}

}  // namespace

void round_to_cpu(const at::Tensor& x, uint32_t divisor, FormatId to, at::Tensor& out) {
  with_format(format_of(x.scalar_type()), [&](auto from_fmt) {
    using From = decltype(from_fmt);
    with_format(to, [&](auto to_fmt) {
      using To = decltype(to_fmt);
      round_all<From, To>(static_cast<const typename From::Bits*>(x.const_data_ptr()), x.numel(), divisor,
                          static_cast<typename To::Bits*>(out.mutable_data_ptr()));
    });
  });
}

at::Tensor round_to(const at::Tensor& x, at::ScalarType dtype, int64_t divisor) {
  check_supported_dtype("round_to", "x", x);
  checked_out_dtype("round_to", dtype);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.round_to: tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(divisor >= 1 && divisor < (int64_t(1) << 32), "carbon.round_to: divisor must be in [1, 2^32), got ",
                    divisor);
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  if (out.numel() == 0) return out;
  if (x.is_cpu()) {
    round_to_cpu(input, static_cast<uint32_t>(divisor), format_of(dtype), out);
  } else {
#ifdef CARBON_WITH_CUDA
    round_to_cuda(input, static_cast<uint32_t>(divisor), format_of(dtype), out);
#endif
  }
  return out;
}

}  // namespace carbon
