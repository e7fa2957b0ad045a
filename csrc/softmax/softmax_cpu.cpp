// CPU kernels of softmax and log_softmax, forward and backward, and of
// cross-entropy. Rows are split over threads; each row's sums are rounded
// once from their exact value (tier 1 with the tree's own error bound, or
// the exact tiers), and every tree used depends only on n, so the bits never
// depend on the thread count (nor on which tree: the AVX-512 paths sum in
// other trees than the portable ones).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "../exact/widen_avx2.h"
#include "../reduce/chain_tree.h"
#include "softmax.h"
#include "../convert/round_to.h"
#include "softmax_exp_avx2.h"
#include "softmax_exp_avx512.h"
#include "softmax_exp_cpu.h"
#include "softmax_rows_avx2.h"
#include "softmax_kernel.h"

namespace carbon {
namespace {


template <typename F>
typename F::Bits bits_of(double value) {
  return static_cast<typename F::Bits>(encode(value, F::get()));
}

int64_t grain_for(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// round_encode_fast for values v >= +0 (e_j, p_j = EXP(y_j), softmax
// outputs), with fewer instructions: no sign, and overflow, inf, -0 and NaN
// (never produced there, or only by exceptional inputs) go to the caller's
// general loop with the results whose rounding is subnormal (*ok = 0). On
// *ok = 1 the bits are round_encode_fast's: a +0 for v <= 2^(quantum_exp - 1),
// round_normal_bits + encode_normal where the result is normal
// (rounds_to_normal).
template <typename F>
inline typename F::Bits round_encode_nonneg(double v, uint32_t* ok) {
  constexpr FloatFormat f = F::get();
  const uint64_t u = double_to_bits(v);
  const uint64_t tiny = static_cast<uint64_t>(quantum_exp(f) - 1 + 1023) << 52;  // 2^(quantum_exp - 1)
  const bool zero = u <= tiny;
  *ok = zero ? 1u : rounds_to_normal(u, f);
  return static_cast<typename F::Bits>(zero ? 0u : encode_normal(round_normal_bits(u, f), f));
}

// The row kernels are compiled three times: for x86-64-v4 (AVX-512: eight
// doubles per instruction, half the instructions of the exp cores), for
// x86-64-v3 (AVX2 + FMA, so the elementwise cores' fma is one instruction)
// and for any x86-64 (fma from libm). All compute the same IEEE operations,
// so the bits are the same.
#define CARBON_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// The row's maximum and NaN flag (and, without a NaN, its least value into
// *least: softmax_row's choice of AVX2 EXP loop) from order-preserving
// integer keys of the float32 values (float_order_key): integer max / min
// reductions vectorize
// (a float max with NaN semantics does not, without -ffast-math). Keys order
// the non-NaN floats as the floats, with -0 below +0; a NaN has a key above
// +inf's (sign 0) or below -inf's (sign 1). The maximum of a set does not
// depend on the order; of the two zeros +0 is taken. (Which zero never shows
// in a result anyway: x - m is the same for every nonzero x, e = EXP(+-0) =
// 1, and a row whose maximum is a zero of either sign holding both holds at
// least two entries at the maximum, so S >= 2, L = LOG(S) > 0 and
// log_softmax = +-0 (-) L = -L for both signs. The CUDA kernel merges its
// threads' maxima in yet another order.)
inline int32_t float_order_key(float v) {
  int32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b ^ ((b >> 31) & 0x7fffffff);  // negative floats: magnitude bits reversed
}
constexpr int32_t kKeyPosInf = 0x7f800000;    // key of +inf
constexpr int32_t kKeyNegInf = -0x7f800001;   // key of -inf (bits 0xff800000)

template <typename T>
CARBON_CPU_CLONES RowMax row_max_keys(const T* row, int64_t n, float* least) {
  int32_t hi = INT32_MIN, lo = INT32_MAX;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t k = float_order_key(static_cast<float>(element_value(row[j])));
    hi = k > hi ? k : hi;
    lo = k < lo ? k : lo;
  }
  RowMax r;
  if (n == 0) return r;
  r.nan = hi > kKeyPosInf || lo < kKeyNegInf;
  const int32_t bits = hi ^ ((hi >> 31) & 0x7fffffff);  // the key map is its own inverse
  const int32_t least_bits = lo ^ ((lo >> 31) & 0x7fffffff);
  if (!r.nan) {
    std::memcpy(&r.m, &bits, sizeof bits);
    std::memcpy(least, &least_bits, sizeof least_bits);
  }
  return r;
}

// softmax_quotient(e, S) = RN64(e / S) for a float32 e in [0, 1] and the
// row's S (a float32 value >= 1), from the row's y = RN64(1/S) without a
// division per element (a vector division costs ~10 multiplications):
//  * q = RN64(e y): y = (1/S)(1 + d), |d| <= 2^-53, so |q - e/S| < (e/S) 2^-51.9.
//  * r = fma(-q, S, e) is exact: e - qS is a multiple of min(ulp(e), ulp(q) ulp(S))
//    of magnitude < e 2^-51.9; with ulp(e) >= e 2^-23 it is 0 when that
//    quantum is ulp(e), and otherwise an integer < 2^26 times the quantum.
//  * q + r y = e/S + (e - qS)(y - 1/S) = e/S + delta, |delta| < (e/S) 2^-104.
//    e/S is no double midpoint (that has 54 significant bits, while
//    e = S * mid would give odd(e) = odd(S) odd(mid) >= 2^53 > 2^24) and lies
//    at least (e/S) 2^-78 away from each (|e - mid S| >= the quantum of
//    the 78-bit product mid S or of e), so RN64(q + r y) (one fma) = RN64(e/S).
// e = 0 gives q = r = +0 and +0, as 0 / S. (Markstein's correction step.)
inline double softmax_quotient_by_reciprocal(float e, double S, double y) {
  const double q = static_cast<double>(e) * y;
  const double r = std::fma(-q, S, static_cast<double>(e));
  return std::fma(r, y, q);
}

// e_j = EXP(x_j - m) = RN32(exp_f32_core(RN32(x_j - m))) for j in [0, n)
// into e (softmax's e_j; with m = 0 the p_j = EXP(y_j) of the gradients:
// y - 0 is y, and EXP(-0) = EXP(+0)). Blocks of kExpBlock values: the
// cheaper exp_f32_approx in a loop of its own (it vectorizes), then the
// rounding with its test (softmax_exp_cpu.h); a block with undecided
// values goes to exp_block_undecided. t is scratch for min(n, kExpBlock)
// doubles.
constexpr int64_t kExpBlock = 256;

// The undecided values of a block (about 2^-16 of the arguments in [-87,
// 88] are near a rounding boundary): exp32 for each. Many undecided values
// (results in float32's subnormal range: rows of wide range) take the
// vectorized exp_f32_core for the whole block and the general rounding.
template <typename T>
CARBON_CPU_CLONES void exp_block_undecided(const T* x, float m, int64_t len, double* t, float* e) {
  int64_t undecided = 0;
  for (int64_t k = 0; k < len; ++k) undecided += exp_f32_approx_decided(t[k]) ? 0 : 1;
  if (undecided <= 8) {
    for (int64_t k = 0; k < len; ++k)
      if (!exp_f32_approx_decided(t[k])) e[k] = exp32(static_cast<float>(element_value(x[k])) - m);
    return;
  }
  for (int64_t k = 0; k < len; ++k) t[k] = math::exp_f32_core(static_cast<float>(element_value(x[k])) - m);
  for (int64_t k = 0; k < len; ++k) e[k] = round32(t[k]);
}

template <typename T>
CARBON_CPU_CLONES void exp_row_f32(const T* x, float m, int64_t n, double* t, float* e) {
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t len = std::min(kExpBlock, n - b);
    const T* xb = x + b;
    float* eb = e + b;
    for (int64_t k = 0; k < len; ++k) t[k] = exp_f32_approx(static_cast<float>(element_value(xb[k])) - m);
    uint64_t all_decided = 1;
    for (int64_t k = 0; k < len; ++k) {
      eb[k] = round32_decided(t[k]);
      all_decided &= exp_f32_approx_decided(t[k]);
    }
    if (!all_decided) exp_block_undecided(xb, m, len, t, eb);
  }
}

// For k in [0, len), len a multiple of 8: t[k] = exp_f32_approx(RN32(x_k - m))
// and e[k] = round32_decided(t[k]) (the hardware conversion, RN32 in the
// default MXCSR every op runs in).
template <typename T>
CARBON_SOFTMAX_AVX2 inline void exp_approx_groups8(const T* x, float m, int64_t len, double* t, float* e) {
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t k = 0; k < len; k += 8) {
    const __m256 d = _mm256_sub_ps(floats8(x + k), mv);  // RN32(x_k - m)
    const __m256d c0 = exp4_approx(_mm256_cvtps_pd(_mm256_castps256_ps128(d)));
    const __m256d c1 = exp4_approx(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)));
    _mm256_storeu_pd(t + k, c0);
    _mm256_storeu_pd(t + k + 4, c1);
    _mm256_storeu_ps(e + k, _mm256_set_m128(_mm256_cvtpd_ps(c1), _mm256_cvtpd_ps(c0)));
  }
}

