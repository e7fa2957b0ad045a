// CPU kernels of the correctly rounded matmul. Work is split over rows with
// at::parallel_for; each output is computed independently of the split, so
// the bits do not depend on the thread count.
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "../dtypes.h"
#include "../reduce/reduce_kernel.h"
#include "matmul.h"

namespace carbon {

namespace {

// The statistics of one row of K doubles (see row_stats_cpu).
void stats_of_row(const double* row, int64_t K, int precision, double scale, double* norm, uint8_t* sign,
                  double* quantum) {
  // Four independent partial sums (the bound allows any order) so the
  // loop is not bound by the latency of one chain of additions.
  double part[4] = {0.0, 0.0, 0.0, 0.0};
  // The smallest biased exponent of a nonzero element (0x7FF when none:
  // zeros count as 0x7FF; infinities and NaNs make the norm non-finite,
  // and then the quantum is never used).
  int64_t emin[4] = {0x7FF, 0x7FF, 0x7FF, 0x7FF};
  uint8_t s = 0;
  auto exponent = [](double v) {
    const int64_t e = static_cast<int64_t>((double_to_bits(v) >> 52) & 0x7FF);
    return e == 0 ? int64_t{0x7FF} : e;
  };
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int l = 0; l < 4; ++l) {
      part[l] = part[l] + row[k + l] * row[k + l];
      s |= row_signs_of(row[k + l]);
      const int64_t e = exponent(row[k + l]);
      emin[l] = e < emin[l] ? e : emin[l];
    }
  for (; k < K; ++k) {
    part[0] = part[0] + row[k] * row[k];
    s |= row_signs_of(row[k]);
    const int64_t e = exponent(row[k]);
    emin[0] = e < emin[0] ? e : emin[0];
  }
  *norm = std::sqrt((part[0] + part[1]) + (part[2] + part[3]));
  *sign = s;
  const int64_t e = std::min(std::min(emin[0], emin[1]), std::min(emin[2], emin[3]));
  // Every element is a value of a format of `precision` bits, exact in
  // double; one with exponent E (unbiased, >= e - 1023) is a multiple of
  // 2^(E - precision + 1) (its last significand bit; a subnormal value of
  // the format is a multiple of the format's quantum, which is a multiple
  // of that power for every E below the format's normal range). So
  // 2^(e - 1023 - precision + 1) divides the whole row. Double values
  // of a supported format are never subnormal doubles (e >= 1).
  *quantum = e == 0x7FF ? 0.0 : scale * std::ldexp(1.0, static_cast<int>(e) - 1023 - precision + 1);
}

template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void widen_row(const T* x, int64_t K, double* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = element_value(x[k]);
}

}  // namespace

void row_stats_cpu(const at::Tensor& rows, at::Tensor& norms, at::Tensor& signs, int precision, double scale,
                   at::Tensor& quanta) {
  const int64_t R = rows.size(0), K = rows.size(1);
  const double* x = rows.const_data_ptr<double>();
  double* norm = norms.mutable_data_ptr<double>();
  uint8_t* sign = signs.mutable_data_ptr<uint8_t>();
  double* quantum = quanta.mutable_data_ptr<double>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));
  at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) stats_of_row(x + r * K, K, precision, scale, norm + r, sign + r, quantum + r);
  });
}

void widen_rows_with_stats_cpu(const at::Tensor& x, at::Tensor& out, at::Tensor& norms, at::Tensor& signs,
                               int precision, double scale, at::Tensor& quanta) {
  const int64_t B = x.size(0), R = x.size(1), K = x.size(2);
  const int64_t sb = x.stride(0), sr = x.stride(1);
  double* o = out.mutable_data_ptr<double>();
  double* norm = norms.mutable_data_ptr<double>();
  uint8_t* sign = signs.mutable_data_ptr<uint8_t>();
  double* quantum = quanta.mutable_data_ptr<double>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* in = x.const_data_ptr<T>();
    at::parallel_for(0, B * R, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        double* row = o + r * K;
        widen_row(in + (r / R) * sb + (r % R) * sr, K, row);  // exact (element_value)
        stats_of_row(row, K, precision, scale, norm + r, sign + r, quantum + r);
      }
    });
  });
}

