// The CPU's summation chains (chain_tree.h) as vectors: lane l of a Lanes
// value is chain l. GCC's vector extensions apply the written IEEE operation
// lane by lane (nothing is reassociated, and -ffp-contract=off forbids
// fusing), so lane l performs exactly the additions of the scalar chain l:
// element k into chain k mod kChains, the tail into chain 0 afterwards.
// Written out because the auto-vectorizer turned the scalar form of these
// loops into shuffles (and only partly vectorized the bfloat16 widening).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

#include "chain_tree.h"
#include "reduce_kernel.h"

namespace carbon {

typedef double Lanes __attribute__((vector_size(kChains * sizeof(double))));
typedef uint64_t LaneBits __attribute__((vector_size(kChains * sizeof(uint64_t))));
typedef int64_t LaneMask __attribute__((vector_size(kChains * sizeof(int64_t))));
typedef float FloatLanes __attribute__((vector_size(kChains * sizeof(float))));
typedef uint32_t WordLanes __attribute__((vector_size(kChains * sizeof(uint32_t))));
typedef uint16_t HalfWordLanes __attribute__((vector_size(kChains * sizeof(uint16_t))));

#define CARBON_LANES_INLINE inline __attribute__((always_inline))

CARBON_LANES_INLINE Lanes load_lanes(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

CARBON_LANES_INLINE void store_lanes(double* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

CARBON_LANES_INLINE Lanes abs_lanes(Lanes v) { return (Lanes)((LaneBits)v & ~kSignBit); }

// element_value of kChains consecutive elements (exact widenings).
template <typename T>
CARBON_LANES_INLINE Lanes decode_lanes(const T* p) {
  double v[kChains];
  for (int l = 0; l < kChains; ++l) v[l] = element_value(p[l]);
  return load_lanes(v);
}
template <>
CARBON_LANES_INLINE Lanes decode_lanes(const double* p) {
  return load_lanes(p);
}
template <>
CARBON_LANES_INLINE Lanes decode_lanes(const float* p) {
  FloatLanes f;
  std::memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, Lanes);
}
template <>
CARBON_LANES_INLINE Lanes decode_lanes(const c10::BFloat16* p) {  // the top halves of float32s
  HalfWordLanes h;
  std::memcpy(&h, p, sizeof h);
  const WordLanes bits = __builtin_convertvector(h, WordLanes) << 16;
  return __builtin_convertvector((FloatLanes)bits, Lanes);
}

}  // namespace carbon
