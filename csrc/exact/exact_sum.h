// The exact accumulator: a long fixed-point number that holds any sum of
// products of float32 / bfloat16 / float16 values without rounding.
//
// Layout: kLimbs signed 64-bit limbs, limb i holding a 32-bit digit of weight
// 2^(kLowestBit + 32 i). A product of two such values is exact in double and,
// if nonzero, has magnitude in [2^-298, 2^256); as a double its 53-bit
// significand sits at bit positions >= -350 >= kLowestBit. It is added as
// three signed digit pieces without carrying. Each piece is below 2^32 in
// magnitude, so a limb absorbs 2^31 of them before an int64 could overflow:
// any sum of fewer than 2^31 terms is exact. Carries are resolved only when
// rounding.
//
// Integer addition is associative, so accumulators built by different
// threads, warps, blocks or processes merge exactly, in any order: the result
// cannot depend on how the work was split.
//
// Special values never enter the limbs; they are tracked in flags with IEEE
// semantics (NaN in -> NaN, inf*0 -> NaN, +inf + -inf -> NaN). The flags also
// record what the sign of an exact zero sum must be: -0 exactly when at least
// one term was added and every term was -0 (IEEE's rule for x + y, applied to
// the whole sum, which makes it independent of order).
#pragma once

#include "float_format.h"