// The condition under which the fp64 GEMM value of one output is exact (no
// bias): every product a_k b_k is a multiple of q = q_a q_b, so every partial
// sum of any subset of them, in any order or tree (FMA included), is a
// multiple of q of magnitude at most sum |a_k b_k|. When that is below
// 2^53 q, every partial sum is representable in double, so no addition
// rounds and the GEMM returns c itself, whatever its blocking. Then
// RN_f(approx) = RN_f(c), ties included: this decides the many outputs that
// are exact float32 ties when the inputs are bfloat16 or float16 (products
// of 16 or 22 bits). sum |a_k b_k| <= a_norm b_norm (Cauchy-Schwarz); the
// norms are fp64 computations with relative error far below 2^-40, covered
// with room by kBoundSlack squared. Products of powers of two here never
// leave double's normal range (q >= 2^-149-23 per side).
inline bool exact_gemm_value(double a_norm, double b_norm, double a_quantum53, double b_quantum) {
  return a_norm * b_norm * (kBoundSlack * kBoundSlack) < a_quantum53 * b_quantum;
}

// Tier 1 for one row, restricted to outputs whose interval lies in f's
// normal range (nearly all of them), written without branches so that the
// compiler vectorizes it. It is round_if_decided specialized to that range:
// the interval [y - beta, y + beta], pushed one ulp outwards, must not touch 0
// and both its ends must round to the same value. Everything else (zeros,
// subnormals, overflow, non-finite values, undecided intervals) is flagged
// in `pending` for the general path.
// Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time:
// integer and IEEE operations give the same bits in every version.
// The bias is a template parameter: a null test inside the loop would keep
// the compiler from vectorizing it (measured: 8x slower).
// Without a bias, an output whose GEMM value is exact (exact_gemm_value) and
// nonzero (an exact zero's sign follows the contract's rule, decided by the
// general path) is decided as RN_f(approx) when that is a normal number.
template <typename F, bool kHasBias>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) static void round_row_normal(
    const double* approx, const double* b_norm, double a_norm, double gamma, const double* bias,
    int64_t bias_stride, const double* b_quantum, double a_quantum53, int64_t N, typename F::Bits* out,
    uint8_t* pending) {
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
    const bool bounded = (((lo ^ hi) & kSignBit) == 0) & (inner >= normal_min) & (outer < overflow) &
                         (r_inner == r_outer) & (static_cast<int64_t>(r_outer) < overflow);
    const uint64_t y_bits = double_to_bits(y);
    const int64_t mag_y = static_cast<int64_t>(y_bits & ~kSignBit);
    const uint64_t r_y = round_normal_bits(static_cast<uint64_t>(mag_y), f);
    const bool exact = !kHasBias && exact_gemm_value(a_norm, b_norm[j], a_quantum53, b_quantum[j]) &
                       (mag_y >= normal_min) & (static_cast<int64_t>(r_y) < overflow);
    const bool decided = bounded | exact;
    // Both ways give the same value when both apply (RN_f(c) either way).
    const uint64_t r = bounded ? r_inner : r_y;
    const uint32_t sign = (y_bits & kSignBit) ? (1u << (f.total_bits - 1)) : 0u;
    out[j] = static_cast<typename F::Bits>(decided ? (sign | encode_normal(r, f)) : 0u);
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
          v.approx + row * v.N, v.b_norm + b * v.N, v.a_norm[row], v.gemm_gamma, bias, v.bias_stride_n,
          v.b_quantum + b * v.N, v.a_quantum53[row], v.N, out + row * v.N, pending.data());
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
