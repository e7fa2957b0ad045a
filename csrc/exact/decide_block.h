// Tier 1's rounding test for a block of sums at once, without branches, so
// the loops vectorize (CPU kernels that decide many sums of the same shape:
// the rows of carbon.sum / mean, the columns of the indexed accumulations).
// Each is round_if_decided / round_quotient_if_decided (rounding_test.h)
// restricted to f's normal range: an entry whose interval is decided there
// gets RN_f of its exact value, as from the general test; every other entry
// (zeros, subnormals, overflow, non-finite sums, undecided intervals) is
// flagged in `pending` for the caller's general path. So which path decides
// never shows in the bits.
//
// Functions in an unnamed namespace: each CPU file that includes this
// header gets its own target_clones copies (their resolvers are local).
#pragma once

#include <cstdint>

#include "float_format.h"
#include "rounding_test.h"

namespace carbon {
namespace {

#define CARBON_DECIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// One entry's decision from the magnitudes' bits of its interval's inner
// end (nearer 0) and outer end, both already pushed outwards; `sign` holds
// the sign of both ends in its top bit (same_sign: whether they agree).
// Writes RN_f's bits (meaningless unless decided).
template <typename F>
inline uint32_t decide_magnitudes(uint64_t inner, uint64_t outer, uint32_t same_sign, uint64_t sign,
                                  typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const uint64_t r_inner = round_normal_bits(inner, f);
  const uint32_t decided = same_sign & rounds_to_normal(inner, f) & rounds_to_normal(outer, f) &
                           static_cast<uint32_t>(r_inner == round_normal_bits(outer, f));
  *out = static_cast<typename F::Bits>((static_cast<uint32_t>(sign >> 63) << (f.total_bits - 1)) |
                                       encode_normal(r_inner, f));
  return decided;
}

// A sum s within beta of the exact value: the interval [s - beta, s + beta]
// pushed `step` ulps outwards (1; 0 when s is known to be the exact value
// and beta = 0: then the "interval" is s itself and a tie rounds to even).
// next_down / next_up are steps of one in the magnitude's bits; a magnitude
// of 0 wraps to a pattern that is not normal. Decided when both ends lie on
// one side of 0 and round to the same normal number of f.
template <typename F>
inline uint32_t decide_sum(double s, double beta, uint64_t step, typename F::Bits* out) {
  const uint64_t lo = double_to_bits(s - beta), hi = double_to_bits(s + beta);
  const uint64_t mag_lo = lo & ~kSignBit, mag_hi = hi & ~kSignBit;
  const uint64_t inner = (mag_lo < mag_hi ? mag_lo : mag_hi) - step;
  const uint64_t outer = (mag_lo < mag_hi ? mag_hi : mag_lo) + step;
  return decide_magnitudes<F>(inner, outer, static_cast<uint32_t>(((lo ^ hi) & kSignBit) == 0), lo, out);
}

// s[c] within factor * a[c] of the exact sum: out[c] = RN_f(exact sum), or
// pending[c] = 1. Returns 1 when every entry is decided.
template <typename F>
CARBON_DECIDE_CLONES uint32_t decide_block(const double* __restrict__ s, const double* __restrict__ a, double factor,
                                           int64_t width, typename F::Bits* __restrict__ out,
                                           uint8_t* __restrict__ pending) {
  uint32_t all_decided = 1;
  for (int64_t c = 0; c < width; ++c) {
    const uint32_t decided = decide_sum<F>(s[c], factor * a[c], 1, out + c);
    pending[c] = static_cast<uint8_t>(decided ^ 1u);
    all_decided &= decided;
  }
  return all_decided;
}

// The same for the quotients (exact sum) / n: each end of the interval is
// pushed outwards, divided by n in fp64, and pushed outwards again (as
// round_quotient_if_decided; dividing the magnitudes rounds symmetrically).
template <typename F>
CARBON_DECIDE_CLONES uint32_t decide_quotient_block(const double* __restrict__ s, const double* __restrict__ a,
                                                    double factor, double n, int64_t width,
                                                    typename F::Bits* __restrict__ out,
                                                    uint8_t* __restrict__ pending) {
  uint32_t all_decided = 1;
  for (int64_t c = 0; c < width; ++c) {
    const double beta = factor * a[c];
    const uint64_t lo = double_to_bits(s[c] - beta), hi = double_to_bits(s[c] + beta);
    const uint64_t mag_lo = lo & ~kSignBit, mag_hi = hi & ~kSignBit;
    const uint64_t inner0 = (mag_lo < mag_hi ? mag_lo : mag_hi) - 1;
    const uint64_t outer0 = (mag_lo < mag_hi ? mag_hi : mag_lo) + 1;
    const uint64_t inner = (double_to_bits(bits_to_double(inner0) / n) & ~kSignBit) - 1;
    const uint64_t outer = (double_to_bits(bits_to_double(outer0) / n) & ~kSignBit) + 1;
    const uint32_t same_sign = static_cast<uint32_t>(((lo ^ hi) & kSignBit) == 0);
    const uint32_t decided = decide_magnitudes<F>(inner, outer, same_sign, lo, out + c);
    pending[c] = static_cast<uint8_t>(decided ^ 1u);
    all_decided &= decided;
  }
  return all_decided;
}

#undef CARBON_DECIDE_CLONES

}  // namespace
}  // namespace carbon
