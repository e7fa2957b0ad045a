// Helpers that compile identically for the host (g++) and the device (nvcc).
// Everything in csrc/exact/ is written against these so that CPU and CUDA
// kernels perform the same integer and IEEE operations, hence the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CARBON_HD __host__ __device__ __forceinline__
#else
// Always inlined, so that formats known at compile time fold into constants.
#define CARBON_HD inline __attribute__((always_inline))
#endif

namespace carbon {

CARBON_HD uint64_t double_to_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

CARBON_HD double bits_to_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Count of leading zero bits; x must be nonzero.
CARBON_HD int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

// Index of the highest set bit; x must be nonzero.
CARBON_HD int top_bit(uint64_t x) { return 63 - clz64(x); }

constexpr uint64_t kSignBit = 0x8000000000000000ull;
constexpr uint64_t kExpMask = 0x7FF0000000000000ull;
constexpr uint64_t kFracMask = 0x000FFFFFFFFFFFFFull;

CARBON_HD bool is_nan(double x) {
  const uint64_t u = double_to_bits(x);
  return (u & kExpMask) == kExpMask && (u & kFracMask) != 0;
}
CARBON_HD bool is_inf(double x) { return (double_to_bits(x) & ~kSignBit) == kExpMask; }
CARBON_HD bool is_finite(double x) { return (double_to_bits(x) & kExpMask) != kExpMask; }
CARBON_HD bool sign_bit(double x) { return (double_to_bits(x) & kSignBit) != 0; }
CARBON_HD double abs_value(double x) { return bits_to_double(double_to_bits(x) & ~kSignBit); }

// Neighbours of a finite double towards -inf / +inf (x = 0 steps to the
// smallest subnormal of the right sign). Used to turn a round-to-nearest
// result into a strict lower / upper bound of the exact value.
CARBON_HD double next_down(double x) {
  const uint64_t u = double_to_bits(x);
  if ((u & ~kSignBit) == 0) return bits_to_double(kSignBit | 1);
  return bits_to_double((u & kSignBit) ? u + 1 : u - 1);
}
CARBON_HD double next_up(double x) {
  const uint64_t u = double_to_bits(x);
  if ((u & ~kSignBit) == 0) return bits_to_double(1);
  return bits_to_double((u & kSignBit) ? u - 1 : u + 1);
}

}  // namespace carbon