// One block of exp_row_f32 on AVX2 CPUs (softmax_exp_avx2.h), len a
// multiple of 8: the same t and e (exp4_approx is exp_f32_approx lane by
// lane), the same decisions and the same undecided path.
template <typename T>
CARBON_SOFTMAX_AVX2 void exp_block_full_avx2(const T* x, float m, int64_t len, double* t, float* e) {
  exp_approx_groups8(x, m, len, t, e);
  uint64_t all_decided = 1;
  for (int64_t k = 0; k < len; ++k) all_decided &= exp_f32_approx_decided(t[k]);
  if (!all_decided) exp_block_undecided(x, m, len, t, e);
}

CARBON_SOFTMAX_AVX2 inline void add_floats8(const float* e, __m256d* s0, __m256d* s1) {
  const __m256 v = _mm256_loadu_ps(e);
  *s0 = _mm256_add_pd(*s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

// exp_row_f32's e on AVX2 CPUs, blocks of kExpBlock values tested in
// registers (exp_group8_tested's light test: no fp64 scratch, no second
// pass over it); a block where some lane fails the light test is redone by
// exp_block_full_avx2, so every lane gets exp_row_f32's result. Groups of
// eight d <= -110 (softmax's masked -inf entries) store their zeros without
// an evaluation (exp_group8_all_clamped). The last n mod 8 values by
// exp_f32_approx and its test, lane by lane.
// kRange: some d may lie outside [-87, 88] (softmax's rows pass false when
// their least d is >= -87: d <= 0 there). kForward: also returns the fp64
// sum of the e_j for S (see sum_of_exps: any tree gives the same S), in
// eight lanes: each block's in two registers of its own (at most 32
// additions per lane; from e when the block was redone), added to the row's
// two, then row0 + row1, a 4-lane reduction (2) and the tail's own sum (at
// most 7 additions, then 1): no value passes through more than
// exp_row_avx2_sum_depth(n) additions.
constexpr int64_t exp_row_avx2_sum_depth(int64_t n) { return n / kExpBlock + 38; }

template <typename T, bool kForward, bool kRange>
CARBON_SOFTMAX_AVX2 double exp_row_avx2(const T* x, float m, int64_t n, double* t, float* e) {
  const __m256 mv = _mm256_set1_ps(m);
  const int64_t vec_n = n & ~int64_t{7};
  __m256d row0 = _mm256_setzero_pd(), row1 = _mm256_setzero_pd();
  for (int64_t b = 0; b < vec_n; b += kExpBlock) {
    const int64_t len = std::min(kExpBlock, vec_n - b);  // a multiple of 8
    __m256i near = _mm256_setzero_si256();
    __m256 outside = _mm256_setzero_ps();
    __m256d b0 = _mm256_setzero_pd(), b1 = _mm256_setzero_pd();
    for (int64_t k = b; k < b + len; k += 8) {
      const __m256 d = _mm256_sub_ps(floats8(x + k), mv);  // RN32(x_k - m)
      if (kRange && exp_group8_all_clamped(d)) {
        _mm256_storeu_ps(e + k, _mm256_setzero_ps());
        continue;
      }
      __m128 r0, r1;
      exp_group8_tested<kRange>(d, e + k, &near, &outside, &r0, &r1);
      if (kForward) {
        b0 = _mm256_add_pd(b0, _mm256_cvtps_pd(r0));
        b1 = _mm256_add_pd(b1, _mm256_cvtps_pd(r1));
      }
    }
    if (!_mm256_testz_si256(near, near) || (kRange && !_mm256_testz_ps(outside, outside))) {
      exp_block_full_avx2(x + b, m, len, t, e + b);
      if (kForward) {
        b0 = b1 = _mm256_setzero_pd();
        for (int64_t k = b; k < b + len; k += 8) add_floats8(e + k, &b0, &b1);
      }
    }
    if (kForward) {
      row0 = _mm256_add_pd(row0, b0);
      row1 = _mm256_add_pd(row1, b1);
    }
  }
  double tail = 0.0;
  for (int64_t k = vec_n; k < n; ++k) {
    const float d = static_cast<float>(element_value(x[k])) - m;
    const double c = exp_f32_approx(d);
    e[k] = exp_f32_approx_decided(c) ? round32_decided(c) : exp32(d);
    if (kForward) tail = tail + e[k];
  }
  if (!kForward) return 0.0;
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(row0, row1));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + tail;
}

// The same e_j on CPUs with AVX-512: exp16_table_round (softmax_exp_avx512.h)
// sixteen values at a time, its undecided lanes by exp_f32_core and the
// general rounding (exp16_undecided). No fp64 scratch: the rounding follows
// the evaluation in registers.
template <typename T>
CARBON_SOFTMAX_AVX512 inline __m512 load16(const T* x, __mmask16 lanes) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(lanes, x);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // the bfloat16 bits are a float32's high half
    const __m256i h = _mm256_maskz_loadu_epi16(lanes, x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {  // float16: vcvtph2ps (exact, as every float16 is a float32 value)
    static_assert(std::is_same_v<T, c10::Half>);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, x));
  }
}

