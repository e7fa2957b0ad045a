// Carbon's counter-based random numbers (docs/contract.md §10), written once
// for the host (g++) and the device (nvcc): Philox4x32-10 and the per-block
// draws of every distribution. A value depends only on (seed, offset,
// element index), never on the device, the thread count or the launch grid.
//
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), as in Random123: counter (c0, c1, c2, c3), key
// (k0, k1); ten rounds
//   (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
// with the key bumped by the Weyl constants (k0 += W0, k1 += W1) between rounds.
//
// Carbon's use: key = the 64-bit seed (k0 low word, k1 high word); counter =
// (block index low, block index high, offset low, offset high).
#pragma once

#include <cmath>  // sqrt (IEEE: correctly rounded on host and device)

#include "../elementwise/elementwise_math.h"
#include "../exact/float_format.h"

namespace carbon {
namespace random {

struct Block {
  uint32_t w[4];
};

CARBON_HD uint32_t philox_m0() { return 0xD2511F53u; }
CARBON_HD uint32_t philox_m1() { return 0xCD9E8D57u; }
CARBON_HD uint32_t philox_w0() { return 0x9E3779B9u; }
CARBON_HD uint32_t philox_w1() { return 0xBB67AE85u; }

// Philox4x32-10 of counter (c0..c3) under key (k0, k1).
CARBON_HD Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += philox_w0();
      k1 += philox_w1();
    }
    const uint64_t p0 = static_cast<uint64_t>(philox_m0()) * c0;
    const uint64_t p1 = static_cast<uint64_t>(philox_m1()) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return Block{{c0, c1, c2, c3}};
}

// Block `block` of the draw at (seed, offset).
CARBON_HD Block draw_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// u = (w >> 8) 2^-24 in [0, 1): exact in float32 and double.
CARBON_HD double uniform01(uint32_t w) { return static_cast<double>(w >> 8) * 0x1p-24; }

// Box-Muller from two words: u1 = ((w0 >> 8) + 1) 2^-24 in (0, 1],
// u2 = (w1 >> 8) 2^-24 in [0, 1); z = sqrt(-2 log u1) cos(2 pi u2) in binary64
// (log_core and cos2pi_core of elementwise_math.h, IEEE sqrt; -2 log u1 is an
// exact doubling). Relative error of z below 2^-47 (the reduction of cos2pi
// is exact, so this holds near its zeros too).
CARBON_HD double normal01(uint32_t w0, uint32_t w1) {
  const double u1 = static_cast<double>((w0 >> 8) + 1u) * 0x1p-24;
  const double u2 = uniform01(w1);
  const double r = sqrt(-2.0 * math::log_core(u1));
  return r * math::cos2pi_core(u2);
}

// ---- per-block work, shared by the CPU loops and the CUDA kernels ----------
// Each writes the elements of its block that are < n (format F, as bits).

// uniform: element i is word i % 4 of block i / 4; RN_F(low + (high - low) u).
template <typename F>
CARBON_HD void uniform_block(uint64_t seed, uint64_t offset, uint64_t block, int64_t n, double low, double high,
                             typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const Block b = draw_block(seed, offset, block);
  const int64_t first = static_cast<int64_t>(block) * 4;
  const double width = high - low;
  for (int k = 0; k < 4; ++k)
    if (first + k < n) out[first + k] = static_cast<typename F::Bits>(encode(round_double(low + width * uniform01(b.w[k]), f), f));
}

// normal: element i uses words 2(i % 2), 2(i % 2) + 1 of block i / 2;
// RN_F(mean + std z).
template <typename F>
CARBON_HD void normal_block(uint64_t seed, uint64_t offset, uint64_t block, int64_t n, double mean, double std,
                            typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const Block b = draw_block(seed, offset, block);
  const int64_t first = static_cast<int64_t>(block) * 2;
  for (int k = 0; k < 2; ++k)
    if (first + k < n)
      out[first + k] = static_cast<typename F::Bits>(encode(round_double(mean + std * normal01(b.w[2 * k], b.w[2 * k + 1]), f), f));
}

// Attempts of trunc_normal per element before it falls back to clamping.
CARBON_HD int trunc_normal_attempts() { return 64; }

// trunc_normal, element i: attempt j = 0, 1, ... uses words 0 and 1 of block
// i * 64 + j: v = mean + std z; the first v with a <= v <= b is taken; after 64
// rejections the last v clamped to [a, b]. RN_F(v).
template <typename F>
CARBON_HD typename F::Bits trunc_normal_one(uint64_t seed, uint64_t offset, uint64_t i, double mean, double std,
                                            double a, double b) {
  constexpr FloatFormat f = F::get();
  double v = 0.0;
  for (int j = 0; j < trunc_normal_attempts(); ++j) {
    const Block blk = draw_block(seed, offset, i * static_cast<uint64_t>(trunc_normal_attempts()) + j);
    v = mean + std * normal01(blk.w[0], blk.w[1]);
    if (a <= v && v <= b) return static_cast<typename F::Bits>(encode(round_double(v, f), f));
  }
  v = v < a ? a : (v > b ? b : v);
  return static_cast<typename F::Bits>(encode(round_double(v, f), f));
}

// bernoulli: element i is 1 iff u_i < p_i (u_i as for uniform; p_i the
// probability of element i, or the scalar p when `scalar` is set).
template <typename F>
CARBON_HD void bernoulli_block(uint64_t seed, uint64_t offset, uint64_t block, int64_t n,
                               const typename F::Bits* probs, bool scalar, double p, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const Block b = draw_block(seed, offset, block);
  const int64_t first = static_cast<int64_t>(block) * 4;
  const auto one = static_cast<typename F::Bits>(encode(1.0, f));
  for (int k = 0; k < 4; ++k) {
    if (first + k < n) {
      const double pk = scalar ? p : decode(probs[first + k], f);
      out[first + k] = uniform01(b.w[k]) < pk ? one : typename F::Bits{0};
    }
  }
}

// dropout (also its backward, applied to the gradient): element i is kept iff
// u_i >= p; kept: RN_F(x_i / (1 - p)), dropped: +0.
template <typename F>
CARBON_HD void dropout_block(uint64_t seed, uint64_t offset, uint64_t block, int64_t n, const typename F::Bits* x,
                             double p, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const Block b = draw_block(seed, offset, block);
  const int64_t first = static_cast<int64_t>(block) * 4;
  const double keep_scale = 1.0 - p;
  for (int k = 0; k < 4; ++k) {
    if (first + k < n) {
      const bool keep = uniform01(b.w[k]) >= p;
      out[first + k] = keep ? static_cast<typename F::Bits>(encode(round_double(decode(x[first + k], f) / keep_scale, f), f))
                            : typename F::Bits{0};
    }
  }
}

}  // namespace random
}  // namespace carbon
