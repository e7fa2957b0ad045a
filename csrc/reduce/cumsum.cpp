// cumsum_rows: checks, then the device's kernel (cumsum_cpu.cpp, cumsum_cuda.cu).
#include "cumsum.h"

#include "../dtypes.h"

#include <ATen/ops/empty.h>

namespace carbon {

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