// e[k] = EXP(x_k - m) for the undecided lanes (bit k of `undecided`) of
// sixteen values (len of them in the row): exp_f32_core for the group in a
// loop that vectorizes (many lanes are undecided where results fall in
// float32's subnormal range), then the general rounding, as exp32 does.
template <typename T>
CARBON_SOFTMAX_AVX512 __attribute__((noinline)) void exp16_undecided(const T* x, float m, int64_t len,
                                                                     uint32_t undecided, float* e) {
  double t[16];
  for (int64_t k = 0; k < len; ++k) t[k] = math::exp_f32_core(static_cast<float>(element_value(x[k])) - m);
  for (int64_t k = 0; k < len; ++k)
    if ((undecided >> k) & 1) e[k] = round32(t[k]);
}

// One group of up to sixteen values, its undecided lanes rewritten at once.
// (kForward: softmax's rows, where every d = RN32(x_k - m) <= 0; the lanes
// past the row's end get d = +0.)
template <typename T, bool kForward>
CARBON_SOFTMAX_AVX512 inline void exp16_group(const T* x, __m512 mv, float m, int64_t len, float* e) {
  const __mmask16 lanes = static_cast<__mmask16>(len == 16 ? 0xffffu : (1u << len) - 1u);
  const __m512 d = _mm512_maskz_sub_ps(lanes, load16(x, lanes), mv);  // RN32(x_k - m)
  __m256 r0, r1;
  const __mmask16 undecided = static_cast<__mmask16>(lanes & ~exp16_table_round<kForward>(d, lanes, e, &r0, &r1));
  if (undecided) exp16_undecided(x, m, len, undecided, e);
}

// Blocks of kExpBlock values test their lanes together (no branch per
// group); a block with an undecided lane is redone group by group.
// With kForward (softmax's rows: d <= 0, exp16_table_round's kNonPositive),
// also the fp64 sum of the e_j for S (see sum_of_exps: any tree gives the
// same S), in sixteen lanes: each block's in two registers of its
// own (16 additions per lane; from the e array when the block was redone),
// added to the row's two, then the tail groups into the row's (at most
// 16 more), then one register pair sum and an 8-lane reduction (4): no
// value passes through more than n / kExpBlock + 36 additions.
constexpr int64_t exp_row_sum_depth(int64_t n) { return n / kExpBlock + 36; }

CARBON_SOFTMAX_AVX512 inline void add_e16(const float* e, __mmask16 lanes, __m512d* s0, __m512d* s1) {
  *s0 = _mm512_add_pd(*s0, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes), e)));
  *s1 = _mm512_add_pd(*s1, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes >> 8), e + 8)));
}

