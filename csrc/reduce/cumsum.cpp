// cumsum_rows: checks and the CPU kernel (rows over threads, each row
// sequential in one thread: the bits never depend on the thread count).
#include "cumsum.h"

#include <ATen/Parallel.h>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "cumsum_kernel.h"

namespace carbon {

void cumsum_rows_cpu(const at::Tensor& x, FormatId format, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.const_data_ptr());
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* op = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      carbon::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) cumsum_row<T, F>(xp + r * n, n, op + r * n);
      });
    });
  });
}

at::Tensor cumsum_rows(const at::Tensor& x, std::optional<at::ScalarType> dtype) {
  const char* op = "cumsum_rows";
  check_supported_dtype(op, "x", x);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(x.dim() == 2, "carbon.", op, ": x must be 2-D [rows, n], got ", x.dim(), " dimensions");
  TORCH_CHECK_VALUE(x.size(1) < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 elements per row");
  const at::ScalarType out_dtype = checked_out_dtype(op, dtype.value_or(x.scalar_type()));
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  if (x.is_cpu()) {
    cumsum_rows_cpu(input, format_of(out_dtype), out);
  } else {
#ifdef CARBON_WITH_CUDA
    cumsum_rows_cuda(input, format_of(out_dtype), out);
#endif
  }
  return out;
}

}  // namespace carbon
