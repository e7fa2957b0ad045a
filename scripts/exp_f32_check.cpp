// Exhaustive proof that exp_f32_core gives the float32 EXP's bits:
// RN32(exp_f32_core(d)) == RN32(exp_core(d)) for every float32 bit pattern d
// (csrc/elementwise/elementwise_math.h). Built and run by
// scripts/exp_f32_check.py.
//
// The inputs go through in blocks, and exp_f32_core runs in a loop of its own
// over each block, as in the kernels (the loop vectorizes at -O3). Per
// pattern: the two doubles are compared bit for bit; where they differ (only
// outside [-104, 89], see the comment at exp_f32_core) both are rounded by
// carbon's round_double + encode (the kernels' rounding) and the float32
// bits compared. NaN inputs must return NaN from both (the rounding maps
// every NaN to the same bits).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "elementwise/elementwise_math.h"
#include "exact/float_format.h"

using namespace carbon;

namespace {

constexpr int64_t kBlock = 1 << 16;

uint32_t rn32_bits(double v) {
  constexpr FloatFormat f32 = Format<FormatId::kFloat32>::get();
  return static_cast<uint32_t>(encode(round_double(v, f32), f32));
}

struct Counts {
  uint64_t checked = 0, same_double = 0, same_rounded = 0, mismatches = 0;
  uint32_t first_mismatch = 0;
};

// exp_f32_core over a block, in a loop of its own (vectorized like the kernels').
__attribute__((noinline)) void exp_f32_block(const float* d, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = math::exp_f32_core(d[i]);
}

void check_block(uint64_t first, Counts& c, float* d, double* fast) {
  for (int64_t i = 0; i < kBlock; ++i) {
    const uint32_t bits = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    std::memcpy(&d[i], &bits, 4);
  }
  exp_f32_block(d, fast, kBlock);
  for (int64_t i = 0; i < kBlock; ++i) {
    const double ref = math::exp_core(static_cast<double>(d[i]));
    c.checked++;
    if (double_to_bits(ref) == double_to_bits(fast[i])) {
      c.same_double++;
      continue;
    }
    if (rn32_bits(ref) == rn32_bits(fast[i])) {
      c.same_rounded++;
      continue;
    }
    const uint32_t bits = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    if (c.mismatches == 0 || bits < c.first_mismatch) c.first_mismatch = bits;
    c.mismatches++;
  }
}

}  // namespace

int main() {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int64_t kBlocks = (int64_t{1} << 32) / kBlock;
  Counts total;
#pragma omp parallel
  {
    Counts local;
    std::vector<float> d(kBlock);
    std::vector<double> fast(kBlock);
#pragma omp for schedule(dynamic, 16)
    for (int64_t b = 0; b < kBlocks; ++b) check_block(static_cast<uint64_t>(b) * kBlock, local, d.data(), fast.data());
#pragma omp critical
    {
      if (local.mismatches && (!total.mismatches || local.first_mismatch < total.first_mismatch))
        total.first_mismatch = local.first_mismatch;
      total.checked += local.checked;
      total.same_double += local.same_double;
      total.same_rounded += local.same_rounded;
      total.mismatches += local.mismatches;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("checked %llu float32 bit patterns in %.1f s\n", static_cast<unsigned long long>(total.checked), secs);
  std::printf("  identical doubles:                    %llu\n", static_cast<unsigned long long>(total.same_double));
  std::printf("  different doubles, same float32 bits: %llu\n", static_cast<unsigned long long>(total.same_rounded));
  std::printf("  MISMATCHES (float32 bits differ):     %llu\n", static_cast<unsigned long long>(total.mismatches));
  if (total.mismatches) {
    float x;
    std::memcpy(&x, &total.first_mismatch, 4);
    std::printf("  first mismatch: d = %.9g (0x%08x)\n", static_cast<double>(x), total.first_mismatch);
  }
  return total.mismatches == 0 && total.checked == (uint64_t{1} << 32) ? 0 : 1;
}
