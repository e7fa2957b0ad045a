// cumsum_rows on the CPU: rows over threads, each row in one thread, so the
// bits never depend on the thread count (and they are RN_F of the exact
// prefix sums whatever path computes them: cumsum.h).
//
// float32 outputs on AVX-512 take three passes per row instead of
// cumsum_span's one decision per prefix in software (~32 cycles per
// element, 17x torch.cumsum):
//  1. a compensated running sum (TwoSum, Knuth: s_i + t_i, t_i the running
//     sum of the additions' exact errors) and the absolute sum a_i, each
//     prefix i after i + 1 TwoSums and error additions, stored. (A plain
//     fp64 chain, cumsum_span's, left ~5 in 10^4 prefixes of a row of 50257
//     uniform values undecided, and the exact accumulator then had to take
//     almost the whole row.)
//  2. eight prefixes at a time: v_i = fl(s_i + t_i) is within
//     B_i = (u |v_i| + gamma_d^2 a_i) kBoundSlack of the exact c_i
//     (rounding_test.h's compensated_bound, d >= i + 1 the block's largest
//     depth); beta = 4 B_i, and since B_i >= u |v_i|,
//       fl(v_i - beta) <= v_i - beta + u (|v_i| + beta) <= v_i - B_i <= c_i
//     and likewise fl(v_i + beta) >= c_i. The hardware's RN32 (vcvtpd2ps:
//     round to nearest even, gradual underflow, overflow to +-inf, in the
//     default MXCSR state every op runs in, fp_env.h) is monotone, so where
//     both ends give the same float32 bits that is RN32(c_i). Undecided:
//     non-finite values or bounds, and a_i = 0 (a prefix of zeros, whose
//     signed-zero rule the exact accumulator applies), besides prefixes
//     within ~2^-51 |c_i| of a rounding boundary (ties, in practice);
//  3. the undecided prefixes, in order, exactly. TwoSum is exact while the
//     sum stays finite, so c_i = s_i + e_0 + ... + e_i with e_j step j's
//     error, and e_j is zero unless step j rounded (for float32 inputs, only
//     when x_j has bits below the running sum's fp64 ulp): one exact
//     accumulator takes the nonzero errors up to each undecided prefix, and
//     a copy of it s_i. (Taking the elements themselves cost ~15 cycles
//     each up to the last undecided prefix, and a uniform row has exact
//     float32 ties among its early prefixes.) A prefix of zeros is -0 iff
//     every element is -0; from the first non-finite running sum on, the
//     elements go into an exact accumulator of their own.
// Other output formats (bfloat16 / float16: no hardware rounding of a
// double into them) and CPUs without AVX-512 run cumsum_row.
#include <immintrin.h>

#include <cstdlib>
#include <vector>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "cumsum.h"
#include "cumsum_kernel.h"

namespace carbon {
namespace {

// CARBON_CUMSUM_SCALAR=1 keeps every row on cumsum_row (to compare the paths).
bool use_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") &&
                          std::getenv("CARBON_CUMSUM_SCALAR") == nullptr && cpu::avx512_allowed();
  return yes;
}

// The running sums of pass 1 (one entry per prefix).
struct Running {
  std::vector<double> s, t, a, e;  // e: each step's TwoSum error
  std::vector<uint8_t> undecided;
};

// Pass 2 for prefixes [0, n): decided outputs written, undecided ones marked.
__attribute__((target("avx512f,avx512dq,avx512vl"))) void decide_float32(Running& r, int64_t n, uint32_t* out) {
  const __m512d infinity = _mm512_set1_pd(__builtin_inf());
  const __m512d zero = _mm512_setzero_pd();
  const __m512d four_u = _mm512_set1_pd(4.0 * kUnitRoundoff * kBoundSlack);
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const __mmask8 lanes = static_cast<__mmask8>(n - i0 >= 8 ? 0xFF : (1u << (n - i0)) - 1);
    const double g = gamma_n(i0 + 8);
    const __m512d g2 = _mm512_set1_pd(4.0 * (g * g * kBoundSlack));
    const __m512d value = _mm512_add_pd(_mm512_maskz_loadu_pd(lanes, r.s.data() + i0),
                                        _mm512_maskz_loadu_pd(lanes, r.t.data() + i0));
    const __m512d abs_sum = _mm512_maskz_loadu_pd(lanes, r.a.data() + i0);
    const __m512d abs_value = _mm512_abs_pd(value);
    const __m512d beta = _mm512_add_pd(_mm512_mul_pd(four_u, abs_value), _mm512_mul_pd(g2, abs_sum));
    const __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(value, beta)), hi = _mm512_cvtpd_ps(_mm512_add_pd(value, beta));
    __mmask8 ok = _mm512_mask_cmp_pd_mask(lanes, abs_value, infinity, _CMP_LT_OQ);
    ok = _mm512_mask_cmp_pd_mask(ok, beta, infinity, _CMP_LT_OQ);
    ok = _mm512_mask_cmp_pd_mask(ok, abs_sum, zero, _CMP_GT_OQ);
    const __m256i lo_bits = _mm256_castps_si256(lo), hi_bits = _mm256_castps_si256(hi);
    const __mmask8 decided = _mm256_mask_cmpeq_epi32_mask(ok, lo_bits, hi_bits);
    _mm256_mask_storeu_epi32(out + i0, decided, hi_bits);
    for (int l = 0; l < 8 && i0 + l < n; ++l) r.undecided[i0 + l] = ((decided >> l) & 1) ? 0 : 1;
  }
}

