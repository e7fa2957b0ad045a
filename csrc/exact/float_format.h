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

// The supported formats, as compile-time tags: kernels are specialized per
// format so that its shifts and masks become constants.
enum class FormatId { kFloat32, kBFloat16, kFloat16 };

template <FormatId kId>
struct Format;
template <>
struct Format<FormatId::kFloat32> {
  using Bits = uint32_t;
  static constexpr CARBON_HD FloatFormat get() { return {24, -126, 127, 32, 0x7FC00000u}; }
};
template <>
struct Format<FormatId::kBFloat16> {
  using Bits = uint16_t;
  static constexpr CARBON_HD FloatFormat get() { return {8, -126, 127, 16, 0x7FC0u}; }
};
template <>
struct Format<FormatId::kFloat16> {
  using Bits = uint16_t;
  static constexpr CARBON_HD FloatFormat get() { return {11, -14, 15, 16, 0x7E00u}; }
};

// Calls fn(Format<id>{}) for a format known only at run time (host side).
template <typename Fn>
void with_format(FormatId id, Fn&& fn) {
  switch (id) {
    case FormatId::kFloat32:
      return fn(Format<FormatId::kFloat32>{});
    case FormatId::kBFloat16:
      return fn(Format<FormatId::kBFloat16>{});
    case FormatId::kFloat16:
      return fn(Format<FormatId::kFloat16>{});
  }
}

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

// Bit patterns (magnitudes) of the doubles 2^min_normal_exp and
// 2^(max_exp + 1): a positive double is in f's normal range exactly when its
// bits lie in [normal_min_bits, overflow_bits). Positive doubles order like
// their bit patterns, so range checks are integer comparisons.
CARBON_HD uint64_t normal_min_bits(const FloatFormat& f) {
  return static_cast<uint64_t>(f.min_normal_exp + 1023) << 52;
}
CARBON_HD uint64_t overflow_bits(const FloatFormat& f) {
  return static_cast<uint64_t>(f.max_exp + 1024) << 52;
}

// RN_f of a positive double given by its bits `mag`, which must lie in f's
// normal range. Adding half an ulp minus one, plus the last kept bit, and
// truncating is round-half-even; a carry out of the significand bumps the
// exponent, so the result is >= overflow_bits(f) exactly when it overflows.
// Branch-free, so loops over it vectorize.
CARBON_HD uint64_t round_normal_bits(uint64_t mag, const FloatFormat& f) {
  const int drop = 53 - f.precision;
  return (mag + ((1ull << (drop - 1)) - 1) + ((mag >> drop) & 1)) & ~((1ull << drop) - 1);
}

// Bits in format f of the positive double `mag` (bits), which must be
// exactly representable in f and in its normal range.
CARBON_HD uint32_t encode_normal(uint64_t mag, const FloatFormat& f) {
  const uint64_t rebias = static_cast<uint64_t>(1023 - f.max_exp) << (f.precision - 1);
  return static_cast<uint32_t>((mag >> (53 - f.precision)) - rebias);
}

// The canonical NaN as a double: positive, quiet bit only. encode() turns
// it into every format's canonical NaN (contract §1); kernels return it
// wherever a NaN result's sign or payload would otherwise depend on the
// hardware.
CARBON_HD double canonical_nan() { return bits_to_double(kExpMask | (1ull << 51)); }

// RN_f(x) for any double x, returned as a double exactly representable in f.
CARBON_HD double round_double(double x, const FloatFormat& f) {
  const uint64_t u = double_to_bits(x);
  const uint64_t mag = u & ~kSignBit;
  if (mag >= normal_min_bits(f) && mag < overflow_bits(f)) {
    const uint64_t rounded = round_normal_bits(mag, f);
    return bits_to_double((u & kSignBit) | (rounded < overflow_bits(f) ? rounded : kExpMask));
  }
  const uint64_t biased = (u & kExpMask) >> 52;
  const uint64_t frac = u & kFracMask;
  if (biased == 0x7FF) return x;  // inf or NaN
  if (biased == 0 && frac == 0) return x;  // signed zero
  const uint64_t mant = biased ? (frac | (1ull << 52)) : frac;
  const int lsb_exp = (biased ? static_cast<int>(biased) : 1) - 1075;
  return round_magnitude(mant, lsb_exp, false, (u & kSignBit) != 0, f);
}

