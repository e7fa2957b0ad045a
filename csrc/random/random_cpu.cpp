// The CPU kernels of the random ops (docs/contract.md §10): the per-block
// definitions of philox.h (uniform_block, normal_block, bernoulli_block,
// dropout_block, trunc_normal_one), computed a chunk of kChunkBlocks
// consecutive blocks at a time in loops that gcc vectorizes:
//   1. Philox4x32-10 of the chunk's counters, one counter per SIMD lane;
//   2. each element's value from its words, in binary64, with the same IEEE
//      operations as the definition (the log_core / cos2pi_core / sqrt of
//      normal01 in loops of their own);
//   3. branch-free rounding into the output format, exact for every value
//      whose rounding is zero or normal (or overflows); when some element of
//      the chunk falls outside that, the chunk is redone with the definition
//      itself (random_item).
// trunc_normal does its elements' first attempts so, and redoes the rejected
// elements with the definition.
// The chunks are fixed (chunk c holds blocks [c kChunkBlocks, (c + 1)
// kChunkBlocks), or trunc_normal's elements [c kChunkBlocks, ...));
// at::parallel_for only hands them out, so element i's bits depend on
// (seed, offset, i) alone, never on the thread count.
#include <ATen/Parallel.h>

#include <cmath>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "random.h"