template <typename T, bool kForward>
CARBON_SOFTMAX_AVX512 double exp_row_avx512(const T* x, float m, int64_t n, float* e) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512d row0 = _mm512_setzero_pd(), row1 = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + kExpBlock <= n; j += kExpBlock) {
    __mmask16 decided = 0xffff;
    __m512d b0 = _mm512_setzero_pd(), b1 = _mm512_setzero_pd();
    for (int64_t k = j; k < j + kExpBlock; k += 16) {
      __m256 r0, r1;
      decided = static_cast<__mmask16>(
          decided & exp16_table_round<kForward>(_mm512_sub_ps(load16(x + k, 0xffff), mv), 0xffff, e + k, &r0, &r1));
      if (kForward) {
        b0 = _mm512_add_pd(b0, _mm512_cvtps_pd(r0));
        b1 = _mm512_add_pd(b1, _mm512_cvtps_pd(r1));
      }
    }
    if (decided != 0xffff) {
      for (int64_t k = j; k < j + kExpBlock; k += 16) exp16_group<T, kForward>(x + k, mv, m, 16, e + k);
      if (kForward) {
        b0 = b1 = _mm512_setzero_pd();
        for (int64_t k = j; k < j + kExpBlock; k += 16) add_e16(e + k, 0xffff, &b0, &b1);
      }
    }
    if (kForward) {
      row0 = _mm512_add_pd(row0, b0);
      row1 = _mm512_add_pd(row1, b1);
    }
  }
  for (; j < n; j += 16) {
    const int64_t len = std::min<int64_t>(16, n - j);
    exp16_group<T, kForward>(x + j, mv, m, len, e + j);
    if (kForward) add_e16(e + j, static_cast<__mmask16>(len == 16 ? 0xffffu : (1u << len) - 1u), &row0, &row1);
  }
  return kForward ? _mm512_reduce_add_pd(_mm512_add_pd(row0, row1)) : 0.0;
}

// exp_row_f32's results, by exp_row_avx512 or exp_row_avx2 where the CPU
// has them (t is then unused, or scratch).
template <typename T>
inline void exp_row(const T* x, float m, int64_t n, double* t, float* e) {
  if (softmax_avx512_available())
    exp_row_avx512<T, false>(x, m, n, e);
  else if (softmax_avx2_available())
    exp_row_avx2<T, false, true>(x, m, n, t, e);
  else
    exp_row_f32(x, m, n, t, e);
}

// The fp64 sum of the e_j (all >= +0) for S, in kSumChains interleaved
// chains (four AVX-512 registers, so the additions are not bound by their
// latency) and a pairwise fold: chain_tree.h's tree with 32 chains. S =
// RN32(exact sum) whichever tree sums (softmax_sum_if_decided's test uses this
// tree's depth; the undecided rows take the exact sum), so this tree need not
// be carbon.sum's kChains. The gradients' sums D and G use the same tree.
constexpr int kSumChains = 32;
constexpr int64_t sum_chains_depth(int64_t n) { return chain_depth<kSumChains>(n); }
inline double fold_sum_chains(double* s) { return fold_chains<kSumChains>(s); }

CARBON_CPU_CLONES double sum_of_exps(const float* e, int64_t n) {
  double s[kSumChains] = {};
  int64_t j = 0;
  for (; j + kSumChains <= n; j += kSumChains)
    for (int l = 0; l < kSumChains; ++l) s[l] = s[l] + e[j + l];
  for (; j < n; ++j) s[0] = s[0] + e[j];
  return fold_sum_chains(s);
}

// The float32 outputs in one pass each, rounded by the hardware conversion
// where round32_decided applies; false (o to be rewritten) when some output
// is outside it (subnormal; the general two-pass code then redoes the row).
//  * log_softmax: RN32(d_j (-) L), the value of log_softmax_value.
//  * softmax: RN32(e_j / S) from q = RN64(e_j y), y = RN64(1/S), without
//    the Markstein correction: q is within (e/S) 2^-51.9 of e/S, and no
//    float32 rounding boundary lies that close to e/S when RN32(q) is normal
//    and q >= 2^-126. A boundary mid = N 2^g (N odd, 2^24 < N < 2^25, as for
//    every midpoint >= 2^-126) with e = a 2^al, S = b 2^be (a, b odd,
//    < 2^24): e - S mid is not 0 (a = b N would exceed 2^24) and is a
//    multiple of 2^min(al, be + g), so |e/S - mid| >= (e/S) min(2^-24,
//    2^-49.01) (the second when be + g < al: e ~ S mid gives
//    2^(al - be - g) ~ b N / a). So RN32(q) = RN32(e/S) = softmax_value.
// The tests, per row rather than per output:
//  * log_softmax, L >= 2^-126 (every row with S > 1): d_j <= 0 (x_j <= m),
//    so v = RN64(d_j - L) <= -L and every v is -inf or has |v| >= 2^-126,
//    where round32_hardware_exact holds (never NaN: the row has none).
//    Otherwise (S = 1) the test of each value.
//  * softmax: quotient_rounding_decided(q) for every q in [+0, 1] (e <= 1,
//    y <= 1) is "q = +0 or q >= 2^-126", i.e. bits(q) - 1 (wrapping +0 to
//    the largest integer) >= bits(2^-126) - 1: one minimum over the row.
template <typename T, bool kLog>
CARBON_CPU_CLONES bool softmax_outputs_f32(const T* row, int64_t n, const float* e, float m, double S, uint32_t* o) {
  if (kLog) {
    const double L = log32(static_cast<float>(S));
    if (L >= 0x1p-126) {
      for (int64_t k = 0; k < n; ++k) {
        const float r = round32_decided(log_softmax_difference(static_cast<float>(element_value(row[k])), m, L));
        std::memcpy(&o[k], &r, sizeof r);
      }
      return true;
    }
    uint64_t ok = 1;
    for (int64_t k = 0; k < n; ++k) {
      const double v = log_softmax_difference(static_cast<float>(element_value(row[k])), m, L);
      const float r = round32_decided(v);
      std::memcpy(&o[k], &r, sizeof r);
      ok &= round32_hardware_exact(v);
    }
    return ok != 0;
  } else {
    const double y = 1.0 / S;
    uint64_t least = ~uint64_t{0};  // min over the row of bits(q) - 1
    for (int64_t k = 0; k < n; ++k) {
      const double q = static_cast<double>(e[k]) * y;
      const float r = round32_decided(q);
      std::memcpy(&o[k], &r, sizeof r);
      const uint64_t key = double_to_bits(q) - 1;
      least = key < least ? key : least;
    }
    return least >= normal_min_bits(float32_format()) - 1;
  }
}

