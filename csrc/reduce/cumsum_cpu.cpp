// cumsum_rows on the CPU: rows over threads, each row in one thread, so the
// bits never depend on the thread count (and they are RN_F of the exact
// prefix sums whatever path computes them: cumsum.h).
//
// float32 outputs on AVX-512 take two passes per row instead of
// cumsum_span's one decision per prefix in software (~32 cycles per
// element, 17x torch.cumsum):
//  1. the running fp64 sum s_i and absolute sum a_i of cumsum_span's chain
//     (prefix i has passed through i + 1 additions), stored;
//  2. eight prefixes at a time: with B_i = gamma_{i+1} sum|x| bounding
//     |s_i - c_i| (Higham, ch. 4), beta = 4 gamma_d kBoundSlack a_i for
//     the block's largest depth d >= i + 1 is at least 3 B_i after its own
//     roundings, and since B_i >= u a_i (gamma_d >= u),
//       fl(s_i - beta) <= s_i - beta + u (|s_i| + beta) <= s_i - B_i <= c_i
//     and likewise fl(s_i + beta) >= c_i. The hardware's RN32 (vcvtpd2ps:
//     round to nearest even, gradual underflow, overflow to +-inf, in the
//     default MXCSR state every op runs in, fp_env.h) is monotone, so where
//     both ends give the same float32 bits that is RN32(c_i). Undecided:
//     non-finite sums or bounds, and a_i = 0 (a prefix of zeros, whose
//     signed-zero rule the exact accumulator applies), besides the rare
//     prefix whose interval holds a rounding boundary;
//  3. the undecided prefixes, in order, from one exact accumulator that
//     takes the elements up to each of them.
// Other output formats (bfloat16 / float16: no hardware rounding of a
// double into them) and CPUs without AVX-512 run cumsum_row.
#include <immintrin.h>

#include <cstdlib>
#include <vector>

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
                          std::getenv("CARBON_CUMSUM_SCALAR") == nullptr;
  return yes;
}

// Pass 2 for prefixes [0, n): decided outputs written, undecided ones marked.
__attribute__((target("avx512f,avx512dq,avx512vl"))) void decide_float32(const double* s, const double* a, int64_t n,
                                                               uint32_t* out, uint8_t* undecided) {
  const __m512d infinity = _mm512_set1_pd(__builtin_inf());
  const __m512d zero = _mm512_setzero_pd();
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const __mmask8 lanes = static_cast<__mmask8>(n - i0 >= 8 ? 0xFF : (1u << (n - i0)) - 1);
    const double g = 4.0 * (gamma_n(i0 + 8) * kBoundSlack);
    const __m512d sum = _mm512_maskz_loadu_pd(lanes, s + i0), abs_sum = _mm512_maskz_loadu_pd(lanes, a + i0);
    const __m512d beta = _mm512_mul_pd(_mm512_set1_pd(g), abs_sum);
    const __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(sum, beta)), hi = _mm512_cvtpd_ps(_mm512_add_pd(sum, beta));
    __mmask8 ok = _mm512_mask_cmp_pd_mask(lanes, _mm512_abs_pd(sum), infinity, _CMP_LT_OQ);
    ok = _mm512_mask_cmp_pd_mask(ok, beta, infinity, _CMP_LT_OQ);
    ok = _mm512_mask_cmp_pd_mask(ok, abs_sum, zero, _CMP_GT_OQ);
    const __m256i lo_bits = _mm256_castps_si256(lo), hi_bits = _mm256_castps_si256(hi);
    const __mmask8 decided = _mm256_mask_cmpeq_epi32_mask(ok, lo_bits, hi_bits);
    _mm256_mask_storeu_epi32(out + i0, decided, hi_bits);
    for (int l = 0; l < 8 && i0 + l < n; ++l) undecided[i0 + l] = ((decided >> l) & 1) ? 0 : 1;
  }
}

template <typename T>
void cumsum_row_float32_avx512(const T* x, int64_t n, uint32_t* out, std::vector<double>& s, std::vector<double>& a,
                               std::vector<uint8_t>& undecided) {
  s.resize(n);
  a.resize(n);
  undecided.resize(n);
  double sum = 0.0, abs_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {  // cumsum_span's chain
    const double v = element_value(x[i]);
    sum = sum + v;
    abs_sum = abs_sum + abs_value(v);
    s[i] = sum;
    a[i] = abs_sum;
  }
  decide_float32(s.data(), a.data(), n, out, undecided.data());
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  int64_t limb[kLimbs], copy[kLimbs];
  uint32_t flags = 0;
  exact_sum_clear(limb, flags);
  int64_t added = 0;  // x[0 .. added) are in limb
  for (int64_t i = 0; i < n; ++i) {
    if (!undecided[i]) continue;
    for (; added <= i; ++added) exact_sum_add(limb, flags, element_value(x[added]));
    for (int l = 0; l < kLimbs; ++l) copy[l] = limb[l];  // rounding normalizes its argument in place
    out[i] = static_cast<uint32_t>(encode(exact_sum_round(copy, flags, f), f));
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
        std::vector<double> s, a;
        std::vector<uint8_t> undecided;
        for (int64_t r = begin; r < end; ++r) cumsum_row_float32_avx512<T>(xp + r * n, n, op + r * n, s, a, undecided);
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
