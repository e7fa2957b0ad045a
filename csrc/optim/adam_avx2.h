// The Adam / AdamW step on x86-64 CPUs with AVX2, FMA and F16C but no
// AVX-512 (Zen 1-3, Haswell to Alder Lake): float32, bfloat16 and float16
// parameters, four fp64 lanes at a time. A port of adam_avx512.h, whose
// comment argues every rounding in full; this loop computes adam_update's
// fp64 operations in the same order (docs/contract.md §12) with the same
// hardware conversions, so it gives the same bits under the default MXCSR
// that every Carbon op runs in (csrc/exact/fp_env.h: round-to-nearest-even,
// no flush-to-zero, no denormals-are-zero):
//
//  * vcvtpd2ps (ymm -> xmm) is RN32 for every double but NaN (gradual
//    underflow, signed zeros and overflow to +-inf included); vcvtps2pd is
//    exact, and so are the widenings of bfloat16 (a shift of the bits) and
//    float16 (vcvtph2ps).
//  * The division by c2s is quotient_by_c2s: a reciprocal with one
//    Markstein correction, checked lane by lane, and the IEEE division in the
//    lanes where the check fails (adam_avx512.h's argument, unchanged: only
//    the mask operations are AVX2's compares and blends).
//  * AMSGrad's maximum(v_max, v') of two float32 values: AVX2 has no
//    vrangeps, so ieee_maximum4 builds it from vmaxps (exact, no rounding).
//  * NaN results: a NaN m', v' or v_max' makes p' NaN, so one unordered
//    compare on p' per group finds every lane with a NaN result, and
//    adam_avx512::fix_nans (plain C++) writes the formats' one NaN there.
//  * bfloat16 / float16 parameters: RN32 first, then to nearest-even into T
//    (integers for bfloat16, vcvtps2ph for float16); that is RN_T except
//    where RN32(p') is a midpoint of T's grid (adam_avx512.h, store_param8).
//    AVX2 has no conversion with an embedded rounding mode for the
//    round-to-odd of the AVX-512 loop, so a group with such a lane takes
//    round_double + encode lane by lane -- the portable code's own rounding
//    (store_param4_exact). Rare: bfloat16 ~2^-16 per lane; float16 2^-13 per
//    lane plus the lanes below float16's normal range (|p'| < 2^-14).
//
// Each element is independent and the loop keeps no partial state, so the
// blocking (four lanes; a tail of n mod 4 elements run through a small
// zero-padded copy) plays no role in the bits.
//
// Speed (one thread of the 2-core Zen 3 VM, ~3.1 GHz, measured while other
// builds loaded the machine, so +-20%): AdamW float32, 4M elements, 2.0-2.3
// ns per element (the portable blocks: 4.4-4.8); in cache ~1.5-1.7. The
// fp64 divider bounds it as on AVX-512: a ymm square root ~9 cycles and a
// division ~6 per 4 elements (~1.2 ns per element), the rest of the vector
// work ~1.0 ns with both taken out; quotient_by_c2s instead of the division
// by c2s saves ~0.3 ns. Tried and dropped: a division-free num / denom
// (vrcpps widened, two Newton steps and one correction in fp64, checked as
// in quotient_by_c2s; same bits in a C++ harness) ran at 3.0-3.6 ns per
// element against 2.0-2.2 (why not investigated: the ~22 extra operations,
// or lanes failing the check).
#pragma once

#include "../exact/widen_avx2.h"
#include "adam_avx512.h"  // fix_nans, Mode, kIsFloat / kIsBFloat16 (and the includes)