namespace carbon {
namespace random {
namespace {

// The loops are compiled three times: x86-64-v4 (AVX-512: eight doubles or
// sixteen words per instruction), x86-64-v3 (AVX2 + FMA, so the cores' fma is
// one instruction) and any x86-64. All perform the same IEEE operations.
// Indices are int64_t: the build's -fwrapv makes an int index's 4 j wrap, so
// gcc finds no affine access and vectorizes nothing.
#define CARBON_RANDOM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// Blocks per chunk: 1024 uniform or 512 normal values, whose scratch stays
// in L1. A power of two below 2^32, so a chunk's block indices share their
// high word and their low words do not wrap.
constexpr int kChunkBlocks = 256;

// Philox4x32-10 (philox4x32_10 of philox.h) of the counters (block, offset)
// for block = first + j stride, j in [0, count), under key seed;
// words[4 j + k] = word k of that block, as draw_block gives it. The lanes are
// independent counters, so the loop vectorizes. Each 32-bit word is held in
// a 64-bit lane (the high half zero), where the 32 x 32 -> 64-bit products
// are one vpmuludq: with 32-bit lanes gcc widens and narrows around each
// product (vpmullq, permutes), at twice the time.
CARBON_RANDOM_CLONES void philox_words(uint64_t seed, uint64_t offset, uint64_t first, uint64_t stride,
                                       int64_t count, uint32_t* __restrict__ words) {
  constexpr uint64_t kLow = 0xFFFFFFFFu;
  uint64_t k0[10], k1[10];
  k0[0] = seed & kLow;
  k1[0] = seed >> 32;
  for (int r = 1; r < 10; ++r) {
    k0[r] = (k0[r - 1] + philox_w0()) & kLow;
    k1[r] = (k1[r - 1] + philox_w1()) & kLow;
  }
  const uint64_t first_lo = first & kLow;  // + j stride stays below 2^32 (run_chunk)
  const uint64_t block_hi = first >> 32;
  const uint64_t offset_lo = offset & kLow;
  const uint64_t offset_hi = offset >> 32;
  for (int64_t j = 0; j < count; ++j) {
    uint64_t c0 = first_lo + static_cast<uint64_t>(j) * stride, c1 = block_hi, c2 = offset_lo, c3 = offset_hi;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = (c0 & kLow) * philox_m0();  // the masks tell gcc the operands are < 2^32
      const uint64_t p1 = (c2 & kLow) * philox_m1();
      c0 = (p1 >> 32) ^ c1 ^ k0[r];
      c1 = p1 & kLow;
      c2 = (p0 >> 32) ^ c3 ^ k1[r];
      c3 = p0 & kLow;
    }
    words[4 * j + 0] = static_cast<uint32_t>(c0);
    words[4 * j + 1] = static_cast<uint32_t>(c1);
    words[4 * j + 2] = static_cast<uint32_t>(c2);
    words[4 * j + 3] = static_cast<uint32_t>(c3);
  }
}

// decode(bits, f) for every bits, branch-free (selects only): a subnormal is
// its significand times 2^quantum_exp (exact: a power of two times an integer
// below 2^23, a normal double), NaN the canonical quiet NaN that decode gives.
template <typename F>
inline double decode_any(typename F::Bits bits) {
  constexpr FloatFormat f = F::get();
  constexpr int frac_bits = f.precision - 1;
  constexpr uint32_t field_max = (1u << (f.total_bits - f.precision)) - 1u;
  const uint32_t b = bits;
  const uint64_t sign = static_cast<uint64_t>((b >> (f.total_bits - 1)) & 1u) << 63;
  const uint32_t field = (b >> frac_bits) & field_max;
  const uint32_t frac = b & ((1u << frac_bits) - 1u);
  const double normal = bits_to_double(sign | (static_cast<uint64_t>(field + (1023 - f.max_exp)) << 52) |
                                       (static_cast<uint64_t>(frac) << (52 - frac_bits)));
  const double sub = bits_to_double(
      double_to_bits(static_cast<double>(static_cast<int32_t>(frac)) * math::pow2(quantum_exp(f))) | sign);
  const double special = bits_to_double(frac ? (kExpMask | (1ull << 51)) : (sign | kExpMask));
  return field == 0 ? sub : (field == field_max ? special : normal);
}

// uniform01 of philox.h, with the shifted word converted as a signed int
// (it is below 2^24), which every target converts in one instruction.
inline double uniform_of(uint32_t w) { return static_cast<double>(static_cast<int32_t>(w >> 8)) * 0x1p-24; }

// ---- step 2 and 3 of each distribution, on one chunk -----------------------
// `words` as philox_words gives them; `count` elements from the chunk's first.
// Each returns 1 when every element took the fast rounding, else 0.

template <typename F>
CARBON_RANDOM_CLONES uint32_t uniform_values(const uint32_t* __restrict__ words, int64_t count, double low, double high,
                                             typename F::Bits* __restrict__ out) {
  const double width = high - low;
  uint32_t all_ok = 1;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t ok;
    out[i] = round_encode_fast<F>(low + width * uniform_of(words[i]), &ok);
    all_ok &= ok;
  }
  return all_ok;
}

// normal01 of philox.h for element l of the chunk from words (w0, w1) =
// (words[kStep l], words[kStep l + 1]) (normal: kStep = 2, the two halves of
// a block; trunc_normal: kStep = 4, words 0 and 1): the radius
// sqrt(-2 log u1), the angle's cos 2 pi u2, then their product, each in a
// loop of its own.
template <int kStep>
CARBON_RANDOM_CLONES void normal_radii(const uint32_t* __restrict__ words, int64_t count, double* __restrict__ radius) {
  for (int64_t l = 0; l < count; ++l) {
    const double u1 = static_cast<double>(static_cast<int32_t>((words[kStep * l] >> 8) + 1u)) * 0x1p-24;
    radius[l] = sqrt(-2.0 * math::log_core(u1));
  }
}

// cos2pi_core(u) of elementwise_math.h, as the same operations on the same
// values: its exact reduction of u to g in [0, 1/2], then sin_half_pi(g) or
// cos_half_pi(g), negated for q = 1, 2. gcc does not if-convert the core's
// choice between the two polynomial calls, so a loop over cos2pi_core stays
// scalar; here both polynomials are evaluated and one is selected.
template <int kStep>
CARBON_RANDOM_CLONES void normal_cosines(const uint32_t* __restrict__ words, int64_t count,
                                         double* __restrict__ cosine) {
  for (int64_t l = 0; l < count; ++l) {
    const double t = uniform_of(words[kStep * l + 1]) * 4.0;
    const int q = static_cast<int>(t);
    const double f = t - static_cast<double>(q);
    const int flip = f > 0.5 ? 1 : 0;
    const double g = flip ? 1.0 - f : f;
    const double s = math::sin_half_pi(g), c = math::cos_half_pi(g);
    const double v = ((q & 1) ^ flip) ? s : c;  // int, not bool: gcc vectorizes no 1-bit arithmetic
    cosine[l] = (q == 1 || q == 2) ? -v : v;
  }
}

template <typename F>
CARBON_RANDOM_CLONES uint32_t normal_values(const double* __restrict__ radius, const double* __restrict__ cosine,
                                            int64_t count, double mean, double std,
                                            typename F::Bits* __restrict__ out) {
  uint32_t all_ok = 1;
  for (int64_t l = 0; l < count; ++l) {
    uint32_t ok;
    out[l] = round_encode_fast<F>(mean + std * (radius[l] * cosine[l]), &ok);
    all_ok &= ok;
  }
  return all_ok;
}

// trunc_normal: attempt 0 of each element (trunc_normal_one of philox.h);
// redo[l] = 1 where it was rejected (or rounds outside the fast path): those
// elements are redone with the definition.
template <typename F>
CARBON_RANDOM_CLONES void trunc_normal_first_values(const double* __restrict__ radius,
                                                    const double* __restrict__ cosine, int64_t count, double mean,
                                                    double std, double a, double b, uint32_t* __restrict__ redo,
                                                    typename F::Bits* __restrict__ out) {
  for (int64_t l = 0; l < count; ++l) {
    uint32_t ok;
    const double v = mean + std * (radius[l] * cosine[l]);
    out[l] = round_encode_fast<F>(v, &ok);
    redo[l] = (a <= v && v <= b) ? ok ^ 1u : 1u;
  }
}

template <typename F>
CARBON_RANDOM_CLONES void bernoulli_scalar_values(const uint32_t* __restrict__ words, int64_t count, double p,
                                                  typename F::Bits* __restrict__ out) {
  const auto one = static_cast<typename F::Bits>(encode(1.0, F::get()));
  for (int64_t i = 0; i < count; ++i) out[i] = uniform_of(words[i]) < p ? one : typename F::Bits{0};
}

template <typename F>
CARBON_RANDOM_CLONES void bernoulli_tensor_values(const uint32_t* __restrict__ words, int64_t count,
                                                  const typename F::Bits* __restrict__ probs,
                                                  typename F::Bits* __restrict__ out) {
  const auto one = static_cast<typename F::Bits>(encode(1.0, F::get()));
  for (int64_t i = 0; i < count; ++i)
    out[i] = uniform_of(words[i]) < decode_any<F>(probs[i]) ? one : typename F::Bits{0};
}

template <typename F>
CARBON_RANDOM_CLONES uint32_t dropout_values(const uint32_t* __restrict__ words, int64_t count,
                                             const typename F::Bits* __restrict__ x, double p,
                                             typename F::Bits* __restrict__ out) {
  const double keep_scale = 1.0 - p;
  uint32_t all_ok = 1;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t ok;
    const typename F::Bits kept = round_encode_fast<F>(decode_any<F>(x[i]) / keep_scale, &ok);
    const bool keep = uniform_of(words[i]) >= p;
    out[i] = keep ? kept : typename F::Bits{0};
    all_ok &= keep ? ok : 1u;
  }
  return all_ok;
}

