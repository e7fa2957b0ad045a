// CPU kernels of the correctly rounded matmul. Work is split over rows with
// at::parallel_for; each output is computed independently of the split, so
// the bits do not depend on the thread count.
#include <ATen/Parallel.h>

#include "matmul.h"

namespace carbon {

void row_stats_cpu(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs) {
  const int64_t R = rows.size(0), K = rows.size(1);
  const double* x = rows.const_data_ptr<double>();
  double* norm = norms.mutable_data_ptr<double>();
  uint8_t* sign = signs.mutable_data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));
  at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      double sum_squares = 0.0;
      uint8_t s = 0;
      for (int64_t k = 0; k < K; ++k) accumulate_row_stats(x[r * K + k], sum_squares, s);
      norm[r] = std::sqrt(sum_squares);
      sign[r] = s;
    }
  });
}

template <typename Bits>
static void round_all(const MatmulView& v, const FloatFormat& f, Bits* out) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(v.N, 1));
  at::parallel_for(0, v.B * v.M, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / v.M, i = row % v.M;
      for (int64_t j = 0; j < v.N; ++j) {
        double r;
        if (!matmul_round_fast(v, b, i, j, f, &r)) r = matmul_round_exact(v, b, i, j, f);
        out[row * v.N + j] = static_cast<Bits>(encode(r, f));
      }
    }
  });
}

void matmul_round_cpu(const MatmulView& v, const FloatFormat& f, at::Tensor& out) {
  if (f.total_bits == 32)
    round_all(v, f, static_cast<uint32_t*>(out.mutable_data_ptr()));
  else
    round_all(v, f, static_cast<uint16_t*>(out.mutable_data_ptr()));
}

}  // namespace carbon
