// The floating-point environment every CPU kernel runs in, whatever the
// caller's thread was set to.
//
// Carbon's bits assume IEEE arithmetic as the standard defines it: round to
// nearest-even, subnormals read and written as they are. On x86 the SSE/AVX
// control register (MXCSR, one per thread) can change both: flush-to-zero
// writes subnormal results as zero and denormals-are-zero reads subnormal
// operands as zero (torch.set_flush_denormal(True) sets both, on the
// calling thread, and threads created later inherit them). A conversion
// of a subnormal float32 to double is then zero, so an exact sum, a norm's
// statistics or an elementwise function would change bits. Each op entry
// (registration.cpp) and each parallel chunk (carbon::parallel_for below)
// therefore switches its thread to the default state for its duration and
// puts the caller's state back afterwards; the exception flags the caller
// had set stay set.
//
// Other hosts: no-op. (AArch64's FPCR has a flush-to-zero bit as well;
// Carbon has not been built there yet, and a port would add its case here.)
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/Parallel.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define CARBON_HAS_MXCSR 1
#endif

namespace carbon {

#ifdef CARBON_HAS_MXCSR
// MXCSR bits 0-5: sticky exception flags; 6: denormals-are-zero; 7-12:
// exception masks; 13-14: rounding control; 15: flush-to-zero. 0x1F80 is the
// power-on default: every exception masked, round to nearest, no flushing.
inline constexpr uint32_t kMxcsrDefaultControl = 0x1F80u;
inline constexpr uint32_t kMxcsrExceptionFlags = 0x003Fu;

class DefaultFpEnv {
 public:
  DefaultFpEnv() : saved_(_mm_getcsr()) {
    const uint32_t wanted = (saved_ & kMxcsrExceptionFlags) | kMxcsrDefaultControl;
    if (wanted != saved_) _mm_setcsr(wanted);  // a write costs more than the read
  }
  ~DefaultFpEnv() {
    // keep the flags raised meanwhile, restore the caller's control bits
    const uint32_t now = _mm_getcsr();
    const uint32_t restored = (saved_ & ~kMxcsrExceptionFlags) | ((saved_ | now) & kMxcsrExceptionFlags);
    if (restored != now) _mm_setcsr(restored);
  }
  DefaultFpEnv(const DefaultFpEnv&) = delete;
  DefaultFpEnv& operator=(const DefaultFpEnv&) = delete;

 private:
  uint32_t saved_;
};
#else
class DefaultFpEnv {
 public:
  DefaultFpEnv() = default;
  DefaultFpEnv(const DefaultFpEnv&) = delete;
  DefaultFpEnv& operator=(const DefaultFpEnv&) = delete;
};
#endif

// at::parallel_for with each chunk run in the default environment (the
// worker threads keep whatever state they were created or left with).
template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, [&f](int64_t b, int64_t e) {
    DefaultFpEnv env;
    f(b, e);
  });
}

// An op entry with its body in the default environment: registration.cpp
// binds `&in_default_fp_env<&carbon::op>::call` instead of `&carbon::op`.
template <auto F>
struct in_default_fp_env;

template <typename R, typename... Args, R (*F)(Args...)>
struct in_default_fp_env<F> {
  static R call(Args... args) {
    DefaultFpEnv env;
    return F(std::forward<Args>(args)...);
  }
};

}  // namespace carbon