// Whether the rows take softmax_rows_avx2.h's loops (AVX2 but no AVX-512).
inline bool avx2_row_loops() { return !softmax_avx512_available() && softmax_avx2_available(); }

// One row of n values into o[0, n); t and e are scratch for n values.
template <typename T, typename F, bool kLog>
CARBON_CPU_CLONES void softmax_row(const T* row, int64_t n, double* t, float* e, typename F::Bits* o,
                                   bool masked_nan = false) {
  constexpr FloatFormat f = F::get();
  float least = -INFINITY;
  const RowMax mx = row_max_keys(row, n, &least);
  const RowCase c = row_case(mx);
  if (c != RowCase::kNormal) {
    const double fill = special_row_fill(c, kLog, masked_nan);
    for (int64_t j = 0; j < n; ++j) o[j] = bits_of<F>(fill);
    return;
  }
  const float m = mx.m;
  double sum;
  int64_t depth;
  if (softmax_avx512_available()) {
    sum = exp_row_avx512<T, true>(row, m, n, e);
    depth = exp_row_sum_depth(n);
  } else if (softmax_avx2_available()) {
    // Every d = RN32(x_j - m) is >= RN32(least - m) (RN32 is monotone).
    if (least - m >= kLightLow)
      sum = exp_row_avx2<T, true, false>(row, m, n, t, e);
    else
      sum = exp_row_avx2<T, true, true>(row, m, n, t, e);
    depth = exp_row_avx2_sum_depth(n);
  } else {
    exp_row_f32(row, m, n, t, e);
    sum = sum_of_exps(e, n);
    depth = sum_chains_depth(n);
  }
  double S;
  if (!softmax_sum_if_decided(sum, depth, &S))
    S = reduce_exact_values(
        n, [&](int64_t k) { return static_cast<double>(e[k]); }, sum, false, float32_format());
  if constexpr (F::get().precision == 24) {
    if (softmax_outputs_f32<T, kLog>(row, n, e, m, S, o)) return;
  }
  // The outputs: log_softmax_value / softmax_value in two passes, the fp64
  // value (vectorizes), then the rounding by the normal-range path (on AVX2
  // CPUs softmax_rows_avx2.h's), or in general when some output is not a
  // normal number.
  if (kLog) {
    const double L = log32(static_cast<float>(S));
    for (int64_t k = 0; k < n; ++k) t[k] = log_softmax_difference(static_cast<float>(element_value(row[k])), m, L);
  } else {
    const double y = 1.0 / S;
    for (int64_t k = 0; k < n; ++k) t[k] = softmax_quotient_by_reciprocal(e[k], S, y);
  }
  if (avx2_row_loops()) {
    if (!round_row_avx2<F>(t, n, o))
      for (int64_t k = 0; k < n; ++k) o[k] = bits_of<F>(round_double(t[k], f));
    return;
  }
  uint32_t all_normal_out = 1;
  if (kLog) {
    for (int64_t k = 0; k < n; ++k) {
      uint32_t ok;
      o[k] = round_encode_fast<F>(t[k], &ok);
      all_normal_out &= ok;
    }
  } else {
    for (int64_t k = 0; k < n; ++k) {  // softmax values are >= +0
      uint32_t ok;
      o[k] = round_encode_nonneg<F>(t[k], &ok);
      all_normal_out &= ok;
    }
  }
  if (!all_normal_out)
    for (int64_t k = 0; k < n; ++k) o[k] = bits_of<F>(round_double(t[k], f));
}

// Scratch for one thread's rows.
struct RowScratch {
  std::vector<double> t;
  std::vector<float> e;
  explicit RowScratch(int64_t n) : t(n), e(n) {}
};

template <typename T, typename F, bool kLog>
void softmax_rows(const T* x, int64_t rows, int64_t n, bool masked_nan, typename F::Bits* out) {
  carbon::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    RowScratch scratch(n);
    for (int64_t r = begin; r < end; ++r)
      softmax_row<T, F, kLog>(x + r * n, n, scratch.t.data(), scratch.e.data(), out + r * n, masked_nan);
  });
}

// RN_f(sum_k v[k]) (divisor 0) or RN_f(sum_k v[k] / divisor) of n float32
// values: the tiers of carbon.sum / carbon.mean.
CARBON_CPU_CLONES double round_sum_of_floats(const float* v, int64_t n, int64_t divisor, const FloatFormat& f) {
  const bool mean = divisor != 0;
  if (n == 0) return empty_reduction(mean);
  double s[kChains] = {}, a[kChains] = {};
  int64_t j = 0;
  // The chains of s and of a in two loops: GCC vectorizes one array of
  // chains per loop, not two (the fused loop ran scalar).
  for (; j + kChains <= n; j += kChains)
    for (int l = 0; l < kChains; ++l) s[l] = s[l] + v[j + l];
  for (int64_t i = 0; i + kChains <= n; i += kChains)
    for (int l = 0; l < kChains; ++l) a[l] = a[l] + abs_value(v[i + l]);
  for (; j < n; ++j) {
    s[0] = s[0] + v[j];
    a[0] = a[0] + abs_value(v[j]);
  }
  const double sum = fold_chains(s), abs_sum = fold_chains(a);
  double value;
  if (reduce_round_fast(sum, abs_sum, mean ? divisor : n, chain_depth(n), mean, f, &value)) return value;
  return reduce_exact_values(
      n, [&](int64_t k) { return static_cast<double>(v[k]); }, abs_sum, mean, f, mean ? divisor : n);
}

// The fp64 sum and absolute sum of the terms g_k y_k (softmax) or g_k
// (log_softmax) of a float32 row on AVX-512, both in one pass (the portable
// loops below take two): sixteen lanes each, so no term passes through more
// than ceil(n / 16) + 4 additions (its lane, the two registers' sum, an
// 8-lane reduction). The sums' rounding is RN32 of the exact sum whichever
// tree (grad_sum_if_decided with this depth, or the exact tiers).
constexpr int64_t grad_sums_avx512_depth(int64_t n) { return n / 16 + 5; }

