// Exhaustive accuracy check of Carbon's elementwise math in float32: for each
// function, every float32 bit pattern (or every `stride`-th one) goes through
// the same code as the kernels (csrc/elementwise/elementwise_math.h, then one
// rounding with csrc/exact/float_format.h) and is compared with a reference
// computed in x87 long double (64-bit significand) from glibc's long double
// functions (expl, logl, tanhl, erfl, erfcl, tanl, atanl, asinhl, ...), composed with care
// for cancellation (erfinv, which glibc lacks, by Newton steps on erfl / erfcl). Built and
// run by scripts/elementwise_ulp.py.
//
//   elementwise_ulp [--functions a,b,...] [--stride k]
//   elementwise_ulp --sincos-reduction   (smallest reduced argument of sin/cos)
//   elementwise_ulp --erfinv-start       (largest relative error of erfinv's start)
//
// Per function it prints: the max error in ulps of float32 (as a real number,
// measured against the long double reference), the input where it occurs, the
// number of results that differ from the correctly rounded value, and the
// number of inputs whose correct rounding the reference cannot decide (its
// value lies within its own error bound of a midpoint between two floats).
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "elementwise/elementwise_math.h"
#include "exact/float_format.h"

using namespace carbon;
using LD = long double;

namespace {

struct Ref {
  LD value;
  LD err;  // absolute error bound of value
};

constexpr LD kRel = 0x1p-58L;  // relative error assumed for one glibc long double call (~2-4 ulps of 2^-64)
const LD kSqrt2L = sqrtl(2.0L);
const LD kPiL = 3.14159265358979323846264338327950288L;

Ref exact(LD v, LD rel = kRel) { return {v, fabsl(v) * rel}; }

// Phi(x) in long double: erfcl for x < 0 (no cancellation). The rounding of
// x/sqrt(2) (2^-64 relative) moves erfc by 2 u^2 2^-64 relative.
Ref Phi(LD x) {
  const LD u = fabsl(x) / kSqrt2L;
  // (first-order bound, capped: where it exceeds 1/2 the value is far below 2^-149)
  const LD rel = fminl(kRel + (2 * u * u + 2) * 0x1p-64L, 0.5L);
  if (x < 0) return exact(0.5L * erfcl(u), rel);
  return {0.5L * (1 + erfl(u)), 0.5L * erfcl(u) * rel + 0x1p-64L};
}
LD phi(LD x) { return expl(-x * x / 2) / sqrtl(2 * kPiL); }

// y_rel: relative error of the argument y itself (0 when y is the input).
Ref sigmoidL(LD y, LD y_rel = 0) {
  const LD E = expl(-fabsl(y));
  // sensitivity to y's relative error: |y| (1 - sigmoid(y))
  const LD one_minus = y < 0 ? 1 / (1 + E) : E / (1 + E);
  return exact(y < 0 ? E / (1 + E) : 1 / (1 + E), fminl(kRel + fabsl(y) * one_minus * y_rel, 0.5L));
}
LD sigmoid_grad(LD y) {
  const LD E = expl(-fabsl(y));
  return E / ((1 + E) * (1 + E));
}
const LD kC = 2 * sqrtl(2 / kPiL);
const LD kA = 0.044715L;

// erfinv(x) in long double: the root y of erf(y) = a, a = |x| < 1, by Newton steps on
// f(y) = erfl(y) - a for a <= 1/2 and on f(y) = (1 - a) - erfcl(y) above (1 - a is exact;
// no cancellation next to 1). They start from Carbon's value only to converge in few
// steps: each step squares the relative error, so after three nothing of the start is
// left, and the result is the root of the glibc residual. A residual error of kRel moves
// y by kRel erf(y) / (y erf'(y)) <= 1.2 kRel relative (a <= 1/2), or by kRel erfc(y) /
// (y erf'(y)) < 1.2 kRel (a > 1/2); the steps' own roundings add 2^-63: < 2 kRel.
Ref erfinvL(float xf) {
  const LD x = xf, a = fabsl(x);
  if (std::isnan(xf) || a > 1) return {NAN, 0};
  if (a == 1) return {copysignl(INFINITY, x), 0};
  if (a == 0) return {x, 0};
  LD y = carbon::math::erfinv_core(static_cast<double>(a));
  for (int i = 0; i < 3; ++i) {
    const LD f = a <= 0.5L ? erfl(y) - a : (1 - a) - erfcl(y);
    y -= f / (2 / sqrtl(kPiL) * expl(-y * y));
  }
  return exact(copysignl(y, x), 2 * kRel);
}

Ref reference(int id, float xf) {
  enum { EXP, LOG, TANH, SIG, ERF, GELU, GELUT, SILU, EXPG, LOGG, TANHG, SIGG, ERFG, GELUG, GELUTG, SILUG, SIN, COS, SING, COSG,
         LOG1P, SOFTPLUS, LOGSIG, LOG1PG, SOFTPLUSG, LOGSIGG, EXPM1, EXPM1G,
         LOG2, LOG10, EXP2, ERFC, SINH, COSH, TAN, ATAN, ASIN, ACOS,
         LOG2G, LOG10G, EXP2G, ERFCG, SINHG, COSHG, TANG, ATANG, ASING, ACOSG,
         ERFINV, ASINH, ACOSH, ATANH, ERFINVG, ASINHG, ACOSHG, ATANHG };
  const LD x = xf;
  if (id == EXP) return exact(expl(x));
  if (id == LOG) return exact(logl(x));
  if (id == TANH) return exact(tanhl(x));
  if (id == SIG) return sigmoidL(x);
  if (id == ERF) return exact(erfl(x));
  // glibc's sinl / cosl reduce the argument exactly (Payne-Hanek), so their
  // relative error stays ~1 ulp of long double also next to multiples of pi.
  if (id == SIN || id == COSG) {
    if (std::isinf(xf)) return {NAN, 0};
    return exact(id == SIN ? sinl(x) : -sinl(x));
  }
  if (id == COS || id == SING) {
    if (std::isinf(xf)) return {NAN, 0};
    return exact(cosl(x));
  }
  if (id == LOG1P) return x < -1 ? Ref{NAN, 0} : exact(log1pl(x));
  // softplus = x + log1p(e^-x) for x >= 0, log1p(e^x) below (positive terms)
  if (id == SOFTPLUS || id == LOGSIG) {
    const LD y = id == SOFTPLUS ? x : -x;
    if (std::isinf(xf)) return {id == SOFTPLUS ? (y > 0 ? y : 0.0L) : (y > 0 ? -y : -0.0L), 0};
    const LD v = y >= 0 ? y + log1pl(expl(-y)) : log1pl(expl(y));
    return exact(id == SOFTPLUS ? v : -v);
  }
  if (id == LOG1PG) return x < -1 ? Ref{NAN, 0} : exact(1 / (1 + x), 0x1p-63L);
  if (id == EXPM1) return exact(expm1l(x));
  if (id == EXPM1G) return exact(expl(x));
  if (id == LOG2) return exact(log2l(x));
  if (id == LOG10) return exact(log10l(x));
  if (id == EXP2) return exact(exp2l(x));
  if (id == ERFC) return exact(erfcl(x));
  if (id == SINH || id == COSHG) return exact(sinhl(x));
  if (id == COSH || id == SINHG) return exact(coshl(x));
  // glibc's tanl reduces exactly like sinl / cosl
  if (id == TAN) return std::isinf(xf) ? Ref{NAN, 0} : exact(tanl(x));
  if (id == ATAN) return exact(atanl(x));
  if (id == ASIN) return fabsl(x) > 1 ? Ref{NAN, 0} : exact(asinl(x));
  if (id == ACOS) return fabsl(x) > 1 ? Ref{NAN, 0} : exact(acosl(x));
  if (id == LOG2G || id == LOG10G) return x < 0 ? Ref{NAN, 0} : exact(1 / (fabsl(x) * logl(id == LOG2G ? 2.0L : 10.0L)));
  if (id == EXP2G) return exact(exp2l(x) * logl(2.0L));
  if (id == ERFCG) return exact(-2 / sqrtl(kPiL) * expl(-x * x));
  if (id == TANG) {
    if (std::isinf(xf)) return {NAN, 0};
    const LD c = cosl(x);
    return exact(1 / (c * c));
  }
  if (id == ATANG) return exact(1 / (1 + x * x));
  // 1 - x^2 is exact in long double for a float x (|x| <= 1)
  if (id == ASING || id == ACOSG) {
    if (fabsl(x) > 1 || std::isinf(xf)) return {NAN, 0};
    const LD v = 1 / sqrtl(1 - x * x);
    return exact(id == ASING ? v : -v);
  }
  if (id == ERFINV) return erfinvL(xf);
  // sqrt(pi)/2 e^{y^2}: y's relative error 2 kRel enters e^{y^2} times 2 y^2 (< 30)
  if (id == ERFINVG) {
    if (std::isnan(xf) || fabsl(x) > 1) return {NAN, 0};
    if (fabsl(x) == 1) return {INFINITY, 0};
    const LD y = erfinvL(xf).value;
    return exact(sqrtl(kPiL) / 2 * expl(y * y), kRel + 2 * y * y * 2 * kRel + 0x1p-63L);
  }
  if (id == ASINH) return exact(asinhl(x));
  if (id == ACOSH) return x < 1 ? Ref{NAN, 0} : exact(acoshl(x));
  if (id == ATANH) return fabsl(x) > 1 ? Ref{NAN, 0} : exact(atanhl(x));
  // x^2 is exact in long double for a float x; 1 + x^2, x - 1, x + 1, 1 - x^2 round at most once
  if (id == ASINHG) return exact(1 / sqrtl(1 + x * x), 0x1p-62L);
  if (id == ACOSHG) return x < 1 ? Ref{NAN, 0} : exact(1 / sqrtl((x - 1) * (x + 1)), 0x1p-62L);
  if (id == ATANHG) return fabsl(x) > 1 ? Ref{NAN, 0} : exact(1 / (1 - x * x), 0x1p-62L);
  if (id == SOFTPLUSG) return sigmoidL(x);
  if (id == LOGSIGG) return sigmoidL(-x);
  // gelu, gelu_tanh, silu for 0 < |x| < 2^-60: x/2 + c x^2 + ..., c > 0, where
  // the x^2 term is below long double's resolution but decides the rounding
  // when x/2 is a midpoint: x/2 (1 + 2^-62) lies on the same side of every
  // float midpoint as the true value and within 2^-39 ulp of it.
  if ((id == GELU || id == GELUT || id == SILU) && x != 0 && fabsl(x) < 0x1p-60L)
    return {x / 2 + fabsl(x / 2) * 0x1p-62L, 0};
  if (id == GELU) {
    if (std::isinf(xf)) return {xf > 0 ? x : -0.0L, 0};
    const Ref p = Phi(x);
    return {x * p.value, fabsl(x) * p.err};
  }
  if (id == GELUT) {
    if (std::isinf(xf)) return {xf > 0 ? x : -0.0L, 0};
    const LD y = kC * x * (1 + kA * x * x);
    const Ref s = sigmoidL(y, 0x1p-62L);
    return {x * s.value, fabsl(x) * s.err};
  }
  if (id == SILU) {
    if (std::isinf(xf)) return {xf > 0 ? x : -0.0L, 0};
    const Ref s = sigmoidL(x);
    return {x * s.value, fabsl(x) * s.err};
  }
  // Derivatives. Near a zero of the derivative the error bound is absolute.
  if (id == EXPG) return exact(expl(x));
  if (id == LOGG) return x < 0 ? Ref{NAN, 0} : exact(1 / fabsl(x), 0x1p-64L);
  if (id == TANHG) {
    const LD c = coshl(x);
    return exact(1 / (c * c));
  }
  if (id == SIGG) return exact(sigmoid_grad(x));
  if (id == ERFG) return exact(2 / sqrtl(kPiL) * expl(-x * x));
  if (id == GELUG) {
    if (std::isinf(xf)) return {xf > 0 ? 1.0L : 0.0L, 0};
    const Ref p = Phi(x);
    const LD t = x * phi(x);
    return {p.value + t, p.err + fabsl(t) * kRel + (fabsl(p.value) + fabsl(t)) * 0x1p-64L};
  }
  if (id == GELUTG) {
    if (std::isinf(xf)) return {xf > 0 ? 1.0L : 0.0L, 0};
    const LD y = kC * x * (1 + kA * x * x);
    const LD dy = kC * (1 + 3 * kA * x * x);
    const Ref s = sigmoidL(y, 0x1p-62L);
    const LD t = x * sigmoid_grad(y) * dy;
    return {s.value + t, s.err + fabsl(t) * (kRel + fabsl(y) * 0x1p-62L) + (fabsl(s.value) + fabsl(t)) * 0x1p-64L};
  }
  if (id == SILUG) {
    if (std::isinf(xf)) return {xf > 0 ? 1.0L : 0.0L, 0};
    const Ref s = sigmoidL(x);
    const LD t = x * sigmoid_grad(x);
    return {s.value + t, s.err + fabsl(t) * kRel + (fabsl(s.value) + fabsl(t)) * 0x1p-64L};
  }
  std::fprintf(stderr, "unknown function %d\n", id);
  std::exit(2);
}

double core(int id, double x) {
  using namespace carbon::math;
  switch (id) {
    case 0: return exp_core(x);
    case 1: return log_core(x);
    case 2: return tanh_core(x);
    case 3: return sigmoid_core(x);
    case 4: return erf_core(x);
    case 5: return gelu_core(x);
    case 6: return gelu_tanh_core(x);
    case 7: return silu_core(x);
    case 8: return exp_grad_core(x);
    case 9: return log_grad_core(x);
    case 10: return tanh_grad_core(x);
    case 11: return sigmoid_grad_core(x);
    case 12: return erf_grad_core(x);
    case 13: return gelu_grad_core(x);
    case 14: return gelu_tanh_grad_core(x);
    case 15: return silu_grad_core(x);
    case 16: return sin_core(x);
    case 17: return cos_core(x);
    case 18: return sin_grad_core(x);
    case 19: return cos_grad_core(x);
    case 20: return log1p_core(x);
    case 21: return softplus_core(x);
    case 22: return log_sigmoid_core(x);
    case 23: return log1p_grad_core(x);
    case 24: return softplus_grad_core(x);
    case 25: return log_sigmoid_grad_core(x);
    case 26: return expm1_core(x);
    case 27: return expm1_grad_core(x);
    case 28: return log2_core(x);
    case 29: return log10_core(x);
    case 30: return exp2_core(x);
    case 31: return erfc_core(x);
    case 32: return sinh_core(x);
    case 33: return cosh_core(x);
    case 34: return tan_core(x);
    case 35: return atan_core(x);
    case 36: return asin_core(x);
    case 37: return acos_core(x);
    case 38: return log2_grad_core(x);
    case 39: return log10_grad_core(x);
    case 40: return exp2_grad_core(x);
    case 41: return erfc_grad_core(x);
    case 42: return sinh_grad_core(x);
    case 43: return cosh_grad_core(x);
    case 44: return tan_grad_core(x);
    case 45: return atan_grad_core(x);
    case 46: return asin_grad_core(x);
    case 47: return acos_grad_core(x);
    case 48: return erfinv_core(x);
    case 49: return asinh_core(x);
    case 50: return acosh_core(x);
    case 51: return atanh_core(x);
    case 52: return erfinv_grad_core(x);
    case 53: return asinh_grad_core(x);
    case 54: return acosh_grad_core(x);
    default: return atanh_grad_core(x);
  }
}
const char* kNames[] = {"exp",      "log",      "tanh",      "sigmoid",      "erf",      "gelu",      "gelu_tanh",      "silu",
                        "exp_grad", "log_grad", "tanh_grad", "sigmoid_grad", "erf_grad", "gelu_grad", "gelu_tanh_grad", "silu_grad",
                        "sin",      "cos",      "sin_grad",  "cos_grad",
                        "log1p",    "softplus", "log_sigmoid", "log1p_grad", "softplus_grad", "log_sigmoid_grad",
                        "expm1",    "expm1_grad",
                        "log2",     "log10",    "exp2",      "erfc",         "sinh",     "cosh",      "tan",            "atan",
                        "asin",     "acos",
                        "log2_grad", "log10_grad", "exp2_grad", "erfc_grad", "sinh_grad", "cosh_grad", "tan_grad", "atan_grad",
                        "asin_grad", "acos_grad",
                        "erfinv",   "asinh",    "acosh",     "atanh",
                        "erfinv_grad", "asinh_grad", "acosh_grad", "atanh_grad"};
constexpr int kCount = 56;

float carbon_float(int id, float x) {
  constexpr FloatFormat f32 = Format<FormatId::kFloat32>::get();
  const uint32_t bits = encode(round_double(core(id, static_cast<double>(x)), f32), f32);
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// ulp of float32 at magnitude |v| (v finite).
LD ulp_at(LD v) {
  const LD a = fabsl(v);
  if (a < 0x1p-126L) return 0x1p-149L;
  int e;
  frexpl(a, &e);  // a = m 2^e, m in [0.5, 1)
  if (e - 1 > 127) return 0x1p104L;
  return ldexpl(1.0L, e - 1 - 23);
}

struct Stats {
  double max_ulp = 0;
  uint32_t worst = 0;
  uint64_t checked = 0, not_cr = 0, undecidable = 0, special_bad = 0;
  uint32_t first_not_cr = 0;
};

void merge(Stats& a, const Stats& b) {
  if (b.max_ulp > a.max_ulp || (b.max_ulp == a.max_ulp && b.worst < a.worst && b.max_ulp > 0)) {
    a.max_ulp = b.max_ulp;
    a.worst = b.worst;
  }
  if (b.not_cr && (!a.not_cr || b.first_not_cr < a.first_not_cr)) a.first_not_cr = b.first_not_cr;
  a.checked += b.checked;
  a.not_cr += b.not_cr;
  a.undecidable += b.undecidable;
  a.special_bad += b.special_bad;
}

void check_one(int id, uint32_t bits, Stats& s) {
  float x;
  std::memcpy(&x, &bits, 4);
  const float got = carbon_float(id, x);
  const Ref ref = reference(id, x);
  s.checked++;
  if (std::isnan(ref.value) || std::isnan(got)) {
    if (std::isnan(ref.value) != std::isnan(got)) s.special_bad++;
    return;
  }
  const float rn = static_cast<float>(ref.value);  // one rounding of the long double (x87: RN, subnormals, overflow)
  // Undecidable: the reference lies within its error bound of a midpoint.
  bool undecidable = false;
  if (std::isfinite(rn) && ref.err > 0) {
    const float other = ref.value > rn ? std::nextafterf(rn, INFINITY) : std::nextafterf(rn, -INFINITY);
    if (std::isfinite(other)) {
      const LD mid = (static_cast<LD>(rn) + static_cast<LD>(other)) / 2;
      undecidable = fabsl(ref.value - mid) <= ref.err;
    }
  }
  double err_ulp;
  if (std::isinf(got) || std::isinf(ref.value)) {
    err_ulp = (got == rn) ? 0.0 : INFINITY;
  } else {
    err_ulp = static_cast<double>(fabsl(static_cast<LD>(got) - ref.value) / ulp_at(ref.value));
  }
  uint32_t gb, rb;
  std::memcpy(&gb, &got, 4);
  std::memcpy(&rb, &rn, 4);
  const bool zero_sign_only = got == 0.0f && rn == 0.0f;  // +-0: value-equal
  if (gb != rb && !zero_sign_only) {
    if (undecidable) {
      s.undecidable++;
    } else {
      if (!s.not_cr || bits < s.first_not_cr) s.first_not_cr = bits;
      s.not_cr++;
    }
  } else if (undecidable) {
    s.undecidable++;
  }
  if (err_ulp > s.max_ulp) {
    s.max_ulp = err_ulp;
    s.worst = bits;
  }
}

// The smallest |f| of sin/cos's reduction x 2/pi = q + f over all positive
// finite float32 x > pi/4 (the bound in elementwise_math.h relies on it).
int sincos_reduction_min() {
  double best = 1.0;
  uint32_t best_bits = 0;
  const uint32_t first = 0x3f490fdbu;  // RN32(pi/4) > pi/4
#pragma omp parallel
  {
    double mine = 1.0;
    uint32_t mine_bits = 0;
#pragma omp for schedule(dynamic, 65536)
    for (int64_t b = first; b < 0x7f800000; ++b) {
      float x;
      const uint32_t bits = static_cast<uint32_t>(b);
      std::memcpy(&x, &bits, 4);
      const double g = carbon::math::reduce_quarter_turns_large(x).g;
      if (g < mine) mine = g, mine_bits = bits;
    }
#pragma omp critical
    if (mine < best) best = mine, best_bits = mine_bits;
  }
  float w;
  std::memcpy(&w, &best_bits, 4);
  std::printf("min |f| = 2^%.2f at x = %.9g (0x%08x)\n", std::log2(best), static_cast<double>(w), best_bits);
  return 0;
}

// The largest relative error of erfinv's starting approximation (erfinv_start) over all
// float32 a in (0, 1), against erfinvL (elementwise_math.h's bound on the Halley step
// relies on it).
int erfinv_start_max() {
  double best = 0;
  uint32_t best_bits = 0;
#pragma omp parallel
  {
    double mine = 0;
    uint32_t mine_bits = 0;
#pragma omp for schedule(dynamic, 65536)
    for (int64_t b = 1; b < 0x3f800000; ++b) {
      float a;
      const uint32_t bits = static_cast<uint32_t>(b);
      std::memcpy(&a, &bits, 4);
      const LD ref = erfinvL(a).value;
      const double e = static_cast<double>(fabsl((carbon::math::erfinv_start(a) - ref) / ref));
      if (e > mine) mine = e, mine_bits = bits;
    }
#pragma omp critical
    if (mine > best) best = mine, best_bits = mine_bits;
  }
  float w;
  std::memcpy(&w, &best_bits, 4);
  std::printf("erfinv start: max relative error 2^%.2f at a = %.9g (0x%08x)\n", std::log2(best), static_cast<double>(w),
              best_bits);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ids;
  uint64_t stride = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sincos-reduction") return sincos_reduction_min();
    if (a == "--erfinv-start") return erfinv_start_max();
    if (a == "--stride" && i + 1 < argc) {
      stride = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--functions" && i + 1 < argc) {
      std::string list = argv[++i];
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = list.find(',', pos);
        const std::string name = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        bool found = false;
        for (int k = 0; k < kCount; ++k)
          if (name == kNames[k]) ids.push_back(k), found = true;
        if (!found) {
          std::fprintf(stderr, "unknown function '%s'\n", name.c_str());
          return 2;
        }
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--functions a,b,...] [--stride k]\n", argv[0]);
      return 2;
    }
  }
  if (ids.empty())
    for (int k : {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 20, 21, 22}) ids.push_back(k);
  if (stride < 1) stride = 1;
  std::printf("%-15s %12s %-34s %10s %10s %8s %10s %8s\n", "function", "max_ulp", "at x", "not_CR", "undecid.",
              "spec_bad", "checked", "seconds");
  std::fflush(stdout);
  for (int id : ids) {
    const auto t0 = std::chrono::steady_clock::now();
    Stats total;
    const int64_t n = static_cast<int64_t>((0x100000000ull + stride - 1) / stride);
#pragma omp parallel
    {
      Stats local;
#pragma omp for schedule(dynamic, 65536)
      for (int64_t i = 0; i < n; ++i) check_one(id, static_cast<uint32_t>(static_cast<uint64_t>(i) * stride), local);
#pragma omp critical
      merge(total, local);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float w;
    std::memcpy(&w, &total.worst, 4);
    char at[64];
    std::snprintf(at, sizeof at, "%.9g (0x%08x)", static_cast<double>(w), total.worst);
    std::printf("%-15s %12.9f %-34s %10llu %10llu %8llu %10llu %8.1f\n", kNames[id], total.max_ulp, at,
                static_cast<unsigned long long>(total.not_cr), static_cast<unsigned long long>(total.undecidable),
                static_cast<unsigned long long>(total.special_bad), static_cast<unsigned long long>(total.checked),
                secs);
    if (total.not_cr) {
      float fx;
      std::memcpy(&fx, &total.first_not_cr, 4);
      std::printf("  first not correctly rounded: x = %.9g (0x%08x)\n", static_cast<double>(fx), total.first_not_cr);
    }
    std::fflush(stdout);
  }
  return 0;
}