#ifdef CARBON_ADAM_AVX512  // x86-64 with GCC / Clang
#define CARBON_ADAM_AVX2 1

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace carbon {
namespace adam_avx2 {

#define CARBON_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

using adam_avx512::fix_nans;
using adam_avx512::kIsBFloat16;
using adam_avx512::kIsFloat;
using adam_avx512::Mode;

struct Constants {
  __m256d sign, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, c2s, c2s_magnitude,
      c2s_reciprocal, eps, step_size;
  __m128 nan;
};

CARBON_AVX2_TARGET inline Constants broadcast(const AdamConstants& c) {
  Constants v;
  v.sign = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kSignBit)));
  v.weight_decay = _mm256_set1_pd(c.weight_decay);
  v.decay = _mm256_set1_pd(c.decay);
  v.beta1 = _mm256_set1_pd(c.beta1);
  v.one_minus_beta1 = _mm256_set1_pd(c.one_minus_beta1);
  v.beta2 = _mm256_set1_pd(c.beta2);
  v.one_minus_beta2 = _mm256_set1_pd(c.one_minus_beta2);
  v.c2s = _mm256_set1_pd(c.bias_correction2_sqrt);
  v.c2s_magnitude = _mm256_set1_pd(std::fabs(c.bias_correction2_sqrt));
  v.c2s_reciprocal = _mm256_set1_pd(1.0 / c.bias_correction2_sqrt);
  v.eps = _mm256_set1_pd(c.eps);
  v.step_size = _mm256_set1_pd(c.step_size);
  v.nan = _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(state_format().nan_bits)));
  return v;
}

// |x|: the sign bit cleared (exact).
CARBON_AVX2_TARGET __attribute__((always_inline)) inline __m256d abs4(__m256d x, const Constants& c) {
  return _mm256_andnot_pd(c.sign, x);
}

// RN64(x / c2s): adam_avx512::quotient_by_c2s with AVX2's masks. q1 from
// the reciprocal and one correction (fmas: whatever they give, q1 is only
// kept where the check proves it the nearest double); r1 = RN64(x - q1 y),
// h = ulp(q1) / 2 from q1's exponent field, and a lane passes iff
// |r1| < RN64(|y| h) and q1 is not a power of two (fraction field 0). Lanes
// that fail (zeros, inf, NaN, powers of two, the rare inexact q1) take the
// IEEE division.
CARBON_AVX2_TARGET __attribute__((always_inline)) inline __m256d quotient_by_c2s(__m256d x, const Constants& c) {
  const __m256d y = c.c2s, ry = c.c2s_reciprocal;
  const __m256d q0 = _mm256_mul_pd(x, ry);
  const __m256d q1 = _mm256_fmadd_pd(_mm256_fnmadd_pd(q0, y, x), ry, q0);
  const __m256d r1 = _mm256_fnmadd_pd(q1, y, x);
  const __m256i q1_bits = _mm256_castpd_si256(q1);
  const __m256i exponent = _mm256_and_si256(q1_bits, _mm256_set1_epi64x(static_cast<long long>(kExpMask)));
  const __m256d h = _mm256_castsi256_pd(_mm256_sub_epi64(exponent, _mm256_set1_epi64x(53LL << 52)));
  const __m256d close = _mm256_cmp_pd(abs4(r1, c), _mm256_mul_pd(c.c2s_magnitude, h), _CMP_LT_OQ);
  const __m256i fraction = _mm256_and_si256(q1_bits, _mm256_set1_epi64x(static_cast<long long>(kFracMask)));
  const __m256d power_of_two = _mm256_castsi256_pd(_mm256_cmpeq_epi64(fraction, _mm256_setzero_si256()));
  const __m256d pass = _mm256_andnot_pd(power_of_two, close);
  if (__builtin_expect(_mm256_movemask_pd(pass) != 0xF, 0)) return _mm256_blendv_pd(_mm256_div_pd(x, y), q1, pass);
  return q1;
}

// Four parameters, gradients or states widened exactly: widen4
// (csrc/exact/widen_avx2.h; bfloat16 is the top half of a float32, float16
// widens with vcvtph2ps, float32 with vcvtps2pd).

