// CPU kernels of the correctly rounded matmul. Work is split over rows with
// at::parallel_for; each output is computed independently of the split, so
// the bits do not depend on the thread count.
#include <ATen/Parallel.h>

#include <vector>

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
      // Four independent partial sums (the bound allows any order) so the
      // loop is not bound by the latency of one chain of additions.
      const double* row = x + r * K;
      double part[4] = {0.0, 0.0, 0.0, 0.0};
      uint8_t s = 0;
      int64_t k = 0;
      for (; k + 4 <= K; k += 4)
        for (int l = 0; l < 4; ++l) {
          part[l] = part[l] + row[k + l] * row[k + l];
          s |= row_signs_of(row[k + l]);
        }
      for (; k < K; ++k) {
        part[0] = part[0] + row[k] * row[k];
        s |= row_signs_of(row[k]);
      }
      norm[r] = std::sqrt((part[0] + part[1]) + (part[2] + part[3]));
      sign[r] = s;
    }
  });
}

// Tier 1 for one row, restricted to outputs whose interval lies in f's
// normal range (nearly all of them), written without branches so that the
// compiler vectorizes it. It is round_if_decided specialized to that range:
// the interval [y - beta, y + beta], pushed one ulp outwards, must not touch 0
// and both its ends must round to the same value. Everything else (zeros,
// subnormals, overflow, non-finite values, undecided intervals) is flagged
// in `pending` for the general path.
// Compiled twice, for AVX2 and for baseline x86-64, chosen at load time:
// integer and IEEE operations give the same bits either way.
// The bias is a template parameter: a null test inside the loop would keep
// the compiler from vectorizing it (measured: 8x slower).
template <typename F, bool kHasBias>
__attribute__((target_clones("avx2", "default"))) static void round_row_normal(
    const double* approx, const double* b_norm, double a_norm, double gamma, const double* bias,
    int64_t bias_stride, int64_t N, typename F::Bits* out, uint8_t* pending) {
  constexpr FloatFormat f = F::get();
  // Magnitudes as signed integers: AVX2 compares only signed 64-bit lanes.
  const int64_t normal_min = static_cast<int64_t>(normal_min_bits(f));
  const int64_t overflow = static_cast<int64_t>(overflow_bits(f));
  for (int64_t j = 0; j < N; ++j) {
    const double bias_j = kHasBias ? bias[j * bias_stride] : 0.0;
    const double y = approx[j] + bias_j;
    const double beta = gamma * abs_sum_bound(a_norm, b_norm[j], bias_j);
    const uint64_t lo = double_to_bits(y - beta), hi = double_to_bits(y + beta);
    const int64_t mag_lo = static_cast<int64_t>(lo & ~kSignBit), mag_hi = static_cast<int64_t>(hi & ~kSignBit);
    const int64_t inner = (mag_lo < mag_hi ? mag_lo : mag_hi) - 1;  // one ulp towards 0
    const int64_t outer = (mag_lo < mag_hi ? mag_hi : mag_lo) + 1;  // one ulp away from 0
    const uint64_t r_inner = round_normal_bits(static_cast<uint64_t>(inner), f);
    const uint64_t r_outer = round_normal_bits(static_cast<uint64_t>(outer), f);
    const bool decided = (((lo ^ hi) & kSignBit) == 0) & (inner >= normal_min) & (outer < overflow) &
                         (r_inner == r_outer) & (static_cast<int64_t>(r_outer) < overflow);
    const uint32_t sign = (lo & kSignBit) ? (1u << (f.total_bits - 1)) : 0u;
    out[j] = static_cast<typename F::Bits>(decided ? (sign | encode_normal(r_inner, f)) : 0u);
    pending[j] = !decided;
  }
}

template <typename F>
static void round_all(const MatmulView& v, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(v.N, 1));
  at::parallel_for(0, v.B * v.M, grain, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> pending(v.N);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / v.M, i = row % v.M;
      const double* bias = v.bias ? v.bias + b * v.bias_stride_b + i * v.bias_stride_m : nullptr;
      (bias ? round_row_normal<F, true> : round_row_normal<F, false>)(
          v.approx + row * v.N, v.b_norm + b * v.N, v.a_norm[row], v.gemm_gamma, bias, v.bias_stride_n, v.N,
          out + row * v.N, pending.data());
      for (int64_t j = 0; j < v.N; ++j) {
        if (!pending[j]) continue;
        double r;
        if (!matmul_round_fast(v, b, i, j, f, &r)) r = matmul_round_exact(v, b, i, j, f);
        out[row * v.N + j] = static_cast<typename F::Bits>(encode(r, f));
      }
    }
  });
}

void matmul_round_cpu(const MatmulView& v, FormatId format, at::Tensor& out) {
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    round_all<F>(v, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
  });
}

}  // namespace carbon
