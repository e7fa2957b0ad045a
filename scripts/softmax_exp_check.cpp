// Exhaustive proof that the softmax kernels' cheaper float32 EXPs give
// carbon.exp's bits: for every float32 bit pattern d that
// exp_f32_approx_decided decides, its bits equal RN32(exp_f32_core(d))
// (csrc/softmax/softmax_exp_cpu.h); likewise for every lane that
// exp16_table_round decides (csrc/softmax/softmax_exp_avx512.h, run when the
// CPU has AVX-512, as in the kernels), whose kNonPositive variant must give
// the same bits and decisions for every d <= 0 and NaN. Built and run by
// scripts/softmax_exp_check.py.
//
// The inputs go through in blocks; exp_f32_approx and the rounding run in
// loops of their own over each block, as in the kernels (they vectorize at
// -O3). Also reports how many patterns are undecided (the kernels use exp32
// for those) and the largest relative difference of the two doubles where
// both are normal.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <xmmintrin.h>

#include "exact/float_format.h"
#include "softmax/softmax_exp_avx512.h"
#include "softmax/softmax_exp_cpu.h"

using namespace carbon;

namespace {

constexpr int64_t kBlock = 1 << 16;

uint32_t rn32_bits(double v) {
  constexpr FloatFormat f32 = Format<FormatId::kFloat32>::get();
  return static_cast<uint32_t>(encode(round_double(v, f32), f32));
}

struct Counts {
  uint64_t checked = 0, decided = 0, undecided_main = 0, mismatches = 0;
  uint32_t first_mismatch = 0;
  double max_rel = 0;
  // exp16_table_round (AVX-512 CPUs only)
  uint64_t t_decided = 0, t_undecided_main = 0, t_mismatches = 0;
  uint32_t t_first_mismatch = 0;
  double t_max_rel = 0;
};

// exp16_table_round over a block, sixteen lanes at a time as in the kernels;
// decided[i] = 1 where the lane was decided. Also the doubles (for the
// error statistics): exp8_table of the clamped arguments.
CARBON_SOFTMAX_AVX512 __attribute__((noinline)) void table_block(const float* d, uint32_t* bits, uint64_t* decided,
                                                                double* c, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 di = _mm512_loadu_ps(d + i);
    const __mmask16 ok = exp16_table_round(di, 0xffff, reinterpret_cast<float*>(bits + i));
    for (int l = 0; l < 16; ++l) decided[i + l] = (ok >> l) & 1;
    // The forward's variant (kNonPositive) on the arguments <= 0 or NaN (the
    // others +0 here): the same bits and the same decisions.
    const __mmask16 nonpos = _mm512_cmp_ps_mask(di, _mm512_setzero_ps(), _CMP_NGT_UQ);
    float fwd[16];
    __m256 r0, r1;
    const __mmask16 ok_fwd =
        exp16_table_round<true>(_mm512_maskz_mov_ps(nonpos, di), 0xffff, fwd, &r0, &r1);
    for (int l = 0; l < 16; ++l) {
      uint32_t fb;
      std::memcpy(&fb, &fwd[l], 4);
      if (((nonpos >> l) & 1) && (fb != bits[i + l] || ((ok_fwd >> l) & 1) != ((ok >> l) & 1))) decided[i + l] = 2;
    }
    for (int h = 0; h < 2; ++h) {
      __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(d + i + 8 * h));
      x = _mm512_max_pd(_mm512_set1_pd(-110.0), x);
      x = _mm512_min_pd(_mm512_set1_pd(89.0), x);
      _mm512_storeu_pd(c + i + 8 * h, exp8_table(x));
    }
  }
}

__attribute__((noinline)) void approx_block(const float* d, double* c, uint32_t* bits, uint64_t* decided,
                                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) c[i] = exp_f32_approx(d[i]);
  for (int64_t i = 0; i < n; ++i) {
    const float r = round32_decided(c[i]);
    std::memcpy(&bits[i], &r, sizeof r);
    decided[i] = exp_f32_approx_decided(c[i]);
  }
}