namespace carbon {

constexpr int kLimbs = 20;
constexpr int kLowestBit = -352;  // weight of bit 0 of limb 0

enum ExactSumFlag : uint32_t {
  kSawNaN = 1u,
  kSawPosInf = 2u,
  kSawNegInf = 4u,
  kSawTerm = 8u,           // at least one term was added
  kSawNonNegZero = 16u,    // some term was not -0 (so an exact zero is +0)
};

CARBON_HD void exact_sum_clear(int64_t* limb, uint32_t& flags) {
  for (int i = 0; i < kLimbs; ++i) limb[i] = 0;
  flags = 0;
}

// Add one finite or non-finite double term. A finite nonzero term must be a
// multiple of 2^kLowestBit and below 2^287 (true for products of two values of
// the supported formats and for values of those formats themselves). A term of
// 2^276 or more starts in limb 18, where its third digit is 0: limb 20 does not
// exist, so that digit is not added.
CARBON_HD void exact_sum_add(int64_t* limb, uint32_t& flags, double term) {
  const uint64_t u = double_to_bits(term);
  const uint64_t biased = (u & kExpMask) >> 52;
  const uint64_t frac = u & kFracMask;
  flags |= kSawTerm;
  if (biased == 0x7FF) {
    flags |= frac ? kSawNaN : ((u & kSignBit) ? kSawNegInf : kSawPosInf);
    return;
  }
  if (u != kSignBit) flags |= kSawNonNegZero;
  if (biased == 0 && frac == 0) return;
  const uint64_t mant = biased ? (frac | (1ull << 52)) : frac;
  const int pos = (biased ? static_cast<int>(biased) : 1) - 1075 - kLowestBit;
  const int idx = pos >> 5;
  const int sh = pos & 31;
  const int64_t d0 = static_cast<int64_t>((mant << sh) & 0xFFFFFFFFull);
  const uint64_t rest = sh ? (mant >> (32 - sh)) : (mant >> 32);
  const int64_t d1 = static_cast<int64_t>(rest & 0xFFFFFFFFull);
  const int64_t d2 = static_cast<int64_t>(rest >> 32);
  const bool third = idx + 2 < kLimbs;
  if (u & kSignBit) {
    limb[idx] -= d0;
    limb[idx + 1] -= d1;
    if (third) limb[idx + 2] -= d2;
  } else {
    limb[idx] += d0;
    limb[idx + 1] += d1;
    if (third) limb[idx + 2] += d2;
  }
}

// Add the exact product a*b of two values of the supported formats (held in
// doubles). IEEE special cases are decided here, before multiplying.
CARBON_HD void exact_sum_add_product(int64_t* limb, uint32_t& flags, double a, double b) {
  if (is_nan(a) || is_nan(b)) {
    flags |= kSawNaN | kSawTerm;
    return;
  }
  if (is_inf(a) || is_inf(b)) {
    if (a == 0.0 || b == 0.0) {
      flags |= kSawNaN | kSawTerm;
      return;
    }
    flags |= ((sign_bit(a) != sign_bit(b)) ? kSawNegInf : kSawPosInf) | kSawTerm;
    return;
  }
  exact_sum_add(limb, flags, a * b);  // exact: at most 48 significant bits
}

// The special-value result of an accumulator, if its flags force one:
// writes NaN or +-inf to *out and returns true.
CARBON_HD bool exact_sum_special(uint32_t flags, double* out) {
  if ((flags & kSawNaN) || ((flags & kSawPosInf) && (flags & kSawNegInf))) {
    *out = bits_to_double(kExpMask | (1ull << 51));
    return true;
  }
  if (flags & (kSawPosInf | kSawNegInf)) {
    *out = bits_to_double(((flags & kSawNegInf) ? kSignBit : 0) | kExpMask);
    return true;
  }
  return false;
}

// The sign of an exact zero sum (contract: -0 iff some term and all -0).
CARBON_HD double exact_zero(uint32_t flags) {
  const bool neg_zero = (flags & kSawTerm) && !(flags & kSawNonNegZero);
  return neg_zero ? bits_to_double(kSignBit) : 0.0;
}

// Turns the limbs, in place, into the digits of |sum| (each in [0, 2^32);
// the value stays below 2^288 so the top limb is a digit too) and returns
// whether the sum is negative.
CARBON_HD bool exact_sum_to_magnitude(int64_t* limb) {
  // Propagate carries (arithmetic shift = floor division); the top limb
  // keeps the sign.
  for (int i = 0; i < kLimbs - 1; ++i) {
    const int64_t carry = limb[i] >> 32;
    limb[i] -= carry * (int64_t(1) << 32);
    limb[i + 1] += carry;
  }
  const bool negative = limb[kLimbs - 1] < 0;
  if (negative) {
    // Negate the whole number: negate every limb, then re-normalize.
    for (int i = 0; i < kLimbs; ++i) limb[i] = -limb[i];
    for (int i = 0; i < kLimbs - 1; ++i) {
      const int64_t carry = limb[i] >> 32;
      limb[i] -= carry * (int64_t(1) << 32);
      limb[i + 1] += carry;
    }
  }
  return negative;
}

// RN_f of the nonnegative number held in `digits` (radix 2^32, weight of
// digit 0 = 2^kLowestBit), plus a positive amount below the last digit when
// `sticky`, with the given sign. Returns false when the number is zero (and
// not sticky): the caller decides the zero's sign.
CARBON_HD bool round_digits(const int64_t* digits, bool sticky, bool negative, const FloatFormat& f,
                            double* out) {
  int h = kLimbs - 1;
  while (h >= 0 && digits[h] == 0) --h;
  if (h < 0) {
    if (!sticky) return false;
    *out = bits_to_double(negative ? kSignBit : 0);  // below 2^-352: rounds to a signed zero
    return true;
  }
  // A 64-bit window starting at the leading bit, plus a sticky bit for the rest.
  const uint64_t dh = static_cast<uint64_t>(digits[h]);
  const uint64_t d1 = h >= 1 ? static_cast<uint64_t>(digits[h - 1]) : 0;
  const uint64_t d2 = h >= 2 ? static_cast<uint64_t>(digits[h - 2]) : 0;
  const int t = top_bit(dh);  // 0..31
  const uint64_t window = (dh << (63 - t)) | (d1 << (31 - t)) | (d2 >> (t + 1));
  sticky = sticky || (d2 & ((1ull << (t + 1)) - 1)) != 0;
  for (int i = h - 3; i >= 0 && !sticky; --i) sticky = digits[i] != 0;
  const int lsb_exp = kLowestBit + 32 * (h - 2) + t + 1;
  *out = round_magnitude(window, lsb_exp, sticky, negative, f);
  return true;
}

// RN_f(sum). The limbs are normalized in place (their value is unchanged).
CARBON_HD double exact_sum_round(int64_t* limb, uint32_t flags, const FloatFormat& f) {
  double out;
  if (exact_sum_special(flags, &out)) return out;
  const bool negative = exact_sum_to_magnitude(limb);
  if (round_digits(limb, false, negative, f, &out)) return out;
  return exact_zero(flags);
}

// RN_f(sum / n) for 0 < n < 2^63: one rounding of the exact quotient. Long
// division by 32-bit digits: below 2^32 each step divides a number below
// n * 2^32, which fits in 64 bits; from 2^32 on (sum_divided's divisor is any
// int64) each digit is divided bit by bit (the top limb, a non-negative
// int64, by all its 63 bits), the remainder staying below n < 2^63, so
// 2 rem + 1 fits. A nonzero remainder is the sticky bit. The
// quotient keeps every bit down to 2^kLowestBit, far below any format's
// quantum (an element over n < 2^63 is at least 2^-212), so the rounding sees
// all the bits it needs. The limbs end up holding the quotient.
CARBON_HD double exact_sum_round_divided(int64_t* limb, uint32_t flags, uint64_t n, const FloatFormat& f) {
  double out;
  if (exact_sum_special(flags, &out)) return out;
  const bool negative = exact_sum_to_magnitude(limb);
  uint64_t rem = 0;
  if (n < (1ull << 32)) {
    for (int i = kLimbs - 1; i >= 0; --i) {
      const uint64_t cur = (rem << 32) | static_cast<uint64_t>(limb[i]);
      limb[i] = static_cast<int64_t>(cur / n);
      rem = cur % n;
    }
  } else {
    for (int i = kLimbs - 1; i >= 0; --i) {
      const uint64_t digit = static_cast<uint64_t>(limb[i]);  // the top limb may exceed 32 bits
      uint64_t q = 0;
      for (int b = i == kLimbs - 1 ? 62 : 31; b >= 0; --b) {
        rem = (rem << 1) | ((digit >> b) & 1u);
        q <<= 1;
        if (rem >= n) {
          rem -= n;
          q |= 1u;
        }
      }
      limb[i] = static_cast<int64_t>(q);
    }
  }
  if (round_digits(limb, rem != 0, negative, f, &out)) return out;
  return exact_zero(flags);
}

}  // namespace carbon