template <bool kLog>
CARBON_SOFTMAX_AVX512 void grad_sums_avx512(const float* g, const float* y, int64_t n, double* sum, double* abs_sum) {
  const __m512d sign_off = _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<int64_t>(~kSignBit)));
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd(), a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (int64_t k = 0; k < n; k += 16) {
    const int64_t len = std::min<int64_t>(16, n - k);
    const __mmask16 lanes = static_cast<__mmask16>(len == 16 ? 0xffffu : (1u << len) - 1u);
    __m512d t0 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes), g + k));
    __m512d t1 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes >> 8), g + k + 8));
    if (!kLog) {  // g y: exact in fp64
      t0 = _mm512_mul_pd(t0, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes), y + k)));
      t1 = _mm512_mul_pd(t1, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(static_cast<__mmask8>(lanes >> 8), y + k + 8)));
    }
    s0 = _mm512_add_pd(s0, t0);
    s1 = _mm512_add_pd(s1, t1);
    a0 = _mm512_add_pd(a0, _mm512_and_pd(t0, sign_off));
    a1 = _mm512_add_pd(a1, _mm512_and_pd(t1, sign_off));
  }
  *sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  *abs_sum = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

// D = RN32(sum g_k y_k) for softmax, G = RN32(sum g_k) for log_softmax.
template <typename T, bool kLog>
CARBON_CPU_CLONES double grad_row_sum(const T* g, const T* y, int64_t n) {
  auto term = [&](int64_t k) {
    return kLog ? element_value(g[k]) : element_value(g[k]) * element_value(y[k]);  // exact in fp64
  };
  if constexpr (std::is_same_v<T, float>) {
    if (softmax_avx512_available()) {
      double sum, abs_sum, value;
      grad_sums_avx512<kLog>(g, y, n, &sum, &abs_sum);
      if (grad_sum_if_decided(sum, abs_sum, grad_sums_avx512_depth(n), &value)) return value;
      return reduce_exact_values(n, term, abs_sum, false, float32_format());
    }
  }
  if (avx2_row_loops()) {
    double sum, abs_sum, value;
    grad_sums_avx2<kLog>(g, y, n, &sum, &abs_sum);
    if (grad_sum_if_decided(sum, abs_sum, grad_sums_avx2_depth(n), &value)) return value;
    return reduce_exact_values(n, term, abs_sum, false, float32_format());
  }
  double s[kSumChains] = {}, a[kSumChains] = {};
  int64_t j = 0;
  // Two loops, as in round_sum_of_floats (one array of chains each
  // vectorizes); kSumChains chains (sum_of_exps: RN32 of the exact sum
  // whichever tree, by the test with this tree's depth or the exact tiers).
  for (; j + kSumChains <= n; j += kSumChains)
    for (int l = 0; l < kSumChains; ++l) s[l] = s[l] + term(j + l);
  for (int64_t i = 0; i + kSumChains <= n; i += kSumChains)
    for (int l = 0; l < kSumChains; ++l) a[l] = a[l] + abs_value(term(i + l));
  for (; j < n; ++j) {
    const double t = term(j);
    s[0] = s[0] + t;
    a[0] = a[0] + abs_value(t);
  }
  const double sum = fold_sum_chains(s), abs_sum = fold_sum_chains(a);
  double value;
  if (grad_sum_if_decided(sum, abs_sum, sum_chains_depth(n), &value)) return value;
  return reduce_exact_values(n, term, abs_sum, false, float32_format());
}

// o[k] = RN_F(value(k)) for k in [0, n) by the branch-free roundings; false
// when some value needs the general rounding (the caller redoes the row).
// float32 outputs: the hardware conversion, round32_decided, checked once
// per row rather than per value: round32_hardware_exact(v) for every v is
// "no |v| in (2^-150, 2^-126) and no NaN", i.e. the least |bits(v)| -
// (bits(2^-150) + 1) (wrapping |v| <= 2^-150 to huge values) is at least
// bits(2^-126) - (bits(2^-150) + 1), and the largest |bits(v)| at most
// +inf's: an unsigned minimum and maximum, which vectorize.
template <typename F, typename Value>
inline bool round_row_out(int64_t n, Value value, typename F::Bits* o) {
  if constexpr (F::get().precision == 24) {
    constexpr FloatFormat f = F::get();
    const uint64_t key_base = (static_cast<uint64_t>(quantum_exp(f) - 1 + 1023) << 52) + 1;  // bits(2^-150) + 1
    uint64_t least = ~uint64_t{0}, most = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double v = value(k);
      const float r = round32_decided(v);
      std::memcpy(&o[k], &r, sizeof r);
      const uint64_t mag = double_to_bits(v) & ~kSignBit;
      const uint64_t key = mag - key_base;
      least = key < least ? key : least;
      most = mag > most ? mag : most;
    }
    return least >= normal_min_bits(f) - key_base && most <= kExpMask;
  } else {
    uint32_t ok = 1;
    for (int64_t k = 0; k < n; ++k) {
      uint32_t ok_o;
      o[k] = round_encode_fast<F>(value(k), &ok_o);
      ok &= ok_o;
    }
    return ok != 0;
  }
}

// bfloat16 outputs on CPUs with AVX512_BF16: RN_bf16(v) by the hardware, as
// RN_bf16(RO32(v)) with RO32 rounding to float32's precision by round-to-odd
// (the truncation vcvtpd2ps {rz}, its last bit set when inexact): a value
// rounded to odd with at least two more bits than the target rounds to
// nearest-even as the value itself does, and float32 has 16 more than
// bfloat16 at every magnitude down to 2^-126; vcvtneps2bf16 is RN-even
// (whatever MXCSR says). Proven for |v| >= 2^-126 (normal float32 and
// bfloat16 results; beyond FLT_MAX RO32 gives FLT_MAX, which rounds to inf
// as v does), v = +-0 and +-inf; any other value in a row (subnormal results,
// NaN) makes the row take the general rounding: the check is per row, an
// unsigned minimum of |bits(v)| - 1 and maximum of |bits(v)| as in
// round_row_out. ~6 vector operations per 8 values instead of ~20.
#define CARBON_SOFTMAX_AVX512_BF16 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16")))