// The value of the bits `bits` of format f, as a double (always exact). Integer
// operations only, so subnormal inputs are read correctly whatever the
// CPU's denormals-are-zero setting.
CARBON_HD double decode(uint32_t bits, const FloatFormat& f) {
  const int frac_bits = f.precision - 1;
  const int exp_bits = f.total_bits - f.precision;
  const uint64_t sign = ((bits >> (f.total_bits - 1)) & 1u) ? kSignBit : 0;
  const uint32_t field = (bits >> frac_bits) & ((1u << exp_bits) - 1u);
  const uint64_t frac = bits & ((1u << frac_bits) - 1u);
  if (field == (1u << exp_bits) - 1u) return bits_to_double(frac ? (kExpMask | (1ull << 51)) : (sign | kExpMask));
  if (field == 0) {
    if (frac == 0) return bits_to_double(sign);
    const int t = top_bit(frac);  // subnormal: frac * 2^quantum_exp, normalized
    const uint64_t exp = static_cast<uint64_t>(quantum_exp(f) + t + 1023);
    return bits_to_double(sign | (exp << 52) | ((frac << (52 - t)) & kFracMask));
  }
  const uint64_t exp = static_cast<uint64_t>(static_cast<int>(field) - f.max_exp + 1023);
  return bits_to_double(sign | (exp << 52) | (frac << (52 - frac_bits)));
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
  if ((u & ~kSignBit) >= normal_min_bits(f)) return sign | encode_normal(u & ~kSignBit, f);
  const int exp = static_cast<int>(biased) - 1023;
  const uint64_t sig = (u & kFracMask) | (1ull << 52);
  // Subnormal in f: exponent field 0, significand shifted by the missing range.
  return sign | static_cast<uint32_t>(sig >> (52 - frac_bits + (f.min_normal_exp - exp)));
}

// Branch-free fast paths for loops that should vectorize. Each is exact for
// values in f's normal range and tells whether its input was in it; for any
// other value the caller falls back on decode / round_double + encode, which
// handle everything (and give the same bits on the normal range).
CARBON_HD uint32_t is_normal_bits(uint32_t bits, const FloatFormat& f) {
  const int frac_bits = f.precision - 1;
  const int exp_bits = f.total_bits - f.precision;
  const uint32_t field = (bits >> frac_bits) & ((1u << exp_bits) - 1u);
  return (field - 1u < (1u << exp_bits) - 2u) ? 1u : 0u;
}

// decode(bits, f) for a normal number of f.
CARBON_HD double decode_normal(uint32_t bits, const FloatFormat& f) {
  const int frac_bits = f.precision - 1;
  const int exp_bits = f.total_bits - f.precision;
  const uint64_t sign = static_cast<uint64_t>((bits >> (f.total_bits - 1)) & 1u) << 63;
  const uint64_t field = (bits >> frac_bits) & ((1u << exp_bits) - 1u);
  const uint64_t frac = bits & ((1u << frac_bits) - 1u);
  return bits_to_double(sign | ((field + static_cast<uint64_t>(1023 - f.max_exp)) << 52) | (frac << (52 - frac_bits)));
}

// 1 when RN_f of the positive double with bits `mag` is a normal number of f
// (not subnormal, zero, overflow, inf or NaN), else 0 -- decided from mag
// alone, with one unsigned compare. Let h = 2^(52 - precision), half an ulp
// of f in bits. round_normal_bits(mag) < overflow_bits exactly when
// mag < overflow_bits - h: below that, mag + h - 1 + (last kept bit) stays
// under the (aligned) overflow_bits; at overflow_bits - h the last kept bit
// is 1 (f's largest significand is all ones), so that tie rounds up to
// overflow, as does everything above. And mag < normal_min_bits wraps
// mag - normal_min_bits around to a huge value.
CARBON_HD uint32_t rounds_to_normal(uint64_t mag, const FloatFormat& f) {
  const uint64_t half = 1ull << (52 - f.precision);
  return static_cast<uint32_t>(mag - normal_min_bits(f) < overflow_bits(f) - half - normal_min_bits(f));
}

