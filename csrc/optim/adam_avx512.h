// The Adam / AdamW step on x86-64 CPUs with AVX-512 (float32, bfloat16 and
// float16 parameters), eight fp64 lanes at a time, rounding with the
// hardware conversions instead of optim_kernel.h's integer rounding. It
// computes adam_update's fp64 operations in the same order
// (docs/contract.md §12), so it gives the same bits wherever the
// conversions are the exact RN32 -- which holds in every Carbon op, since
// each runs in the default MXCSR state (csrc/exact/fp_env.h):
//
//  * MXCSR's rounding control is round-to-nearest-even, and neither
//    flush-to-zero nor denormals-are-zero is set. Then vcvtpd2ps is IEEE 754's
//    correctly rounded conversion for every double: normal results, gradual
//    underflow to the subnormals and to a signed zero, overflow to +-inf --
//    RN32 as round_double(x, float32) computes it, for all but NaN; and
//    vcvtps2pd of a float (subnormals included) is exact, as are the
//    widenings of bfloat16 (a shift) and float16 (vcvtph2ps).
//  * bfloat16 / float16 parameters: p' is rounded to nearest float32 and
//    then to nearest-even into the format (integers for bfloat16,
//    vcvtps2ph for float16), which is RN_F except where the float32 is a
//    midpoint of F's grid; groups with such a lane round to odd into float32
//    first (the conversion toward zero, by its embedded rounding mode, plus
//    a sticky last bit): RN_F with no double-rounding error (store_param8).
//  * NaN results become the format's one NaN (0x7FC00000 for float32), as
//    encode writes them (the conversions keep other payloads): a NaN m', v'
//    or v_max' makes p' NaN, so one unordered compare on p' per group finds
//    every group with a NaN result, and fix_nans rewrites those lanes.
//
// AMSGrad (amsgrad=True) runs here too: maximum(v_max, v') of two float32
// values is vrangeps plus an unordered mask (ieee_maximum8), no rounding.
//
// Each element is independent and the loop keeps no partial state, so the
// blocking (eight lanes, a masked tail) plays no role in the bits.
//
// Speed (one thread of the 2-core AVX-512 VM, a Zen 4 at ~3.5 GHz,
// docs/benchmarks.md): ~1.0 ns per element for float32 in cache, against
// ~2.1 ns for the generic branch-free blocks, which spend most of their time
// in the integer roundings and range checks (bfloat16 / float16: ~1.2-1.3
// ns here, 2.8 / 3.2 ns in the blocks, and far more there when float16
// values are subnormal). Two resources bound this loop about equally: the
// fp64 divider (a zmm square root ~15.5 cycles, a division ~8.6: 24 cycles
// per 8 elements, ~0.87 ns per element) and the other vector work (~25
// cycles per 8 elements with the square root and divisions taken out;
// each operation less saves ~0.5 cycle). So the loop overlaps
// square roots with earlier groups' divisions and replaces the division by
// c2s with a checked reciprocal (quotient_by_c2s), and keeps per-group work
// small: NaNs are fixed outside the loop, 16-bit results round once through
// float32. Measured no gain: additions written as fmas (a * 1 + b, the same
// bits on the multiply pipes), software prefetch, unrolling by 3 (the
// register moves of the pipelining), the plain division by c2s (1.18 ns),
// a check |r1| < RN(q1 |c2s| 2^-54) in quotient_by_c2s (3 operations fewer,
// but up to 2x tighter: ~25% of the lanes divided, 1.32 ns).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define CARBON_ADAM_AVX512 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "../cpu_features.h"
#include "optim_kernel.h"

// GCC 12 reports the intrinsics' own `__m512d __Y = __Y` placeholder
// (_mm512_undefined_pd) as maybe-uninitialized once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace carbon {
namespace adam_avx512 {

#define CARBON_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl")))
// The Adam loop adds avx512bw (16-bit masked loads and stores) and f16c
// (float16 <-> float32) for bfloat16 / float16 parameters; every CPU with
// avx512dq and avx512vl has both. (sgd_avx512.h uses the helpers below with
// the narrower target.)
#define CARBON_ADAM_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,f16c")))

// The CPU has the instructions of both targets (and the OS saves the zmm
// state).
inline bool available() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("f16c") && cpu::avx512_allowed();
  return yes;
}