// ---- one chunk ------------------------------------------------------------------

// Elements per chunk, divided by kChunkBlocks: the values of a Philox block
// (trunc_normal: 1, a chunk holds kChunkBlocks elements).
constexpr int values_per_block(Kind kind) {
  return kind == Kind::kNormal ? 2 : (kind == Kind::kTruncNormal ? 1 : 4);
}

// trunc_normal's chunk c: elements i = 256 c + j, j < 256, whose attempt 0
// is block 64 i = 2^14 c + 64 j (64 = trunc_normal_attempts()). Their low
// words do not wrap: 2^14 c mod 2^32 is at most 2^32 - 2^14, and 64 j < 2^14.
template <typename F>
void run_trunc_normal_chunk(const Params& params, uint64_t seed, uint64_t offset, int64_t chunk, int64_t n,
                            typename F::Bits* out) {
  const int64_t first = chunk * kChunkBlocks;
  const int64_t count = std::min<int64_t>(n - first, kChunkBlocks);
  const uint64_t attempts = static_cast<uint64_t>(trunc_normal_attempts());
  alignas(64) uint32_t words[4 * kChunkBlocks];
  alignas(64) double radius[kChunkBlocks], cosine[kChunkBlocks];
  alignas(64) uint32_t redo[kChunkBlocks];
  philox_words(seed, offset, static_cast<uint64_t>(first) * attempts, attempts, count, words);
  normal_radii<4>(words, count, radius);
  normal_cosines<4>(words, count, cosine);
  trunc_normal_first_values<F>(radius, cosine, count, params.a, params.b, params.c, params.d, redo, out + first);
  for (int64_t l = 0; l < count; ++l)
    if (redo[l])
      random_item<Kind::kTruncNormal, F>(params, seed, offset, static_cast<uint64_t>(first + l), n, nullptr, out);
}

