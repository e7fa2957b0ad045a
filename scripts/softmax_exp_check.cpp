// Exhaustive proof that the softmax kernels' cheaper float32 EXPs give
// carbon.exp's bits: for every float32 bit pattern d that
// exp_f32_approx_decided decides, its bits equal RN32(exp_f32_core(d))
// (csrc/softmax/softmax_exp_cpu.h); likewise for every lane that
// exp16_table_round decides (csrc/softmax/softmax_exp_avx512.h, run when the
// CPU has AVX-512, as in the kernels), whose kNonPositive variant must give
// the same bits and decisions for every d <= 0 and NaN. On AVX2 CPUs, also
// exp_group8_tested's lighter test (csrc/softmax/softmax_exp_avx2.h): every
// pattern it passes (with and without its range test, the latter on
// d in [-87, 88] only, as the kernels call it) is one exp_f32_approx_decided
// decides, with the same float32 bits; and exp_group8_all_clamped holds only
// where RN32(exp_f32_core(d)) is +0 and the light test passes. Built and run
// by scripts/softmax_exp_check.py.
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
#include "softmax/softmax_exp_avx2.h"
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
  // exp_group8_tested / exp_group8_all_clamped (AVX2 CPUs)
  uint64_t l_passed = 0, l_passed_in_range = 0, l_failed_main = 0, l_clamped = 0, l_mismatches = 0;
  uint32_t l_first_mismatch = 0;
};

// Whether exp_group8_tested<kRange> passes eight arguments (the kernels'
// block test: no lane near a midpoint and, with kRange, none outside), with
// their float32 results in e.
template <bool kRange>
CARBON_SOFTMAX_AVX2 bool light_group(__m256 d, float* e) {
  __m256i near = _mm256_setzero_si256();
  __m256 outside = _mm256_setzero_ps();
  __m128 r0, r1;
  exp_group8_tested<kRange>(d, e, &near, &outside, &r0, &r1);
  return _mm256_testz_si256(near, near) && (!kRange || _mm256_testz_ps(outside, outside));
}

// Each pattern's own verdict: groups of eight consecutive patterns, and a
// group that fails is redone pattern by pattern, each broadcast to all eight
// lanes (lanes compute alike). pass[i] bit 0: exp_group8_tested<true>
// passes d[i]; bit 1: exp_group8_tested<false> passes it (d[i] in [-87, 88]
// only); bit 2: exp_group8_all_clamped holds. lbits / lbits_in: the results.
CARBON_SOFTMAX_AVX2 __attribute__((noinline)) void light_block(const float* d, uint32_t* lbits, uint32_t* lbits_in,
                                                              uint8_t* pass, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    for (int l = 0; l < 8; ++l) pass[i + l] = 0;
    if (light_group<true>(_mm256_loadu_ps(d + i), reinterpret_cast<float*>(lbits + i))) {
      for (int l = 0; l < 8; ++l) pass[i + l] |= 1;
    } else {
      for (int l = 0; l < 8; ++l) {
        float e[8];
        if (light_group<true>(_mm256_set1_ps(d[i + l]), e)) pass[i + l] |= 1;
        std::memcpy(&lbits[i + l], &e[l], 4);
      }
    }
    for (int l = 0; l < 8; ++l) {
      const __m256 b = _mm256_set1_ps(d[i + l]);
      if (exp_group8_all_clamped(b)) pass[i + l] |= 4;
      if (d[i + l] >= kLightLow && d[i + l] <= kLightHigh) {
        float e[8];
        if (light_group<false>(b, e)) pass[i + l] |= 2;
        std::memcpy(&lbits_in[i + l], &e[l], 4);
      }
    }
  }
}

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

void light_mismatch(Counts& k, uint32_t b) {
  if (k.l_mismatches == 0 || b < k.l_first_mismatch) k.l_first_mismatch = b;
  k.l_mismatches++;
}

