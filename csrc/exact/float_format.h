// The output formats and correct rounding into them.
//
// A value is carried as a double until the very end: every result Carbon
// writes is first produced as a double that is *exactly representable* in the
// output format (or is +-inf / NaN), and only then encoded into the format's
// bits. Rounding is done here with integer operations, never with the
// hardware's double->float conversion, so it does not depend on the CPU's
// flush-to-zero / denormals-are-zero state and cannot double-round.
#pragma once

#include "portable.h"

namespace carbon {

struct FloatFormat {
  int precision;       // significand bits including the hidden bit
  int min_normal_exp;  // exponent of the smallest normal number
  int max_exp;         // exponent of the largest finite number
  int total_bits;      // storage width
  uint32_t nan_bits;   // the one NaN pattern Carbon writes
};

constexpr FloatFormat kFloat32{24, -126, 127, 32, 0x7FC00000u};
constexpr FloatFormat kBFloat16{8, -126, 127, 16, 0x7FC0u};
constexpr FloatFormat kFloat16{11, -14, 15, 16, 0x7E00u};

// Exponent of the format's quantum in its subnormal range (fp32: -149).
CARBON_HD int quantum_exp(const FloatFormat& f) { return f.min_normal_exp - f.precision + 1; }

// Round the magnitude  mant * 2^lsb_exp  (+ a positive amount below 2^lsb_exp
// when `sticky`) to nearest-even in format f and return it, signed, as a
// double. `mant` must be nonzero, and when `sticky` is set the rounding point
// must lie above bit 0 of mant (callers pass a normalized 64-bit window).
// Overflow gives +-inf, underflow keeps subnormals and gives a signed zero.
CARBON_HD double round_magnitude(uint64_t mant, int lsb_exp, bool sticky, bool negative,
                                 const FloatFormat& f) {
  const int lead_exp = lsb_exp + top_bit(mant);
  int q = lead_exp - f.precision + 1;  // exponent of the result's last bit
  if (q < quantum_exp(f)) q = quantum_exp(f);
  const int shift = q - lsb_exp;  // bits of mant below the result's last bit
  uint64_t kept;
  if (shift <= 0) {
    kept = mant << (-shift);  // already representable (only for short mant)
  } else if (shift > 64) {
    kept = 0;  // below half a quantum: mant < 2^64 <= 2^(shift-1)
  } else {
    const uint64_t half = 1ull << (shift - 1);
    const uint64_t rem = shift == 64 ? mant : (mant & ((half << 1) - 1));
    kept = shift == 64 ? 0 : (mant >> shift);
    const bool above_half = rem > half || (rem == half && sticky);
    const bool tie = rem == half && !sticky;
    if (above_half || (tie && (kept & 1))) kept += 1;
  }
  const uint64_t sign = negative ? kSignBit : 0;
  if (kept == 0) return bits_to_double(sign);
  const int t = top_bit(kept);
  const int exp = q + t;
  if (exp > f.max_exp) return bits_to_double(sign | kExpMask);
  const uint64_t frac = (kept << (52 - t)) & kFracMask;
  return bits_to_double(sign | (static_cast<uint64_t>(exp + 1023) << 52) | frac);
}

// RN_f(x) for any double x, returned as a double exactly representable in f.
CARBON_HD double round_double(double x, const FloatFormat& f) {
  const uint64_t u = double_to_bits(x);
  const uint64_t biased = (u & kExpMask) >> 52;
  const uint64_t frac = u & kFracMask;
  if (biased == 0x7FF) return x;  // inf or NaN
  if (biased == 0 && frac == 0) return x;  // signed zero
  const uint64_t mant = biased ? (frac | (1ull << 52)) : frac;
  const int lsb_exp = (biased ? static_cast<int>(biased) : 1) - 1075;
  return round_magnitude(mant, lsb_exp, false, (u & kSignBit) != 0, f);
}

// Bits of v in format f. v must be NaN, +-inf, or exactly representable in f
// (as everything round_magnitude / round_double returns is).
CARBON_HD uint32_t encode(double v, const FloatFormat& f) {
  const uint64_t u = double_to_bits(v);
  const int frac_bits = f.precision - 1;
  const int exp_bits = f.total_bits - f.precision;
  const uint32_t sign = (u & kSignBit) ? (1u << (f.total_bits - 1)) : 0u;
  const uint32_t exp_all_ones = ((1u << exp_bits) - 1u) << frac_bits;
  const uint64_t biased = (u & kExpMask) >> 52;
  if (biased == 0x7FF) return (u & kFracMask) ? f.nan_bits : (sign | exp_all_ones);
  if (biased == 0) return sign;  // zero (no representable value is a subnormal double)
  const int exp = static_cast<int>(biased) - 1023;
  const uint64_t sig = (u & kFracMask) | (1ull << 52);
  if (exp >= f.min_normal_exp) {
    const uint32_t field = static_cast<uint32_t>(exp + f.max_exp) << frac_bits;
    return sign | field | static_cast<uint32_t>((sig >> (52 - frac_bits)) & ((1ull << frac_bits) - 1));
  }
  // Subnormal in f: exponent field 0, significand shifted by the missing range.
  return sign | static_cast<uint32_t>(sig >> (52 - frac_bits + (f.min_normal_exp - exp)));
}

}  // namespace carbon
