// sum_divided: checks and the CPU kernel (the tiers of carbon.mean with
// another divisor; one thread, eight chains: the input is a vector of
// per-row losses, not a bandwidth-bound tensor).
#include "sum_divided.h"

#include "../dtypes.h"
#include "chain_tree.h"
#include "reduce_kernel.h"

#include <ATen/ops/empty.h>

namespace carbon {

void sum_divided_cpu(const at::Tensor& x, int64_t divisor, at::Tensor& out) {
  const int64_t n = x.numel();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.const_data_ptr());
    with_format(format_of(x.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      constexpr FloatFormat f = F::get();
      double value;
      if (divisor <= 0 || n == 0) {
        value = empty_reduction(true);
      } else {
        double s[kChains] = {}, a[kChains] = {};
        int64_t k = 0;
        for (; k + kChains <= n; k += kChains)
          for (int l = 0; l < kChains; ++l) {
            const double v = element_value(xp[k + l]);
            s[l] = s[l] + v;
            a[l] = a[l] + abs_value(v);
          }
        for (; k < n; ++k) {
          const double v = element_value(xp[k]);
          s[0] = s[0] + v;
          a[0] = a[0] + abs_value(v);
        }
        const double sum = fold_chains(s), abs_sum = fold_chains(a);
        if (!reduce_round_fast(sum, abs_sum, divisor, chain_depth(n), true, f, &value))
          value = reduce_exact_values(
              n, [&](int64_t j) { return element_value(xp[j]); }, abs_sum, true, f, divisor);
      }
      *static_cast<typename F::Bits*>(out.mutable_data_ptr()) = static_cast<typename F::Bits>(encode(value, f));
    });
  });
}

at::Tensor sum_divided(const at::Tensor& x, const at::Tensor& divisor) {
  const char* op = "sum_divided";
  check_supported_dtype(op, "x", x);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  TORCH_CHECK_TYPE(divisor.scalar_type() == at::kLong && divisor.dim() == 0, "carbon.", op,
                   ": divisor must be a 0-dim int64 tensor, got ", divisor.scalar_type(), " with ", divisor.dim(),
                   " dimensions");
  TORCH_CHECK_VALUE(divisor.device() == x.device(), "carbon.", op, ": expected x and divisor on one device, got ",
                    x.device(), " and ", divisor.device());
  TORCH_CHECK_VALUE(x.numel() < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 elements");
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty({}, x.options());
  if (x.is_cpu()) {
    sum_divided_cpu(input, divisor.item<int64_t>(), out);  // a host tensor: no device sync
  } else {
#ifdef CARBON_WITH_CUDA
    sum_divided_cuda(input, divisor, out);
#endif
  }
  return out;
}

}  // namespace carbon