// Which of the gradient terms of adam_update apply (fixed per step, so each
// is its own loop without selects): AdamW's decay of p, Adam's L2 term
// (wd != 0), or neither.
enum class Mode { kPlain, kL2, kDecoupled };

struct Constants {
  __m512d sign, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, c2s, c2s_magnitude,
      c2s_reciprocal, eps, step_size;
  __m256 nan;
};

CARBON_AVX512_TARGET inline Constants broadcast(const AdamConstants& c) {
  Constants v;
  v.sign = _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(kSignBit)));
  v.weight_decay = _mm512_set1_pd(c.weight_decay);
  v.decay = _mm512_set1_pd(c.decay);
  v.beta1 = _mm512_set1_pd(c.beta1);
  v.one_minus_beta1 = _mm512_set1_pd(c.one_minus_beta1);
  v.beta2 = _mm512_set1_pd(c.beta2);
  v.one_minus_beta2 = _mm512_set1_pd(c.one_minus_beta2);
  v.c2s = _mm512_set1_pd(c.bias_correction2_sqrt);
  v.c2s_magnitude = _mm512_set1_pd(std::fabs(c.bias_correction2_sqrt));
  v.c2s_reciprocal = _mm512_set1_pd(1.0 / c.bias_correction2_sqrt);
  v.eps = _mm512_set1_pd(c.eps);
  v.step_size = _mm512_set1_pd(c.step_size);
  v.nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(state_format().nan_bits)));
  return v;
}

// NaN lanes of x replaced by float32's one NaN (vfpclassps 0x81: quiet or
// signalling NaN).
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m256 canonical_nans(__m256 x, __m256 nan) {
  return _mm256_mask_mov_ps(x, _mm256_fpclass_ps_mask(x, 0x81), nan);
}

// RN64(x / y) for the step's y = c2s, mostly without the division (the
// divider, shared by this division, the square root and num / denom, is
// what bounds the loop): from ry = RN64(1/y), q0 = x ry and one Markstein
// correction q1 = q0 + (x - q0 y) ry (fmas, written out). Then q1 is
// checked, lane by lane, and the lanes that fail take the IEEE division:
//   r1 = RN64(x - q1 y) (one fma) and T = RN64(|y| h), with h = ulp(q1) / 2
//   = 2^(E - 53) built from q1's exponent field E + 1023 (in 54..2046;
//   below, h <= 0, so T <= 0 or NaN, and for inf / NaN q1, r1 is inf or
//   NaN: all fail). If |x - q1 y| >= |y| h, then |r1| >= T (RN is
//   monotone and symmetric); so |r1| < T gives |x / y - q1| < h. With q1
//   normal and not a power of two, every other double lies at least 2h
//   from q1, hence more than h from x / y: q1 is the nearest double,
//   q1 = RN64(x / y) (no tie, no overflow).
// Nothing here relies on ry's accuracy (it only decides how often lanes
// pass) nor on y's range. Zeros (h <= 0), NaN, inf and the rare exact
// powers of two take the division. (A lane check for x = +0 cost ~3%.)
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m512d quotient_by_c2s(__m512d x, const Constants& c) {
  const __m512d y = c.c2s, ry = c.c2s_reciprocal;
  const __m512d q0 = _mm512_mul_pd(x, ry);
  const __m512d q1 = _mm512_fmadd_pd(_mm512_fnmadd_pd(q0, y, x), ry, q0);
  const __m512d r1 = _mm512_fnmadd_pd(q1, y, x);
  const __m512i q1_bits = _mm512_castpd_si512(q1);
  const __m512i exponent = _mm512_and_si512(q1_bits, _mm512_set1_epi64(static_cast<long long>(kExpMask)));
  const __m512d h = _mm512_castsi512_pd(_mm512_sub_epi64(exponent, _mm512_set1_epi64(53LL << 52)));
  const __mmask8 close = _mm512_cmp_pd_mask(_mm512_abs_pd(r1), _mm512_mul_pd(c.c2s_magnitude, h), _CMP_LT_OQ);
  const __m512i fraction_mask = _mm512_set1_epi64(static_cast<long long>(kFracMask));
  const __mmask8 not_power_of_two = _mm512_test_epi64_mask(q1_bits, fraction_mask);
  const __mmask8 fail = static_cast<__mmask8>(~(close & not_power_of_two));
  if (__builtin_expect(fail != 0, 0)) return _mm512_mask_div_pd(q1, fail, x, y);
  return q1;
}

