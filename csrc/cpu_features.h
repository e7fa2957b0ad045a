// Which x86 vector loops the CPU kernels may take, decided once per process.
//
// Several CPU kernels have an AVX-512 loop, an AVX2 loop and a portable one;
// each op's file argues that they give the same bits (the same IEEE
// operations in the same order, lane by lane). Which one runs is a matter of
// speed only, so two switches let tests and benchmarks pick a slower path on
// a faster CPU:
//
//   CARBON_CPU_NO_AVX512=1   skip the AVX-512 loops (AVX2 or portable run)
//   CARBON_CPU_NO_AVX2=1     skip the AVX2 loops too (portable run)
//
// (Functions compiled with target_clones pick their clone by the CPU alone;
// they give the same bits in every clone, so the switches leave them be.)
#pragma once

#include <cstdlib>

namespace carbon {
namespace cpu {

inline bool switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// The AVX-512 loops may run (each caller checks the CPU's own extensions).
inline bool avx512_allowed() {
  static const bool yes = !switched_off("CARBON_CPU_NO_AVX512");
  return yes;
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 with FMA and F16C (every x86-64-v3 CPU: Haswell, Zen 1 and later), and
// not switched off.
inline bool avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c") && !switched_off("CARBON_CPU_NO_AVX2");
  return yes;
}
#else
inline bool avx2() { return false; }
#endif

}  // namespace cpu
}  // namespace carbon