inline bool bf16_convert_available() {
  static const bool yes = softmax_avx512_available() && __builtin_cpu_supports("avx512bf16");
  return yes;
}

CARBON_SOFTMAX_AVX512_BF16 inline __m256 round_odd32(__m512d v) {
  const __m256 f = _mm512_cvt_roundpd_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(f), v, _CMP_NEQ_UQ);
  const __m256i bits = _mm256_castps_si256(f);
  return _mm256_castsi256_ps(_mm256_mask_or_epi32(bits, inexact, bits, _mm256_set1_epi32(1)));
}

// o[k] = bits of RN_bf16(v[k]), k < n; false when some v[k] is outside the
// proven range (o then to be rewritten).
CARBON_SOFTMAX_AVX512_BF16 bool round_bf16_row_avx512(const double* v, int64_t n, uint16_t* o) {
  const __m512i sign_off = _mm512_set1_epi64(static_cast<int64_t>(~kSignBit)), one = _mm512_set1_epi64(1);
  __m512i least = _mm512_set1_epi64(-1), most = _mm512_setzero_si512();
  for (int64_t k = 0; k < n; k += 16) {
    const int64_t len = std::min<int64_t>(16, n - k);
    const __mmask16 lanes = static_cast<__mmask16>(len == 16 ? 0xffffu : (1u << len) - 1u);
    const __m512d v0 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes), v + k);
    const __m512d v1 = _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes >> 8), v + k + 8);
    const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(round_odd32(v0)), round_odd32(v1), 1);
    _mm256_mask_storeu_epi16(o + k, lanes, (__m256i)_mm512_cvtneps_pbh(f));
    const __m512i m0 = _mm512_and_si512(_mm512_castpd_si512(v0), sign_off);
    const __m512i m1 = _mm512_and_si512(_mm512_castpd_si512(v1), sign_off);
    least = _mm512_min_epu64(least, _mm512_min_epu64(_mm512_sub_epi64(m0, one), _mm512_sub_epi64(m1, one)));
    most = _mm512_max_epu64(most, _mm512_max_epu64(m0, m1));
  }
  constexpr FloatFormat f = Format<FormatId::kBFloat16>::get();
  return _mm512_reduce_min_epu64(least) >= normal_min_bits(f) - 1 && _mm512_reduce_max_epu64(most) <= kExpMask;
}

// round_row_out<F>, with bfloat16 outputs by round_bf16_row_avx512 where the
// CPU has it (the values staged in t, scratch for min(n, 1024) doubles).
template <typename F, typename Value>
inline bool round_row_out_staged(int64_t n, Value value, double* t, typename F::Bits* o) {
  if constexpr (std::is_same_v<F, Format<FormatId::kBFloat16>>) {
    if (bf16_convert_available()) {
      constexpr int64_t kChunk = 1024;  // staged values stay in the L1 cache
      bool ok = true;
      for (int64_t c = 0; c < n; c += kChunk) {
        const int64_t len = std::min(kChunk, n - c);
        for (int64_t k = 0; k < len; ++k) t[k] = value(c + k);
        ok &= round_bf16_row_avx512(t, len, o + c);
      }
      return ok;
    }
  }
  return round_row_out<F>(n, value, o);
}

// One row's gradient; t and p are scratch for n values (log_softmax only).
template <typename T, typename F, bool kLog>
CARBON_CPU_CLONES void softmax_backward_row(const T* gr, const T* yr, int64_t n, double* t, float* p,
                                            typename F::Bits* o) {
  constexpr FloatFormat f = F::get();
  const double D = grad_row_sum<T, kLog>(gr, yr, n);
  // The branch-free roundings first (they vectorize); the general ones for
  // the whole row when some value needs them.
  if (kLog) {
    exp_row(yr, 0.0f, n, t, p);  // p_k = EXP(y_k)
    auto value = [&](int64_t k) { return log_softmax_grad_unrounded(p[k], element_value(gr[k]), D); };
    if (avx2_row_loops() ? log_softmax_grad_out_avx2<F>(gr, p, D, n, o) : round_row_out_staged<F>(n, value, t, o))
      return;
    for (int64_t k = 0; k < n; ++k) o[k] = bits_of<F>(log_softmax_grad_from_p(p[k], element_value(gr[k]), D, f));
  } else {
    auto value = [&](int64_t k) { return softmax_grad_unrounded(element_value(yr[k]), element_value(gr[k]), D); };
    if (avx2_row_loops() ? softmax_grad_out_avx2<F>(gr, yr, D, n, o) : round_row_out<F>(n, value, o)) return;
    for (int64_t k = 0; k < n; ++k)
      o[k] = bits_of<F>(softmax_grad_value(element_value(yr[k]), element_value(gr[k]), D, f));
  }
}

// (Lambdas do not inherit target_clones: the loops live in the row functions.)
template <typename T, typename F, bool kLog>
void softmax_backward_rows(const T* g, const T* y, int64_t rows, int64_t n, typename F::Bits* out) {
  carbon::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    RowScratch scratch(kLog ? n : 0);
    for (int64_t r = begin; r < end; ++r)
      softmax_backward_row<T, F, kLog>(g + r * n, y + r * n, n, scratch.t.data(), scratch.e.data(), out + r * n);
  });
}

