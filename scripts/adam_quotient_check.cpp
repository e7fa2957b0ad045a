// Random check of adam_avx512::quotient_by_c2s (csrc/optim/adam_avx512.h),
// the reciprocal-based RN64(x / c2s) of the CPU's AVX-512 Adam step, against
// the IEEE division, bit for bit: 2^27 lanes per run, x the square roots of
// random float32 values (as in the step) and, one lane in 16, any double;
// c2s from real bias corrections sqrt(1 - beta2^t), powers of two, short
// significands and any double (negative, tiny, huge, inf, NaN). Prints the
// mismatch count (must be 0; exit status 1 otherwise). Needs an AVX-512 CPU.
//
//     g++ -O2 -ffp-contract=off -fno-math-errno -std=c++17 -Icsrc \
//         -I"$(python -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')" \
//         scripts/adam_quotient_check.cpp -o build/adam_quotient_check && build/adam_quotient_check
//
// (It found the sign bug of an earlier version, which compared |r1| with
// c2s * h instead of |c2s| * h: 3 lanes in 1.3e8, negative c2s only.)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "optim/adam_avx512.h"

using namespace carbon;

__attribute__((target("avx512f,avx512dq,avx512vl"))) long check(uint64_t seed, long groups) {
  std::mt19937_64 rng(seed);
  long bad = 0;
  for (long it = 0; it < groups; ++it) {
    double y;
    switch (rng() % 6) {
      case 0: y = std::sqrt(1.0 - std::pow(0.999, 1 + rng() % 100000)); break;
      case 1: { const uint64_t b = rng(); std::memcpy(&y, &b, 8); break; }  // any double
      case 2: y = std::ldexp(1.0, -static_cast<int>(rng() % 60)); break;
      case 3: y = std::ldexp(1.0 + (rng() % 1024) / 1024.0, -static_cast<int>(rng() % 30)); break;
      case 4: y = (rng() % 1000 + 1) / 1000.0; break;
      default: y = std::sqrt(1.0 - std::pow(0.99, 1 + rng() % 1000)); break;
    }
    AdamConstants c{};
    c.bias_correction2_sqrt = y;
    const adam_avx512::Constants cv = adam_avx512::broadcast(c);
    alignas(64) double x[8], q[8];
    for (int l = 0; l < 8; ++l) {
      uint32_t bits = static_cast<uint32_t>(rng());
      if (rng() % 4 == 0) bits &= 0x7FFFFFFFu;
      if (rng() % 8 == 0) bits = static_cast<uint32_t>(rng() % 254) << 23;  // powers of two
      float f;
      std::memcpy(&f, &bits, 4);
      x[l] = std::sqrt(static_cast<double>(f));
      if (rng() % 16 == 0) {
        const uint64_t b = rng();
        std::memcpy(&x[l], &b, 8);
      }
    }
    _mm512_storeu_pd(q, adam_avx512::quotient_by_c2s(_mm512_loadu_pd(x), cv));
    for (int l = 0; l < 8; ++l) {
      const double want = x[l] / y;
      uint64_t a, b;
      std::memcpy(&a, &q[l], 8);
      std::memcpy(&b, &want, 8);
      if (a != b && !(std::isnan(q[l]) && std::isnan(want))) {
        if (bad < 5) std::printf("mismatch: x=%a c2s=%a got %a want %a\n", x[l], y, q[l], want);
        ++bad;
      }
    }
  }
  return bad;
}

int main() {
  if (!adam_avx512::available()) {
    std::printf("no AVX-512 on this CPU\n");
    return 0;
  }
  long bad = 0;
  const long groups = 2000000;
  for (uint64_t seed = 1; seed <= 8; ++seed) bad += check(seed, groups);
  std::printf("%ld mismatches in %ld lanes\n", bad, 8 * 8 * groups);
  return bad == 0 ? 0 : 1;
}
