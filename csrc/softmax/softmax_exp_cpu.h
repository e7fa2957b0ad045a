// A cheaper float32 EXP for the CPU softmax kernels (softmax_cpu.cpp only;
// on CPUs with AVX-512 they use softmax_exp_avx512.h instead):
// the same float32 bits as carbon.exp, RN32(exp_f32_core(d))
// (elementwise_math.h, docs/contract.md §6), for every float32 d, from a
// shorter fp64 evaluation plus a rounding test, with exp32 itself for the
// few arguments the test leaves undecided.
//
// exp_f32_approx(d) = 2^k p(r): k = round(d log2e) by the shifter's fma as
// in exp_core, r = d - k ln2 in ONE fma with ln2 rounded to a double, and p a degree-8
// polynomial fitted to e^r on [-0.347, 0.347] (Chebyshev interpolation,
// coefficients rounded to double, constant term 1) instead of exp_core's
// degree-12 Taylor polynomial and two-constant reduction: 10 fmas, one
// subtraction and one multiplication instead of 13 fmas, 3 multiplications
// and 3 subtractions (the fmas bound the vector loop's speed).
// Relative error against e^d, for d in [-110, 89] (every float32 argument
// whose exp is neither 0 nor inf in float32; d is clamped there):
//   polynomial   |p(r)/e^r - 1| < 2^-39.75 (max over a dense grid of
//                [-0.347, 0.347], 200-bit arithmetic; |r| <= ln2/2 + 2^-40)
//   reduction    |k| <= 159: |k (ln2 - ln2_double)| + ulp(r)/2 < 2^-47
//   evaluation   Horner with fma on |r| < 0.35, decreasing terms: < 2^-51,
//                and the final multiplication by 2^k: 2^-53
// so < 2^-39.7 against e^d; exp_f32_core is within 2^-49.5 of e^d, so the
// two doubles differ by less than 2^-39.6 of either (the exhaustive run of
// scripts/softmax_exp_check.py measures 2^-39.78 at most).
//
// The rounding test: let c = exp_f32_approx(d) lie in [2^e, 2^(e+1)) with
// RN32(c) a normal float32. In units of c's double ulp (2^(e-52)),
// |c - exp_f32_core(d)| < 2^-39.6 * 2^(e+1) = 2^13.4 ulps. The float32
// rounding boundaries (midpoints) nearest c sit where the 29 bits that
// float32 drops from c's significand equal 2^28 (c's own float32 cell), or
// at least 2^27 ulps away (the neighbouring cells, the smaller one below a
// power of two); so when those 29 bits lie more than kApproxMargin = 2^14
// from 2^28, no midpoint lies between c and exp_f32_core(d), and both round
// to the same float32 (RN32 is constant between midpoints). Tiny results:
// c <= 2^-151 means exp_f32_core(d) < 2^-150 (half the smallest subnormal),
// which RN32 takes to +0. Everything else -- midpoint-near values, results
// in float32's subnormal range, overflow, NaN -- is "undecided" and the
// caller uses exp32(d). About 2^-16 of the float32 values in [-87, 88]
// (33,450 patterns) are undecided for being near a midpoint.
//
// scripts/softmax_exp_check.py checks all 2^32 float32 patterns: every
// decided result (exp_f32_approx_decided, rounded by round32_decided as in
// the kernels) equals RN32(exp_f32_core(d)) bit for bit.
#pragma once

#include <cstdint>

#include "../elementwise/elementwise_math.h"
#include "../exact/float_format.h"