// Cross-entropy rows: log_probs (float32) and each row's float32 loss.
template <typename T>
void cross_entropy_rows(const T* x, const int64_t* target, int64_t N, int64_t C, int64_t ignore_index, double eps,
                        float* log_probs, float* loss) {
  using F32 = Format<FormatId::kFloat32>;
  carbon::parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
    RowScratch scratch(C);
    for (int64_t i = begin; i < end; ++i) {
      float* lsm = log_probs + i * C;
      softmax_row<T, F32, true>(x + i * C, C, scratch.t.data(), scratch.e.data(), reinterpret_cast<uint32_t*>(lsm));
      const int64_t t = target[i];
      if (t == ignore_index) {
        loss[i] = 0.0f;
        continue;
      }
      const double smooth = eps == 0.0 ? 0.0 : -round_sum_of_floats(lsm, C, C, float32_format());
      loss[i] = static_cast<float>(cross_entropy_loss(0.0f - lsm[t], eps, smooth));
    }
  });
}

// One row's gradient; scratch and p are scratch for C values.
template <typename F>
CARBON_CPU_CLONES void cross_entropy_grad_row(double coef, const float* lsm, int64_t t, int64_t C, double eps,
                                              double* scratch, float* p, typename F::Bits* o) {
  constexpr FloatFormat f = F::get();
  exp_row(lsm, 0.0f, C, scratch, p);  // p_j = EXP(lsm_j)
  // Branch-free roundings (vectorized), the general ones if some value needs them.
  auto value = [&](int64_t j) { return cross_entropy_grad_unrounded(coef, p[j], j == t, eps, C); };
  if (avx2_row_loops() ? cross_entropy_grad_out_avx2<F>(coef, p, t, C, eps, o)
                        : round_row_out_staged<F>(C, value, scratch, o))
    return;
  for (int64_t j = 0; j < C; ++j) o[j] = bits_of<F>(cross_entropy_grad_from_p(coef, p[j], j == t, eps, C, f));
}

template <typename F>
void cross_entropy_grad_rows(const double* coef, const float* log_probs, const int64_t* target, int64_t N, int64_t C,
                             int64_t ignore_index, double eps, typename F::Bits* out) {
  carbon::parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
    RowScratch scratch(C);
    for (int64_t i = begin; i < end; ++i) {
      typename F::Bits* o = out + i * C;
      if (target[i] == ignore_index) {
        for (int64_t j = 0; j < C; ++j) o[j] = 0;
        continue;
      }
      cross_entropy_grad_row<F>(coef[i], log_probs + i * C, target[i], C, eps, scratch.t.data(), scratch.e.data(), o);
    }
  });
}

}  // namespace

void softmax_rows_cpu(const at::Tensor& x, bool log, bool masked_nan, FormatId format, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  with_element_type(x.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      if (log)
        softmax_rows<T, F, true>(x.const_data_ptr<T>(), rows, n, masked_nan, o);
      else
        softmax_rows<T, F, false>(x.const_data_ptr<T>(), rows, n, masked_nan, o);
    });
  });
}

void softmax_backward_rows_cpu(const at::Tensor& grad, const at::Tensor& y, bool log, FormatId format,
                               at::Tensor& out) {
  const int64_t rows = y.size(0), n = y.size(1);
  with_element_type(y.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format, [&](auto fmt) {
      using F = decltype(fmt);
      auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
      if (log)
        softmax_backward_rows<T, F, true>(grad.const_data_ptr<T>(), y.const_data_ptr<T>(), rows, n, o);
      else
        softmax_backward_rows<T, F, false>(grad.const_data_ptr<T>(), y.const_data_ptr<T>(), rows, n, o);
    });
  });
}

void cross_entropy_cpu(const at::Tensor& logits, const at::Tensor& target, int64_t reduction, int64_t ignore_index,
                       double label_smoothing, FormatId format, at::Tensor& loss, at::Tensor& log_probs,
                       at::Tensor& count) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t* t = target.const_data_ptr<int64_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == ignore_index) continue;
    TORCH_CHECK_INDEX(t[i] >= 0 && t[i] < C, "carbon.cross_entropy: target ", t[i], " at position ", i,
                      " is out of bounds for ", C, " classes");
    ++valid;
  }
  count.fill_(valid);
  std::vector<float> row_loss(N);
  with_element_type(logits.scalar_type(), [&](auto element) {
    using T = decltype(element);
    cross_entropy_rows<T>(logits.const_data_ptr<T>(), t, N, C, ignore_index, label_smoothing,
                          log_probs.mutable_data_ptr<float>(), row_loss.data());
  });
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    auto* o = static_cast<typename F::Bits*>(loss.mutable_data_ptr());
    if (reduction == 0) {
      for (int64_t i = 0; i < N; ++i) o[i] = bits_of<F>(round_double(row_loss[i], F::get()));
    } else {
      // sum: RN(sum of the row losses); mean: RN(sum / count), NaN when count = 0.
      const int64_t divisor = reduction == 1 ? valid : 0;
      const double value = reduction == 1 && valid == 0 ? canonical_nan()
                                                         : round_sum_of_floats(row_loss.data(), N, divisor, F::get());
      o[0] = bits_of<F>(value);
    }
  });
}

void cross_entropy_backward_cpu(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& target,
                                const at::Tensor& count, int64_t reduction, int64_t ignore_index,
                                double label_smoothing, FormatId format, at::Tensor& out) {
  const int64_t N = log_probs.size(0), C = log_probs.size(1);
  std::vector<double> coef(N);
  with_element_type(grad.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* g = grad.const_data_ptr<T>();
    const int64_t valid = count.item<int64_t>();
    for (int64_t i = 0; i < N; ++i) {
      if (reduction == 0)
        coef[i] = element_value(g[i]);
      else if (reduction == 2 || valid == 0)
        coef[i] = element_value(g[0]);
      else
        coef[i] = round_quotient(element_value(g[0]), static_cast<uint32_t>(valid), float32_format());
    }
  });
  with_format(format, [&](auto fmt) {
    using F = decltype(fmt);
    cross_entropy_grad_rows<F>(coef.data(), log_probs.const_data_ptr<float>(), target.const_data_ptr<int64_t>(), N,
                               C, ignore_index, label_smoothing, static_cast<typename F::Bits*>(out.mutable_data_ptr()));
  });
}

}  // namespace carbon