// Eight floats (or the lanes of `lanes`, zeros elsewhere; a masked load
// touches no other memory), widened exactly to doubles.
template <bool kFull>
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m512d load8(const float* x, __mmask8 lanes) {
  return _mm512_cvtps_pd(kFull ? _mm256_loadu_ps(x) : _mm256_maskz_loadu_ps(lanes, x));
}
template <bool kFull>
CARBON_AVX512_TARGET __attribute__((always_inline)) inline void store8(float* x, __mmask8 lanes, __m256 value) {
  if constexpr (kFull) {
    _mm256_storeu_ps(x, value);
  } else {
    _mm256_mask_storeu_ps(x, lanes, value);
  }
}

// ---- the parameter's format T: float, c10::BFloat16 or c10::Half.
template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float>;
template <typename T>
constexpr bool kIsBFloat16 = std::is_same_v<T, c10::BFloat16>;

// Eight 16-bit patterns (or the lanes of `lanes`, zeros elsewhere).
template <bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline __m128i load8_16(const void* x, __mmask8 lanes) {
  return kFull ? _mm_loadu_si128(static_cast<const __m128i*>(x)) : _mm_maskz_loadu_epi16(lanes, x);
}

// Eight parameters (or gradients) widened exactly to doubles: bfloat16 is
// the top half of a float32 (a shift of the bits), float16 widens with
// vcvtph2ps (exact, subnormals included), float32 with vcvtps2pd.
template <typename T, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline __m512d load_param8(const T* x, __mmask8 lanes) {
  if constexpr (kIsFloat<T>) {
    return load8<kFull>(x, lanes);
  } else if constexpr (kIsBFloat16<T>) {
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load8_16<kFull>(x, lanes)), 16);
    return _mm512_cvtps_pd(_mm256_castsi256_ps(bits));
  } else {
    return _mm512_cvtps_pd(_mm256_cvtph_ps(load8_16<kFull>(x, lanes)));
  }
}

// RN_T(x) of eight doubles, written to x[0, 8) (or the lanes of `lanes`),
// for every x but NaN (NaN lanes get some NaN; back() replaces them by T's
// one NaN through fix_nans). float32: the conversion (RN32 under the MXCSR
// the caller checked).
//
// bfloat16 / float16, usually (store_param8_rn32): first RN32 (the
// conversion), then RN_T of that float (integers for bfloat16, vcvtps2ph for
// float16). Rounding twice to nearest gives RN_T(x) except where RN32(x)
// is a midpoint of T's grid: float32's grid holds T's points and
// midpoints (T's exponent range, subnormals and overflow threshold
// included, with >= 2 bits to spare), RN32 is monotone and keeps them, so
// for x strictly between two neighbours a < b of T with midpoint h, RN32(x)
// lies on x's side of h or on h itself. The lanes where RN32(x) can be a
// midpoint -- bfloat16: low 16 bits 0x8000 (every binade, subnormals
// included, as bfloat16 shares float32's exponents); float16: low 13 bits
// 0x1000 in float16's normal range, and any nonzero |RN32(x)| below 2^-14
// (float16's subnormals, whose midpoints sit elsewhere) -- send the group to
// store_param8_odd.
//
// store_param8_odd: first round to odd into float32 -- the conversion
// toward zero (embedded rounding, whatever MXCSR's RC), with the last bit
// set where that was inexact (x differs from its widening back) -- then
// round that to nearest-even into T. Round to odd with 24 >= p + 2 bits
// (p = 8, 11) makes the second rounding give RN_T(x) for every x (no
// double-rounding error). Both give the same bits as round_double(x, T),
// signed zeros, subnormals and overflow to +-inf included.
template <typename T, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline void store8_16(T* x, __mmask8 lanes, __m128i bits) {
  if constexpr (kFull) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(x), bits);
  } else {
    _mm_mask_storeu_epi16(x, lanes, bits);
  }
}