namespace carbon {

// exp_f32_approx's constants (softmax_exp_avx2.h evaluates the same
// operations four lanes at a time).
namespace exp_approx {
constexpr double kLog2e = 0x1.71547652b82fep+0;
constexpr double kLn2 = 0x1.62e42fefa39efp-1;
constexpr double kShifter = 0x1.8p52;
constexpr double kLow = -110.0, kHigh = 89.0;  // the clamp
constexpr double kPoly[9] = {
    0x1.a15b19c586d58p-16, 0x1.a1ab7bef5a48ep-13, 0x1.6c164d62635a8p-10, 0x1.11107ff794567p-7, 0x1.5555557463529p-5,
    0x1.555555a300313p-3,  0x1.fffffffff7067p-2,  0x1.ffffffffd31b8p-1,  0x1.0000000000000p+0,
};
}  // namespace exp_approx

// exp(d) within 2^-39.7 (relative) for a float32 value d >= -110; for
// d < -110 (and -inf) about e^-110 < 2^-158; NaN gives NaN.
inline double exp_f32_approx(double x) {
  using namespace exp_approx;
  double xc = x < kLow ? kLow : x;  // NaN passes through
  xc = xc > kHigh ? kHigh : xc;
  const double shifted = std::fma(xc, kLog2e, kShifter);  // 1.5*2^52 + k
  const double kd = shifted - kShifter;
  const double r = std::fma(kd, -kLn2, xc);
  const double p = math::horner(kPoly, r);
  // 2^k, |k| <= 159, from the shifter's low bits (see exp_f32_core).
  const double scale = bits_to_double((double_to_bits(shifted) + 1023) << 52);
  return p * scale;
}

constexpr uint64_t kApproxMargin = uint64_t{1} << 14;

// RN32(v) by the hardware conversion (round-to-nearest, the mode every
// carbon kernel computes in), for the values the callers' tests below
// admit: results in float32's normal range or beyond (inf), and zeros from
// |v| <= 2^-150. No subnormal double or float32 is read or produced there,
// so flush-to-zero / denormals-are-zero settings (torch.set_flush_denormal)
// do not change the bits; one conversion instead of the ~8 integer
// instructions of round_encode_fast.
inline float round32_decided(double v) { return static_cast<float>(v); }

// 1 when round32_decided(v) is RN32(v) for sure (round_encode_fast's range:
// |v| <= 2^-150, giving a zero of v's sign, or |v| from float32's smallest
// normal up to inf; not NaN, whose bits the callers canonicalize), else 0.
inline uint64_t round32_hardware_exact(double v) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  const uint64_t mag = double_to_bits(v) & ~kSignBit;
  const uint64_t tiny = static_cast<uint64_t>(quantum_exp(f) - 1 + 1023) << 52;  // 2^-150
  return static_cast<uint64_t>(mag <= tiny) | static_cast<uint64_t>((mag >= normal_min_bits(f)) & (mag <= kExpMask));
}

// 1 when the softmax quotient q >= +0 is exactly 0 or rounds to a normal
// float32 (rounds_to_normal), else 0 (see softmax_outputs_f32).
inline uint64_t quotient_rounding_decided(double q) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  const uint64_t u = double_to_bits(q);
  return static_cast<uint64_t>(u == 0) | static_cast<uint64_t>(rounds_to_normal(u, f));
}

// 1 when round32_decided(c), c = exp_f32_approx(d), is RN32(exp_f32_core(d))
// for sure (see above), else 0: RN32(c) normal and c's 29 dropped bits
// more than kApproxMargin from the midpoint 2^28, or c <= 2^-151 (+0).
// Branch-free, 64-bit lanes only, so loops over it vectorize.
inline uint64_t exp_f32_approx_decided(double c) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  constexpr uint64_t kDrop = 29;                                         // 53 - 24
  constexpr uint64_t kHalf = uint64_t{1} << (kDrop - 1);                 // half a float32 ulp
  constexpr uint64_t kTiny = static_cast<uint64_t>(-151 + 1023) << 52;  // 2^-151
  const uint64_t u = double_to_bits(c);  // c >= +0 or NaN
  const uint64_t dropped = (u - (kHalf - kApproxMargin)) & ((uint64_t{1} << kDrop) - 1);
  const uint64_t far = dropped > 2 * kApproxMargin;  // |dropped bits - kHalf| > kApproxMargin
  return (static_cast<uint64_t>(rounds_to_normal(u, f)) & far) | static_cast<uint64_t>(u <= kTiny);
}

}  // namespace carbon
