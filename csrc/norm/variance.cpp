// var_mean: input checks and the CPU kernel. Each row is summed by one thread
// in the fixed chain tree (chain_tree.h), so the bits never depend on the
// thread count; undecided statistics take the exact accumulator.
#include "variance.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <vector>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "../reduce/chain_tree.h"
#include "variance_kernel.h"

namespace carbon {
namespace {

template <typename T>
void var_mean_row(const T* x, int64_t n, int64_t divisor, double* v, float* var_out, float* mean_out) {
  double var, mean;
  uint32_t flags = 0;
  for (int64_t k = 0; k < n; ++k) {
    v[k] = element_value(x[k]);  // exact
    flags |= nonfinite_flags(v[k]);
  }
  if (n == 0) {
    var = mean = canonical_nan();
  } else if (flags) {
    nonfinite_var_mean(flags, &var, &mean);
  } else {
    const int64_t depth = chain_depth(n);
    double s[kChains] = {}, a[kChains] = {};
    int64_t k = 0;
    for (; k + kChains <= n; k += kChains)
      for (int l = 0; l < kChains; ++l) s[l] = s[l] + v[k + l], a[l] = a[l] + abs_value(v[k + l]);
    for (; k < n; ++k) s[0] = s[0] + v[k], a[0] = a[0] + abs_value(v[k]);
    const double sum = fold_chains(s), abs_sum = fold_chains(a);
    if (!mean_fast(sum, abs_sum, n, depth, &mean))
      mean = reduce_exact_values(n, [&](int64_t j) { return v[j]; }, abs_sum, true, F32::get());
    double q[kChains] = {};
    for (k = 0; k + kChains <= n; k += kChains)
      for (int l = 0; l < kChains; ++l) {
        const double d = v[k + l] - mean;
        q[l] = q[l] + d * d;
      }
    for (; k < n; ++k) {
      const double d = v[k] - mean;
      q[0] = q[0] + d * d;
    }
    const double squares = fold_chains(q);
    if (divisor == 0) {
      var = var_without_divisor(squares);
    } else if (!mean_of_squares_fast(squares, divisor, depth, 3, &var)) {
      int64_t limb[kLimbs];
      uint32_t exact_flags;
      exact_sum_clear(limb, exact_flags);
      for (int64_t j = 0; j < n; ++j) add_centered_square(limb, exact_flags, v[j], mean);
      var = exact_mean_round(limb, exact_flags, divisor);
    }
  }
  *var_out = static_cast<float>(var);  // float32 values already: exact
  *mean_out = static_cast<float>(mean);
}

}  // namespace

void var_mean_rows_cpu(const at::Tensor& x, int64_t divisor, at::Tensor& var, at::Tensor& mean) {
  const int64_t rows = x.size(0), n = x.size(1);
  float* vp = var.mutable_data_ptr<float>();
  float* mp = mean.mutable_data_ptr<float>();
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.const_data_ptr());
    carbon::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
      std::vector<double> scratch(n);
      for (int64_t r = begin; r < end; ++r) var_mean_row(xp + r * n, n, divisor, scratch.data(), vp + r, mp + r);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> var_mean_rows(const at::Tensor& x, int64_t correction) {
  const char* op = "var_mean_rows";
  check_supported_dtype(op, "x", x);
  TORCH_CHECK(x.is_cpu() || x.is_cuda(), "carbon.", op, ": tensors on ", x.device(),
              " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(x.dim() == 2, "carbon.", op, ": x must be 2-D [rows, n], got ", x.dim(), " dimensions");
  TORCH_CHECK_VALUE(correction >= 0, "carbon.", op, ": correction must be >= 0, got ", correction);
  const int64_t n = x.size(1);
  // The exact tier adds three terms per element (as layer_norm's, norm.cpp),
  // and the accumulator is exact below 2^31 terms.
  TORCH_CHECK_VALUE(n <= (int64_t(1) << 29), "carbon.", op, ": at most 2^29 elements per row, got ", n);
  const int64_t divisor = std::max<int64_t>(0, n - correction);
  const at::Tensor input = x.contiguous();
  at::Tensor var = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
  at::Tensor mean = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
  if (x.size(0) == 0) return {var, mean};
  if (x.is_cpu()) {
    var_mean_rows_cpu(input, divisor, var, mean);
  } else {
#ifdef CARBON_WITH_CUDA
    var_mean_rows_cuda(input, divisor, var, mean);
#endif
  }
  return {var, mean};
}

}  // namespace carbon