// The nearest T of eight floats (their bits), ties to even.
template <typename T>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline __m128i nearest16(__m256i f32_bits) {
  if constexpr (kIsBFloat16<T>) {
    const __m256i kept_lsb = _mm256_and_si256(_mm256_srli_epi32(f32_bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(f32_bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), kept_lsb));
    return _mm256_cvtepi32_epi16(_mm256_srli_epi32(rounded, 16));
  } else {
    return _mm256_cvtps_ph(_mm256_castsi256_ps(f32_bits), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}

template <typename T, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((noinline)) void store_param8_odd(T* x, __mmask8 lanes, __m512d value) {
  const __m256 toward_zero = _mm512_cvt_roundpd_ps(value, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(toward_zero), value, _CMP_NEQ_UQ);
  const __m256i tz_bits = _mm256_castps_si256(toward_zero);
  store8_16<T, kFull>(x, lanes, nearest16<T>(_mm256_mask_or_epi32(tz_bits, inexact, tz_bits, _mm256_set1_epi32(1))));
}

template <typename T, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline void store_param8(T* x, __mmask8 lanes, __m512d value) {
  if constexpr (kIsFloat<T>) {
    store8<kFull>(x, lanes, _mm512_cvtpd_ps(value));
  } else {
    const __m256i bits = _mm256_castps_si256(_mm512_cvtpd_ps(value));  // RN32
    __mmask8 maybe_midpoint;
    if constexpr (kIsBFloat16<T>) {
      const __m256i low = _mm256_and_si256(bits, _mm256_set1_epi32(0xFFFF));
      maybe_midpoint = _mm256_cmpeq_epi32_mask(low, _mm256_set1_epi32(0x8000));
    } else {
      const __m256i low = _mm256_and_si256(bits, _mm256_set1_epi32(0x1FFF));
      const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
      // 0 < |RN32(x)| < 2^-14 (0x38800000): magnitude - 1 < 0x387FFFFF, unsigned
      const __mmask8 subnormal = _mm256_cmplt_epu32_mask(_mm256_sub_epi32(magnitude, _mm256_set1_epi32(1)),
                                                         _mm256_set1_epi32(0x387FFFFF));
      maybe_midpoint = _mm256_cmpeq_epi32_mask(low, _mm256_set1_epi32(0x1000)) | subnormal;
    }
    if (__builtin_expect((maybe_midpoint & lanes) != 0, 0)) return store_param8_odd<T, kFull>(x, lanes, value);
    if constexpr (kIsBFloat16<T>) {
      // No lane is a midpoint (low 16 bits 0x8000): rounding half up is
      // rounding to nearest (a carry into the exponent, up to inf, included).
      const __m256i rounded = _mm256_add_epi32(bits, _mm256_set1_epi32(0x8000));
      store8_16<T, kFull>(x, lanes, _mm256_cvtepi32_epi16(_mm256_srli_epi32(rounded, 16)));
    } else {
      store8_16<T, kFull>(x, lanes, nearest16<T>(bits));
    }
  }
}

// AMSGrad's v_max' = maximum(v_max, v') (optim_kernel.h's ieee_maximum) of
// two float32 vectors: NaN (float32's one NaN) where either is NaN, -0 < +0,
// else the larger. vrangeps with imm 0b0101 (maximum, the sign from the
// comparison) is that for non-NaN operands, -0 < +0 included (it returns
// the other operand where one is a quiet NaN, hence the unordered mask);
// exact, no rounding, and denormals are kept since DAZ is off (fp_env.h). 4e8 random lanes with special values against
// the select-by-masks form (a & b where equal, then the larger, then NaN):
// 0 differ.
CARBON_AVX512_TARGET __attribute__((always_inline)) inline __m256 ieee_maximum8(__m256 a, __m256 b, __m256 nan) {
  return _mm256_mask_mov_ps(_mm256_range_ps(a, b, 0b0101), _mm256_cmp_ps_mask(a, b, _CMP_UNORD_Q), nan);
}

// adam_update's operations, one by one, for elements [0, 8) (kFull) or the
// lanes of `lanes` (the tail), in two halves so that the loop can overlap
// one group's square root with the previous group's divisions: `front`
// reads p, g, m, v (and AMSGrad's w = max_exp_avg_sq), writes m' and v' (and
// w'; RN32 is the conversion to float; the rounded values continue as exact
// doubles) and returns what `back` needs to write p'.
struct Front {
  __m512d root, num, p0;
};

template <typename T, Mode kMode, bool kMaximize, bool kAmsgrad, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline Front front(const T* p, const T* g, float* m, float* v,
                                                                        float* w, __mmask8 lanes,
                                                                        const Constants& c) {
  const __m512d pd = load_param8<T, kFull>(p, lanes);
  __m512d gp = load_param8<T, kFull>(g, lanes);
  const __m512d md = load8<kFull>(m, lanes);
  const __m512d vd = load8<kFull>(v, lanes);
  if constexpr (kMaximize) gp = _mm512_xor_pd(gp, c.sign);                                      // g' = -g
  if constexpr (kMode == Mode::kL2) gp = _mm512_add_pd(gp, _mm512_mul_pd(c.weight_decay, pd));  // g' + wd p
  Front out;
  out.p0 = kMode == Mode::kDecoupled ? _mm512_mul_pd(pd, c.decay) : pd;
  const __m512d m_sum = _mm512_add_pd(_mm512_mul_pd(c.beta1, md), _mm512_mul_pd(c.one_minus_beta1, gp));
  const __m512d g2 = _mm512_mul_pd(gp, gp);
  const __m512d v_sum = _mm512_add_pd(_mm512_mul_pd(c.beta2, vd), _mm512_mul_pd(c.one_minus_beta2, g2));
  const __m256 m1 = _mm512_cvtpd_ps(m_sum);  // RN32
  const __m256 v1 = _mm512_cvtpd_ps(v_sum);
  __m256 denominator_source = v1;
  if constexpr (kAmsgrad) {
    const __m256 w0 = kFull ? _mm256_loadu_ps(w) : _mm256_maskz_loadu_ps(lanes, w);
    denominator_source = ieee_maximum8(w0, v1, c.nan);
    store8<kFull>(w, lanes, denominator_source);
  }
  out.root = _mm512_sqrt_pd(_mm512_cvtps_pd(denominator_source));
  out.num = _mm512_mul_pd(c.step_size, _mm512_cvtps_pd(m1));
  // NaN lanes of m', v' (and w') are made float32's one NaN by back()
  // (fix_nans): each of them makes p' NaN.
  store8<kFull>(m, lanes, m1);
  store8<kFull>(v, lanes, v1);
  return out;
}

// The NaN lanes of a group (`nan`: where p' is NaN) made the formats' one
// NaN, as encode writes them: p' there, and m', v', w' where they are NaN.
// A NaN m', v' or w' always makes p' NaN (num, root, hence the quotients
// and p' = p0 - delta are NaN), so these lanes are the only ones where any
// of them can be NaN. Rare (NaN inputs or inf - inf), so one lane at a
// time, outside the loop.
template <typename T>
__attribute__((noinline, cold)) void fix_nans(T* p, float* m, float* v, float* w, unsigned nan) {
  const uint32_t state_nan = state_format().nan_bits;
  for (int l = 0; l < 8; ++l) {
    if (!((nan >> l) & 1u)) continue;
    if constexpr (kIsFloat<T>) {
      std::memcpy(p + l, &state_nan, sizeof(uint32_t));
    } else {
      const auto bits = static_cast<uint16_t>(
          (kIsBFloat16<T> ? Format<FormatId::kBFloat16>::get() : Format<FormatId::kFloat16>::get()).nan_bits);
      std::memcpy(p + l, &bits, sizeof bits);
    }
    for (float* state : {m, v, w}) {
      if (state == nullptr) continue;
      uint32_t b;
      std::memcpy(&b, state + l, sizeof b);
      if ((b & 0x7FFFFFFFu) > 0x7F800000u) std::memcpy(state + l, &state_nan, sizeof b);
    }
  }
}

// kC2sIsOne: c2s == 1, as it is once 1 - beta2^t rounds to 1 (t > ~37400
// for beta2 = 0.999, ~730 for 0.95); then RN64(root / 1) = root for every
// root (NaN stays NaN) and quotient_by_c2s (~10% of the loop) is skipped.
template <typename T, bool kC2sIsOne, bool kFull>
CARBON_ADAM_AVX512_TARGET __attribute__((always_inline)) inline void back(T* p, float* m, float* v, float* w,
                                                                      __mmask8 lanes, const Front& f,
                                                                      const Constants& c) {
  const __m512d scaled = kC2sIsOne ? f.root : quotient_by_c2s(f.root, c);
  const __m512d denom = _mm512_add_pd(scaled, c.eps);
  const __m512d p1 = _mm512_sub_pd(f.p0, _mm512_div_pd(f.num, denom));
  store_param8<T, kFull>(p, lanes, p1);
  const __mmask8 nan = _mm512_mask_cmp_pd_mask(lanes, p1, p1, _CMP_UNORD_Q);
  if (__builtin_expect(nan != 0, 0)) fix_nans<T>(p, m, v, w, nan);
}

// Software-pipelined two groups deep: group k's front, then group k-2's
// back (one group deep measured 1.12 ns per element, two 1.04, three no
// better). Each group reads and writes its own elements only, and its front
// runs before its back, so the order plays no role in the bits.
template <typename T, Mode kMode, bool kMaximize, bool kAmsgrad, bool kC2sIsOne>
CARBON_ADAM_AVX512_TARGET void step_loop(T* p, const T* g, float* m, float* v, float* w, int64_t n,
                                    const AdamConstants& c) {
  const Constants cv = broadcast(c);
  const int64_t full = n & ~int64_t{7};
  // w + i only for AMSGrad (w is null otherwise, and never read).
  auto at = [w](int64_t i) { return kAmsgrad ? w + i : w; };
  if (full >= 16) {
    Front older = front<T, kMode, kMaximize, kAmsgrad, true>(p, g, m, v, at(0), 0xFF, cv);
    Front newer = front<T, kMode, kMaximize, kAmsgrad, true>(p + 8, g + 8, m + 8, v + 8, at(8), 0xFF, cv);
    for (int64_t i = 16; i < full; i += 8) {
      const Front next = front<T, kMode, kMaximize, kAmsgrad, true>(p + i, g + i, m + i, v + i, at(i), 0xFF, cv);
      back<T, kC2sIsOne, true>(p + i - 16, m + i - 16, v + i - 16, at(i - 16), 0xFF, older, cv);
      older = newer;
      newer = next;
    }
    back<T, kC2sIsOne, true>(p + full - 16, m + full - 16, v + full - 16, at(full - 16), 0xFF, older, cv);
    back<T, kC2sIsOne, true>(p + full - 8, m + full - 8, v + full - 8, at(full - 8), 0xFF, newer, cv);
  } else if (full == 8) {
    back<T, kC2sIsOne, true>(p, m, v, at(0), 0xFF, front<T, kMode, kMaximize, kAmsgrad, true>(p, g, m, v, at(0), 0xFF, cv), cv);
  }
  if (full < n) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (n - full)) - 1u);
    const Front last =
        front<T, kMode, kMaximize, kAmsgrad, false>(p + full, g + full, m + full, v + full, at(full), tail, cv);
    back<T, kC2sIsOne, false>(p + full, m + full, v + full, at(full), tail, last, cv);
  }
}