// A group with a possible midpoint lane: each lane by round_double + encode
// (store_value), the portable loop's rounding (NaN lanes get T's one NaN).
template <typename T>
CARBON_AVX2_TARGET __attribute__((noinline)) void store_param4_exact(T* x, __m256d value) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, value);
  constexpr FloatFormat f =
      kIsBFloat16<T> ? Format<FormatId::kBFloat16>::get() : Format<FormatId::kFloat16>::get();
  for (int l = 0; l < 4; ++l) store_value(x, l, round_double(lanes[l], f), f);
}

// RN_T(value) written to x[0, 4), for every value but NaN (NaN lanes get
// some NaN; back() replaces them by T's one NaN through fix_nans). float32:
// the conversion. bfloat16 / float16: RN32, then to nearest-even into T,
// unless some lane's RN32 can be a midpoint of T's grid (the tests of
// adam_avx512.h's store_param8: bfloat16 low 16 bits 0x8000; float16 low 13
// bits 0x1000, or 0 < |RN32| < 2^-14, as signed compares of the magnitude,
// which is below 2^31), which sends the group to store_param4_exact.
template <typename T>
CARBON_AVX2_TARGET __attribute__((always_inline)) inline void store_param4(T* x, __m256d value) {
  const __m128 rn32 = _mm256_cvtpd_ps(value);
  if constexpr (kIsFloat<T>) {
    _mm_storeu_ps(x, rn32);
  } else {
    const __m128i bits = _mm_castps_si128(rn32);
    __m128i maybe_midpoint;
    if constexpr (kIsBFloat16<T>) {
      maybe_midpoint = _mm_cmpeq_epi32(_mm_and_si128(bits, _mm_set1_epi32(0xFFFF)), _mm_set1_epi32(0x8000));
    } else {
      const __m128i low = _mm_and_si128(bits, _mm_set1_epi32(0x1FFF));
      const __m128i magnitude = _mm_and_si128(bits, _mm_set1_epi32(0x7FFFFFFF));
      const __m128i subnormal = _mm_and_si128(_mm_cmpgt_epi32(magnitude, _mm_setzero_si128()),
                                              _mm_cmpgt_epi32(_mm_set1_epi32(0x38800000), magnitude));
      maybe_midpoint = _mm_or_si128(_mm_cmpeq_epi32(low, _mm_set1_epi32(0x1000)), subnormal);
    }
    if (__builtin_expect(_mm_movemask_epi8(maybe_midpoint) != 0, 0)) return store_param4_exact<T>(x, value);
    __m128i out;
    if constexpr (kIsBFloat16<T>) {
      // No lane is a midpoint: rounding half up is rounding to nearest (a
      // carry into the exponent, up to inf, included). The shifted values
      // are below 2^16, so the signed-to-unsigned pack keeps them.
      const __m128i top = _mm_srli_epi32(_mm_add_epi32(bits, _mm_set1_epi32(0x8000)), 16);
      out = _mm_packus_epi32(top, top);
    } else {
      out = _mm_cvtps_ph(rn32, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storel_epi64(reinterpret_cast<__m128i*>(x), out);
  }
}

// AMSGrad's v_max' = maximum(a, b) (optim_kernel.h's ieee_maximum) of four
// float32 values. vmaxps(a, b) is a > b ? a : b (b where they are equal or
// either is NaN), so for ordered lanes vmaxps(a, b) and vmaxps(b, a) are
// both the larger operand where a != b, and a and b where a == b; their
// bitwise and is then the larger, or a itself (equal nonzero floats have
// equal bits), or +0 for {+0, -0} (-0 < +0), -0 for {-0, -0}. Unordered
// lanes: float32's one NaN. Exact (no rounding; DAZ is off, fp_env.h).
CARBON_AVX2_TARGET __attribute__((always_inline)) inline __m128 ieee_maximum4(__m128 a, __m128 b, __m128 nan) {
  const __m128 larger = _mm_and_ps(_mm_max_ps(a, b), _mm_max_ps(b, a));
  return _mm_blendv_ps(larger, nan, _mm_cmpunord_ps(a, b));
}

// adam_update's operations, one by one, for elements [0, 4), in two halves
// so that the loop can overlap one group's square root with earlier groups'
// divisions (as adam_avx512.h's front / back).
struct Front {
  __m256d root, num, p0;
};

template <typename T, Mode kMode, bool kMaximize, bool kAmsgrad>
CARBON_AVX2_TARGET __attribute__((always_inline)) inline Front front(const T* p, const T* g, float* m, float* v,
                                                                     float* w, const Constants& c) {
  const __m256d pd = widen4(p);
  __m256d gp = widen4(g);
  const __m256d md = widen4(m);
  const __m256d vd = widen4(v);
  if constexpr (kMaximize) gp = _mm256_xor_pd(gp, c.sign);                                      // g' = -g
  if constexpr (kMode == Mode::kL2) gp = _mm256_add_pd(gp, _mm256_mul_pd(c.weight_decay, pd));  // g' + wd p
  Front out;
  out.p0 = kMode == Mode::kDecoupled ? _mm256_mul_pd(pd, c.decay) : pd;
  const __m256d m_sum = _mm256_add_pd(_mm256_mul_pd(c.beta1, md), _mm256_mul_pd(c.one_minus_beta1, gp));
  const __m256d g2 = _mm256_mul_pd(gp, gp);
  const __m256d v_sum = _mm256_add_pd(_mm256_mul_pd(c.beta2, vd), _mm256_mul_pd(c.one_minus_beta2, g2));
  const __m128 m1 = _mm256_cvtpd_ps(m_sum);  // RN32
  const __m128 v1 = _mm256_cvtpd_ps(v_sum);
  __m128 denominator_source = v1;
  if constexpr (kAmsgrad) {
    denominator_source = ieee_maximum4(_mm_loadu_ps(w), v1, c.nan);
    _mm_storeu_ps(w, denominator_source);
  }
  out.root = _mm256_sqrt_pd(_mm256_cvtps_pd(denominator_source));
  out.num = _mm256_mul_pd(c.step_size, _mm256_cvtps_pd(m1));
  // NaN lanes of m', v' are made float32's one NaN by back() (fix_nans):
  // each of them makes p' NaN.
  _mm_storeu_ps(m, m1);
  _mm_storeu_ps(v, v1);
  return out;
}

// kC2sIsOne: c2s == 1, so RN64(root / 1) = root and quotient_by_c2s is
// skipped (as in adam_avx512.h).
template <typename T, bool kC2sIsOne>
CARBON_AVX2_TARGET __attribute__((always_inline)) inline void back(T* p, float* m, float* v, float* w,
                                                                   const Front& f, const Constants& c) {
  const __m256d scaled = kC2sIsOne ? f.root : quotient_by_c2s(f.root, c);
  const __m256d denom = _mm256_add_pd(scaled, c.eps);
  const __m256d p1 = _mm256_sub_pd(f.p0, _mm256_div_pd(f.num, denom));
  store_param4<T>(p, p1);
  const int nan = _mm256_movemask_pd(_mm256_cmp_pd(p1, p1, _CMP_UNORD_Q));
  if (__builtin_expect(nan != 0, 0)) fix_nans<T>(p, m, v, w, static_cast<unsigned>(nan));
}

// The last n < 4 elements: copied into zero-padded groups of four, stepped
// there, the n results copied back (the padding lanes' results, NaN or not,
// are dropped). Element by element: with variable-length memcpys instead,
// gcc 12 (-O3 -g) stopped with an internal error in this function.
template <typename T, Mode kMode, bool kMaximize, bool kAmsgrad, bool kC2sIsOne>
CARBON_AVX2_TARGET __attribute__((noinline)) void step_tail(T* p, const T* g, float* m, float* v, float* w,
                                                             int64_t n, const Constants& c) {
  struct Group {
    T p[4], g[4];
    float m[4], v[4], w[4];
  } b{};
  for (int64_t k = 0; k < n; ++k) {
    b.p[k] = p[k], b.g[k] = g[k], b.m[k] = m[k], b.v[k] = v[k];
    if constexpr (kAmsgrad) b.w[k] = w[k];
  }
  back<T, kC2sIsOne>(b.p, b.m, b.v, kAmsgrad ? b.w : nullptr,
                     front<T, kMode, kMaximize, kAmsgrad>(b.p, b.g, b.m, b.v, b.w, c), c);
  for (int64_t k = 0; k < n; ++k) {
    p[k] = b.p[k], m[k] = b.m[k], v[k] = b.v[k];
    if constexpr (kAmsgrad) w[k] = b.w[k];
  }
}

// Software-pipelined: group k's front, then group k - 2's back (the
// square root of one group overlaps the divisions of earlier ones). The
// loop is unrolled by 3 and the three Fronts rotate by name: a copy of a
// Front (three ymm values) that gcc spills goes through memory in 16-byte
// halves, and reloading those as 32 bytes stalls store forwarding (a
// pipeline that shifted an array of Fronts ran at ~5 ns per element, 4x
// slower). Each group reads and writes its own elements only, and its
// front runs before its back, so the order plays no role in the bits.
template <typename T, Mode kMode, bool kMaximize, bool kAmsgrad, bool kC2sIsOne>
CARBON_AVX2_TARGET void step_loop(T* p, const T* g, float* m, float* v, float* w, int64_t n, const AdamConstants& c) {
  const Constants cv = broadcast(c);
  const int64_t full = n & ~int64_t{3};
  // w + i only for AMSGrad (w is null otherwise, and never read).
#define CARBON_FRONT(i) \
  front<T, kMode, kMaximize, kAmsgrad>(p + (i), g + (i), m + (i), v + (i), kAmsgrad ? w + (i) : nullptr, cv)
#define CARBON_BACK(i, f) back<T, kC2sIsOne>(p + (i), m + (i), v + (i), kAmsgrad ? w + (i) : nullptr, f, cv)
  int64_t i = 0;
  if (full >= 20) {
    Front a = CARBON_FRONT(0), b = CARBON_FRONT(4);
    for (i = 8; i + 12 <= full; i += 12) {
      const Front f = CARBON_FRONT(i);
      CARBON_BACK(i - 8, a);
      a = CARBON_FRONT(i + 4);
      CARBON_BACK(i - 4, b);
      b = CARBON_FRONT(i + 8);
      CARBON_BACK(i, f);
    }
    CARBON_BACK(i - 8, a);
    CARBON_BACK(i - 4, b);
  }
  for (; i < full; i += 4) CARBON_BACK(i, CARBON_FRONT(i));
#undef CARBON_FRONT
#undef CARBON_BACK
  if (full < n)
    step_tail<T, kMode, kMaximize, kAmsgrad, kC2sIsOne>(p + full, g + full, m + full, v + full,
                                                       kAmsgrad ? w + full : nullptr, n - full, cv);
}

// The step over n elements (in place); only where cpu::avx2() holds. w:
// AMSGrad's max_exp_avg_sq (kAmsgrad), else null.
template <bool kAmsgrad, typename T>
inline void step(T* p, const T* g, float* m, float* v, float* w, int64_t n, const AdamConstants& c) {
  adam_avx512::with_step_mode(c, [&](auto mode, auto maximize, auto c2s_is_one) {
    step_loop<T, decltype(mode)::value, decltype(maximize)::value, kAmsgrad, decltype(c2s_is_one)::value>(
        p, g, m, v, w, n, c);
  });
}

#undef CARBON_AVX2_TARGET

}  // namespace adam_avx2
}  // namespace carbon

#pragma GCC diagnostic pop
#endif