void check_block(uint64_t first, Counts& k, float* d, double* c, uint32_t* bits, uint64_t* decided, bool avx512,
                 double* tc, uint32_t* tbits, uint64_t* tdecided, bool avx2, uint32_t* lbits, uint32_t* lbits_in,
                 uint8_t* lpass) {
  for (int64_t i = 0; i < kBlock; ++i) {
    const uint32_t b = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    std::memcpy(&d[i], &b, 4);
  }
  approx_block(d, c, bits, decided, kBlock);
  if (avx512) table_block(d, tbits, tdecided, tc, kBlock);
  if (avx2) light_block(d, lbits, lbits_in, lpass, kBlock);
  for (int64_t i = 0; i < kBlock; ++i) {
    k.checked++;
    const double core = math::exp_f32_core(static_cast<double>(d[i]));
    if (avx2) {
      // A pass must be a decision of the full test (decided[i], from the
      // same double) with RN32(exp_f32_core(d))'s bits.
      const uint32_t b = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
      const uint32_t want = rn32_bits(core);
      if (lpass[i] & 1) {
        k.l_passed++;
        if (!decided[i] || lbits[i] != want) light_mismatch(k, b);
      } else if (d[i] >= -87.0f && d[i] <= 88.0f) {
        k.l_failed_main++;
      }
      if (lpass[i] & 2) {
        k.l_passed_in_range++;
        if (!decided[i] || lbits_in[i] != want) light_mismatch(k, b);
      }
      if (lpass[i] & 4) {
        k.l_clamped++;
        if (want != 0 || !(lpass[i] & 1) || lbits[i] != 0) light_mismatch(k, b);
      }
    }
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

// The first mismatching pattern, if any.
void print_first_mismatch(uint64_t mismatches, uint32_t first) {
  if (mismatches == 0) return;
  float x;
  std::memcpy(&x, &first, 4);
  std::printf("  first mismatch: d = %.9g (0x%08x)\n", static_cast<double>(x), first);
}

}  // namespace

int main(int argc, char** argv) {
  const bool ftz = argc > 1 && std::strcmp(argv[1], "--ftz") == 0;
  const bool avx512 = softmax_avx512_available();
  const bool avx2 = cpu::avx2();
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
    std::vector<uint32_t> lbits(kBlock), lbits_in(kBlock);
    std::vector<uint8_t> lpass(kBlock);
#pragma omp for schedule(dynamic, 16)
    for (int64_t b = 0; b < kBlocks; ++b)
      check_block(static_cast<uint64_t>(b) * kBlock, local, d.data(), c.data(), bits.data(), decided.data(), avx512,
                  tc.data(), tbits.data(), tdecided.data(), avx2, lbits.data(), lbits_in.data(), lpass.data());
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
      if (local.l_mismatches && (!total.l_mismatches || local.l_first_mismatch < total.l_first_mismatch))
        total.l_first_mismatch = local.l_first_mismatch;
      total.l_passed += local.l_passed;
      total.l_passed_in_range += local.l_passed_in_range;
      total.l_failed_main += local.l_failed_main;
      total.l_clamped += local.l_clamped;
      total.l_mismatches += local.l_mismatches;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("checked %llu float32 bit patterns in %.1f s\n", static_cast<unsigned long long>(total.checked), secs);
  std::printf("  decided by the rounding test:          %llu\n", static_cast<unsigned long long>(total.decided));
  std::printf("  undecided with d in [-87, 88]:          %llu\n", static_cast<unsigned long long>(total.undecided_main));
  std::printf("  max |approx - core| / core (normal):    2^%.2f\n", std::log2(total.max_rel));
  std::printf("  MISMATCHES (decided, float32 bits differ): %llu\n", static_cast<unsigned long long>(total.mismatches));
  print_first_mismatch(total.mismatches, total.first_mismatch);
  if (avx512) {
    std::printf("exp16_table_round (AVX-512):\n");
    std::printf("  decided by the rounding test:          %llu\n", static_cast<unsigned long long>(total.t_decided));
    std::printf("  undecided with d in [-87, 88]:          %llu\n",
                static_cast<unsigned long long>(total.t_undecided_main));
    std::printf("  max |table - core| / core (normal):     2^%.2f\n", std::log2(total.t_max_rel));
    std::printf("  MISMATCHES (decided, float32 bits differ): %llu\n",
                static_cast<unsigned long long>(total.t_mismatches));
    print_first_mismatch(total.t_mismatches, total.t_first_mismatch);
  } else {
    std::printf("exp16_table_round not checked: this CPU has no AVX-512\n");
  }
  if (avx2) {
    std::printf("exp_group8_tested's light test (AVX2):\n");
    std::printf("  passed (with the range test):          %llu\n", static_cast<unsigned long long>(total.l_passed));
    std::printf("  passed (without it, d in [-87, 88]):    %llu\n",
                static_cast<unsigned long long>(total.l_passed_in_range));
    std::printf("  failed with d in [-87, 88]:             %llu\n", static_cast<unsigned long long>(total.l_failed_main));
    std::printf("  all clamped (stored as +0):             %llu\n", static_cast<unsigned long long>(total.l_clamped));
    std::printf("  MISMATCHES (passed, undecided or other bits): %llu\n",
                static_cast<unsigned long long>(total.l_mismatches));
    print_first_mismatch(total.l_mismatches, total.l_first_mismatch);
  } else {
    std::printf("exp_group8_tested not checked: this CPU has no AVX2\n");
  }
  return total.mismatches == 0 && total.t_mismatches == 0 && total.l_mismatches == 0 &&
                 total.checked == (uint64_t{1} << 32)
             ? 0
             : 1;
}
