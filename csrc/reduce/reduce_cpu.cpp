// CPU kernels of the exact reductions. Rows are split over threads; a few
// long rows are split along the row instead, for tier 1's fp64 sums only
// (their bound holds for any order). Each output is computed the same way
// whatever the split, so the bits do not depend on the thread count.
#include <ATen/Parallel.h>

#include <utility>

#include "../dtypes.h"
#include "reduce.h"
#include "reduce_kernel.h"

namespace carbon {
namespace {

struct RowSums {
  double sum = 0.0, abs_sum = 0.0;
};

// Tier 1's fp64 sums over x[0, n); four independent chains so the loop is
// not bound by the latency of one chain of additions.
template <typename T>
RowSums row_sums(const T* x, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0}, a[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4)
    for (int l = 0; l < 4; ++l) {
      const double v = element_value(x[k + l]);
      s[l] = s[l] + v;
      a[l] = a[l] + abs_value(v);
    }
  for (; k < n; ++k) {
    const double v = element_value(x[k]);
    s[0] = s[0] + v;
    a[0] = a[0] + abs_value(v);
  }
  return {(s[0] + s[1]) + (s[2] + s[3]), (a[0] + a[1]) + (a[2] + a[3])};
}

template <typename T, typename F>
void reduce_rows(const T* x, int64_t rows, int64_t n, bool mean, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  auto finish = [&](int64_t r, const RowSums& t1) {
    const T* row = x + r * n;
    double value;
    if (n == 0)
      value = empty_reduction(mean);
    else if (!reduce_round_fast(t1.sum, t1.abs_sum, n, mean, f, &value))
      value = reduce_row_exact(row, n, t1.abs_sum, mean, f);
    out[r] = static_cast<typename F::Bits>(encode(value, f));
  };
  constexpr int64_t kSplitRowAbove = 1 << 16;
  if (rows < at::get_num_threads() && n > kSplitRowAbove) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * n;
      const RowSums t1 = at::parallel_reduce(
          0, n, kSplitRowAbove / 4, RowSums{},
          [&](int64_t begin, int64_t end, RowSums acc) {
            const RowSums part = row_sums(row + begin, end - begin);
            return RowSums{acc.sum + part.sum, acc.abs_sum + part.abs_sum};
          },
          [](RowSums p, RowSums q) { return RowSums{p.sum + q.sum, p.abs_sum + q.abs_sum}; });
      finish(r, t1);
    }
    return;
  }
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) finish(r, row_sums(x + r * n, n));
  });
}

}  // namespace

void reduce_rows_cpu(const at::Tensor& x, bool mean, FormatId format, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      reduce_rows<T, F>(x.const_data_ptr<T>(), rows, n, mean, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
}

}  // namespace carbon