template <Kind kKind, typename F>
void run_chunk(const Params& params, uint64_t seed, uint64_t offset, int64_t chunk, int64_t n,
               const typename F::Bits* in, typename F::Bits* out) {
  constexpr int per_block = values_per_block(kKind);
  const uint64_t first_block = static_cast<uint64_t>(chunk) * kChunkBlocks;
  const int64_t first = static_cast<int64_t>(first_block) * per_block;
  const int64_t count = std::min<int64_t>(n - first, int64_t{kChunkBlocks} * per_block);
  const int64_t blocks = (count + per_block - 1) / per_block;
  alignas(64) uint32_t words[4 * kChunkBlocks];
  philox_words(seed, offset, first_block, 1, blocks, words);
  uint32_t all_ok = 1;
  if constexpr (kKind == Kind::kUniform) {
    all_ok = uniform_values<F>(words, count, params.a, params.b, out + first);
  } else if constexpr (kKind == Kind::kNormal) {
    alignas(64) double radius[2 * kChunkBlocks], cosine[2 * kChunkBlocks];
    normal_radii<2>(words, count, radius);
    normal_cosines<2>(words, count, cosine);
    all_ok = normal_values<F>(radius, cosine, count, params.a, params.b, out + first);
  } else if constexpr (kKind == Kind::kBernoulli) {
    if (params.scalar)
      bernoulli_scalar_values<F>(words, count, params.a, out + first);
    else
      bernoulli_tensor_values<F>(words, count, in + first, out + first);
  } else if constexpr (kKind == Kind::kDropout) {
    all_ok = dropout_values<F>(words, count, in + first, params.a, out + first);
  }
  if (!all_ok)  // some value rounds to a subnormal (or is NaN): the definition, block by block
    for (int64_t b = 0; b < blocks; ++b) random_item<kKind, F>(params, seed, offset, first_block + b, n, in, out);
}

}  // namespace

void random_cpu(const Params& params, const at::Tensor& in, at::Tensor& out) {
  const int64_t n = out.numel();
  const uint64_t seed = params.state.seed;
  const uint64_t offset = params.state.offset;
  with_format(format_of(out.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    const Bits* ip = in.defined() ? static_cast<const Bits*>(in.const_data_ptr()) : nullptr;
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    with_kind(params.kind, [&](auto kind_tag) {
      constexpr Kind kKind = decltype(kind_tag)::value;
      const int64_t per_chunk = int64_t{kChunkBlocks} * values_per_block(kKind);
      const int64_t chunks = (n + per_chunk - 1) / per_chunk;
      const int64_t grain = kKind == Kind::kTruncNormal ? 8 : (kKind == Kind::kNormal ? 4 : 16);
      carbon::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          if constexpr (kKind == Kind::kTruncNormal)
            run_trunc_normal_chunk<F>(params, seed, offset, c, n, op);
          else
            run_chunk<kKind, F>(params, seed, offset, c, n, ip, op);
        }
      });
    });
  });
}

}  // namespace random
}  // namespace carbon