// The sign of x and the bits of the magnitude RN_f(|x|) (as a double's
// bits) when that result is a normal number of f; *ok = 1 then, else 0
// (subnormal or zero result, overflow, inf, NaN).
CARBON_HD uint64_t round_normal_signed_bits(double x, const FloatFormat& f, uint32_t* ok) {
  const uint64_t u = double_to_bits(x);
  const uint64_t mag = u & ~kSignBit;
  *ok = rounds_to_normal(mag, f);
  return (u & kSignBit) | round_normal_bits(mag, f);
}

// encode(round_double(v, f), f) when that result is a normal number of f;
// *ok = 1 then, else 0 (subnormal or zero result, overflow, inf, NaN).
CARBON_HD uint32_t round_encode_normal(double v, const FloatFormat& f, uint32_t* ok) {
  const uint64_t r = round_normal_signed_bits(v, f, ok);
  const uint32_t sign = static_cast<uint32_t>(r >> 63) << (f.total_bits - 1);
  return sign | encode_normal(r & ~kSignBit, f);
}

// encode(round_double(v, f), f), branch-free so that loops over it vectorize,
// for every v except NaN and values whose rounding is subnormal in f (or
// reaches the smallest normal from below); for those *ok = 0 and the caller
// redoes the loop with round_double + encode. Covered:
//  * |v| in f's normal range: round_normal_bits; a result >= 2^(max_exp+1)
//    is an overflow, +-inf (RN rounds every such value to infinity);
//  * |v| = inf: round_normal_bits leaves the bits of inf unchanged (the
//    added carry stays below the dropped bits, which are zero), so it is the
//    overflow case above;
//  * |v| <= 2^(quantum_exp - 1), half the smallest subnormal of f: RN gives
//    a zero of v's sign (exactly half is a tie, and the even neighbour is 0).
// (Masked softmax entries, e = 0 and log_softmax = -inf, take this path.)
// (Callers AND *ok into a flag of the loop: with a reference to that flag
// GCC does not vectorize the loop.)
template <typename F>
CARBON_HD typename F::Bits round_encode_fast(double v, uint32_t* ok) {
  constexpr FloatFormat f = F::get();
  const uint64_t u = double_to_bits(v), mag = u & ~kSignBit;
  const uint64_t rounded = round_normal_bits(mag, f);
  const uint64_t tiny = static_cast<uint64_t>(quantum_exp(f) - 1 + 1023) << 52;  // 2^(quantum_exp - 1)
  const bool zero = mag <= tiny;
  const bool big = (mag >= normal_min_bits(f)) & (mag <= kExpMask);  // normal range or beyond, not NaN
  const uint32_t sign = static_cast<uint32_t>(u >> 63) << (f.total_bits - 1);
  const uint32_t inf = ((1u << (f.total_bits - f.precision)) - 1u) << (f.precision - 1);
  const uint32_t magbits = rounded >= overflow_bits(f) ? inf : encode_normal(rounded, f);
  *ok = (zero | big) ? 1u : 0u;
  return static_cast<typename F::Bits>(sign | (zero ? 0u : magbits));
}

// The same pair for loops where exact zeros are common (optimizer states of
// unused rows, zero gradients): zero is also accepted, keeping its sign.
// round_normal_or_zero(x, f, &ok) == round_double(x, f) whenever ok == 1.
CARBON_HD double round_normal_or_zero(double x, const FloatFormat& f, uint32_t* ok) {
  uint32_t normal;
  const uint64_t r = round_normal_signed_bits(x, f, &normal);  // rounds +-0 to +-0
  *ok = normal | static_cast<uint32_t>((double_to_bits(x) & ~kSignBit) == 0);
  return bits_to_double(r);
}
// encode(v, f) for v zero or a normal number of f (as round_normal_or_zero
// returns with ok == 1).
CARBON_HD uint32_t encode_normal_or_zero(double v, const FloatFormat& f) {
  const uint64_t u = double_to_bits(v);
  const uint64_t mag = u & ~kSignBit;
  const uint32_t sign = static_cast<uint32_t>(u >> 63) << (f.total_bits - 1);
  return sign | (mag == 0 ? 0u : encode_normal(mag, f));
}

}  // namespace carbon