void check_block(uint64_t first, Counts& k, float* d, double* c, uint32_t* bits, uint64_t* decided, bool avx512,
                 double* tc, uint32_t* tbits, uint64_t* tdecided) {
  for (int64_t i = 0; i < kBlock; ++i) {
    const uint32_t b = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    std::memcpy(&d[i], &b, 4);
  }
  approx_block(d, c, bits, decided, kBlock);
  if (avx512) table_block(d, tbits, tdecided, tc, kBlock);
  for (int64_t i = 0; i < kBlock; ++i) {
    k.checked++;
    const double core = math::exp_f32_core(static_cast<double>(d[i]));
    if (avx512) {
      if (core >= 0x1p-126 && core < 0x1p127) {
        const double rel = std::fabs(tc[i] - core) / core;
        if (rel > k.t_max_rel) k.t_max_rel = rel;
      }
      if (tdecided[i] == 2) {  // the kNonPositive variant differs
        if (k.t_mismatches == 0 || static_cast<uint32_t>(first + i) < k.t_first_mismatch)
          k.t_first_mismatch = static_cast<uint32_t>(first + i);
        k.t_mismatches++;
      } else if (!tdecided[i]) {
        if (d[i] >= -87.0f && d[i] <= 88.0f) k.t_undecided_main++;
      } else {
        k.t_decided++;
        if (tbits[i] != rn32_bits(core)) {
          const uint32_t b = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
          if (k.t_mismatches == 0 || b < k.t_first_mismatch) k.t_first_mismatch = b;
          k.t_mismatches++;
        }
      }
    }
    if (core >= 0x1p-126 && core < 0x1p127) {
      const double rel = std::fabs(c[i] - core) / core;
      if (rel > k.max_rel) k.max_rel = rel;
    }
    if (!decided[i]) {
      if (d[i] >= -87.0f && d[i] <= 88.0f) k.undecided_main++;
      continue;
    }
    k.decided++;
    if (bits[i] == rn32_bits(core)) continue;
    const uint32_t b = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    if (k.mismatches == 0 || b < k.first_mismatch) k.first_mismatch = b;
    k.mismatches++;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool ftz = argc > 1 && std::strcmp(argv[1], "--ftz") == 0;
  const bool avx512 = softmax_avx512_available();
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int64_t kBlocks = (int64_t{1} << 32) / kBlock;
  Counts total;
#pragma omp parallel
  {
    if (ftz) _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ in every thread
    Counts local;
    std::vector<float> d(kBlock);
    std::vector<double> c(kBlock);
    std::vector<uint32_t> bits(kBlock);
    std::vector<uint64_t> decided(kBlock);
    std::vector<double> tc(kBlock);
    std::vector<uint32_t> tbits(kBlock);
    std::vector<uint64_t> tdecided(kBlock);
#pragma omp for schedule(dynamic, 16)
    for (int64_t b = 0; b < kBlocks; ++b)
      check_block(static_cast<uint64_t>(b) * kBlock, local, d.data(), c.data(), bits.data(), decided.data(), avx512,
                  tc.data(), tbits.data(), tdecided.data());
#pragma omp critical
    {
      if (local.mismatches && (!total.mismatches || local.first_mismatch < total.first_mismatch))
        total.first_mismatch = local.first_mismatch;
      total.checked += local.checked;
      total.decided += local.decided;
      total.undecided_main += local.undecided_main;
      total.mismatches += local.mismatches;
      if (local.max_rel > total.max_rel) total.max_rel = local.max_rel;
      if (local.t_mismatches && (!total.t_mismatches || local.t_first_mismatch < total.t_first_mismatch))
        total.t_first_mismatch = local.t_first_mismatch;
      total.t_decided += local.t_decided;
      total.t_undecided_main += local.t_undecided_main;
      total.t_mismatches += local.t_mismatches;
      if (local.t_max_rel > total.t_max_rel) total.t_max_rel = local.t_max_rel;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("checked %llu float32 bit patterns in %.1f s\n", static_cast<unsigned long long>(total.checked), secs);
  std::printf("  decided by the rounding test:          %llu\n", static_cast<unsigned long long>(total.decided));
  std::printf("  undecided with d in [-87, 88]:          %llu\n", static_cast<unsigned long long>(total.undecided_main));
  std::printf("  max |approx - core| / core (normal):    2^%.2f\n", std::log2(total.max_rel));
  std::printf("  MISMATCHES (decided, float32 bits differ): %llu\n", static_cast<unsigned long long>(total.mismatches));
  if (total.mismatches) {
    float x;
    std::memcpy(&x, &total.first_mismatch, 4);
    std::printf("  first mismatch: d = %.9g (0x%08x)\n", static_cast<double>(x), total.first_mismatch);
  }
  if (avx512) {
    std::printf("exp16_table_round (AVX-512):\n");
    std::printf("  decided by the rounding test:          %llu\n", static_cast<unsigned long long>(total.t_decided));
    std::printf("  undecided with d in [-87, 88]:          %llu\n",
                static_cast<unsigned long long>(total.t_undecided_main));
    std::printf("  max |table - core| / core (normal):     2^%.2f\n", std::log2(total.t_max_rel));
    std::printf("  MISMATCHES (decided, float32 bits differ): %llu\n",
                static_cast<unsigned long long>(total.t_mismatches));
    if (total.t_mismatches) {
      float x;
      std::memcpy(&x, &total.t_first_mismatch, 4);
      std::printf("  first mismatch: d = %.9g (0x%08x)\n", static_cast<double>(x), total.t_first_mismatch);
    }
  } else {
    std::printf("exp16_table_round not checked: this CPU has no AVX-512\n");
  }
  return total.mismatches == 0 && total.t_mismatches == 0 && total.checked == (uint64_t{1} << 32) ? 0 : 1;
}