template <typename T>
void cumsum_row_float32_avx512(const T* x, int64_t n, uint32_t* out, Running& r) {
  r.s.resize(n);
  r.t.resize(n);
  r.a.resize(n);
  r.e.resize(n);
  r.undecided.resize(n);
  double sum = 0.0, errors = 0.0, abs_sum = 0.0;
  int64_t first_non_finite = n;
  for (int64_t i = 0; i < n; ++i) {  // compensated_add, keeping each error
    const double v = element_value(x[i]);
    double e;
    two_sum(sum, v, sum, e);
    errors = errors + e;
    abs_sum = abs_sum + abs_value(v);
    r.s[i] = sum;
    r.t[i] = errors;
    r.a[i] = abs_sum;
    r.e[i] = e;
    if (!is_finite(sum) && first_non_finite == n) first_non_finite = i;
  }
  decide_float32(r, n, out);
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  int64_t err_limb[kLimbs], elem_limb[kLimbs], copy[kLimbs];
  uint32_t err_flags = 0, elem_flags = 0;
  exact_sum_clear(err_limb, err_flags);
  exact_sum_clear(elem_limb, elem_flags);
  int64_t errors_in = 0, elements_in = 0;  // e[0 .. errors_in) in err_limb, x[0 .. elements_in) in elem_limb
  bool all_negative_zeros = true;          // x[0 .. zeros_seen) are all -0
  int64_t zeros_seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!r.undecided[i]) continue;
    double value;
    if (i >= first_non_finite) {
      for (; elements_in <= i; ++elements_in) exact_sum_add(elem_limb, elem_flags, element_value(x[elements_in]));
      for (int l = 0; l < kLimbs; ++l) copy[l] = elem_limb[l];  // rounding normalizes its argument in place
      value = exact_sum_round(copy, elem_flags, f);
    } else if (r.a[i] == 0.0) {  // x[0 .. i] are all zeros
      for (; zeros_seen <= i; ++zeros_seen) all_negative_zeros &= sign_bit(element_value(x[zeros_seen]));
      value = all_negative_zeros ? -0.0 : 0.0;
    } else {
      for (; errors_in <= i; ++errors_in)
        if (r.e[errors_in] != 0.0) exact_sum_add(err_limb, err_flags, r.e[errors_in]);
      for (int l = 0; l < kLimbs; ++l) copy[l] = err_limb[l];
      uint32_t flags = err_flags;
      exact_sum_add(copy, flags, r.s[i]);
      value = exact_sum_round(copy, flags, f);
    }
    out[i] = static_cast<uint32_t>(encode(value, f));
  }
}

}  // namespace

void cumsum_rows_cpu(const at::Tensor& x, FormatId format, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  with_element_type(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.const_data_ptr());
    if (format == FormatId::kFloat32 && use_avx512()) {
      auto* op = static_cast<uint32_t*>(out.mutable_data_ptr());
      carbon::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        Running running;
        for (int64_t r = begin; r < end; ++r) cumsum_row_float32_avx512<T>(xp + r * n, n, op + r * n, running);
      });
      return;
    }
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* op = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      carbon::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) cumsum_row<T, F>(xp + r * n, n, op + r * n);
      });
    });
  });
}

}  // namespace carbon