// Calls run(mode, maximize, c2s_is_one) with the step's three choices as
// compile-time constants (std::integral_constant), so that each loop is
// compiled without selects: AdamW's decay / Adam's L2 term / neither,
// maximize, and c2s == 1. (The AVX-512 and AVX2 steps share it.)
template <typename Run>
inline void with_step_mode(const AdamConstants& c, Run&& run) {
  const Mode mode = c.decoupled_mask ? Mode::kDecoupled : (c.l2_mask ? Mode::kL2 : Mode::kPlain);
  auto with_c2s = [&](auto mode_constant, auto maximize_constant) {
    if (c.bias_correction2_sqrt == 1.0) return run(mode_constant, maximize_constant, std::true_type{});
    return run(mode_constant, maximize_constant, std::false_type{});
  };
  auto with_sign = [&](auto mode_constant) {
    if (c.grad_sign != 0) return with_c2s(mode_constant, std::true_type{});
    return with_c2s(mode_constant, std::false_type{});
  };
  switch (mode) {
    case Mode::kDecoupled:
      return with_sign(std::integral_constant<Mode, Mode::kDecoupled>{});
    case Mode::kL2:
      return with_sign(std::integral_constant<Mode, Mode::kL2>{});
    case Mode::kPlain:
      return with_sign(std::integral_constant<Mode, Mode::kPlain>{});
  }
}

// The step over n elements (in place); only where available() holds. w: AMSGrad's max_exp_avg_sq (kAmsgrad),
// else null.
template <bool kAmsgrad, typename T>
inline void step(T* p, const T* g, float* m, float* v, float* w, int64_t n, const AdamConstants& c) {
  with_step_mode(c, [&](auto mode, auto maximize, auto c2s_is_one) {
    step_loop<T, decltype(mode)::value, decltype(maximize)::value, kAmsgrad, decltype(c2s_is_one)::value>(
        p, g, m, v, w, n, c);
  });
}

#undef CARBON_AVX512_TARGET
#undef CARBON_ADAM_AVX512_TARGET

}  // namespace adam_avx512
}  // namespace carbon

#pragma GCC diagnostic pop
#endif
