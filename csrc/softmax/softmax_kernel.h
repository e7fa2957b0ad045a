// Per-row logic of softmax, log_softmax and their gradients, shared by the
// CPU and CUDA kernels. docs/contract.md §8 defines the results; in short,
// for a row x_1..x_n (values exact in float32):
//   m   = max_j x_j                       (exact)
//   d_j = RN32(x_j - m)                   (one float32 subtraction)
//   e_j = carbon.exp(d_j)                 (float32, the elementwise library)
//   S   = RN32(sum_j e_j)                 (exact sum, one rounding)
//   softmax_j     = RN_out(e_j / S)       (one rounding of the exact quotient)
//   log_softmax_j = RN_out(d_j (-) L),    L = carbon.log(S), (-) in fp64.
// Only S is a reduction; it is decided by the same tiers as carbon.sum, so
// its bits do not depend on how the row is split among threads.
#pragma once

#include <cmath>

#include "../elementwise/elementwise_math.h"
#include "../reduce/reduce_kernel.h"

namespace carbon {

// (A function, not a constant: device code cannot take a host constant by reference.)
CARBON_HD constexpr FloatFormat float32_format() { return Format<FormatId::kFloat32>::get(); }

// carbon.exp / carbon.log of a float32 value: one rounding of the fp64 core.
// exp32 evaluates exp_f32_core, which rounds to the bits of exp_core for
// every float32 argument (elementwise_math.h) with fewer instructions.
// (CPU loops call the two steps separately, so that the core's loop vectorizes.)
CARBON_HD float round32(double v) { return static_cast<float>(round_double(v, float32_format())); }
CARBON_HD float exp32(float x) { return round32(math::exp_f32_core(x)); }
CARBON_HD float log32(float x) { return static_cast<float>(round_double(math::log_core(x), float32_format())); }

// The row's maximum, and whether it holds a NaN (max is order-free: threads
// may combine their partial maxima in any order).
struct RowMax {
  float m = -INFINITY;
  bool nan = false;
};

CARBON_HD void row_max_add(RowMax& r, float v) {
  if (v != v)
    r.nan = true;
  else if (v > r.m)
    r.m = v;
}

CARBON_HD RowMax row_max_merge(RowMax a, const RowMax& b) {
  a.nan = a.nan || b.nan;
  if (b.m > a.m) a.m = b.m;
  return a;
}

// A row with a NaN or a +inf is all NaN (x_j - m is NaN for +inf entries, so
// S is NaN); a row of -inf only (every entry masked) is "masked":
// softmax 0, log_softmax -inf.
enum class RowCase { kNormal, kMasked, kNaN };

CARBON_HD RowCase row_case(const RowMax& r) {
  if (r.nan || r.m == INFINITY) return RowCase::kNaN;
  if (r.m == -INFINITY) return RowCase::kMasked;
  return RowCase::kNormal;
}

// Every output of a row whose case c is not kNormal. masked_nan gives a
// masked row torch's _softmax / _log_softmax meaning instead, NaN (0/0),
// which carbon.enable's routes ask for (in the kernel: no second pass).
CARBON_HD double special_row_fill(RowCase c, bool log, bool masked_nan) {
  if (c == RowCase::kNaN || masked_nan) return canonical_nan();
  return log ? -INFINITY : 0.0;
}


// e_j = carbon.exp(RN32(x_j - m)): in [0, 1], and exactly 1 at the maximum.
CARBON_HD float softmax_exp(float x, float m) { return exp32(x - m); }

// S = RN32(sum of the e_j) from tier 1: the fp64 sum of n values e_j >= 0
// by a tree of depth `depth` (so the absolute sum is the sum itself). S >= 1,
// never zero, so the rounding test applies directly.
CARBON_HD bool softmax_sum_if_decided(double sum, int64_t depth, double* S) {
  return round_if_decided(sum, gamma_n(depth) * sum * kBoundSlack, float32_format(), S);
}

// softmax_j = RN_out(e_j / S): the fp64 quotient of two float32 values
// rounds to the same result as the exact quotient in every format of at
// most 24 bits (53 >= 2 * 24 + 2; Figueroa's double-rounding theorem).
// The fp64 values before that rounding (CPU loops round them in a pass of
// their own).
CARBON_HD double softmax_quotient(float e, double S) { return static_cast<double>(e) / S; }
CARBON_HD double log_softmax_difference(float x, float m, double L) { return static_cast<double>(x - m) - L; }

CARBON_HD double softmax_value(float e, double S, const FloatFormat& f) {
  return round_double(softmax_quotient(e, S), f);
}

// log_softmax_j = RN_out(d_j (-) L), L = carbon.log(S).
CARBON_HD double log_softmax_value(float x, float m, double L, const FloatFormat& f) {
  return round_double(log_softmax_difference(x, m, L), f);
}

// Gradients (y is the forward output, g the incoming gradient):
//   softmax:     dx_j = RN_out(y_j (*) (g_j (-) D)),    D = RN32(sum_k g_k y_k)
//   log_softmax: dx_j = RN_out(g_j (-) p_j * G),         G = RN32(sum_k g_k),
//                p_j = carbon.exp(y_j); p_j * G is exact in fp64.
// D and G are exact sums (every g_k y_k is exact in fp64) with one rounding.
// (The fp64 values before the final rounding, for CPU loops that round in
// a vectorized pass of their own.)
CARBON_HD double softmax_grad_unrounded(double y, double g, double D) { return y * (g - D); }
CARBON_HD double log_softmax_grad_unrounded(float p, double g, double G) { return g - static_cast<double>(p) * G; }

CARBON_HD double softmax_grad_value(double y, double g, double D, const FloatFormat& f) {
  return round_double(softmax_grad_unrounded(y, g, D), f);
}

CARBON_HD double log_softmax_grad_from_p(float p, double g, double G, const FloatFormat& f) {
  return round_double(log_softmax_grad_unrounded(p, g, G), f);
}

CARBON_HD double log_softmax_grad_value(double y, double g, double G, const FloatFormat& f) {
  return log_softmax_grad_from_p(exp32(static_cast<float>(y)), g, G, f);
}

// Tier 1 of D or G: the fp64 sum and absolute sum of the exact terms.
CARBON_HD bool grad_sum_if_decided(double sum, double abs_sum, int64_t depth, double* out) {
  return round_if_decided(sum, gamma_n(depth) * abs_sum * kBoundSlack, float32_format(), out);
}

// Cross-entropy of a row of C logits with target t (docs/contract.md §8):
//   nll = 0 (-) lsm_t  (lsm = log_softmax in float32; exact, and +0 when
//                       lsm_t = +0, as a loss should be)
//   loss = nll                                  if eps == 0
//   loss = RN32(((1 (-) eps) (*) nll) (+) (eps (*) sm))   otherwise,
// with sm = -RN32(sum_c lsm_c / C) (exact mean). Rows whose target is
// ignore_index have loss +0 and no gradient.
CARBON_HD double cross_entropy_loss(float nll, double eps, double smooth) {
  if (eps == 0.0) return nll;
  return round_double((1.0 - eps) * static_cast<double>(nll) + eps * smooth, float32_format());
}

// Gradient of a row's loss with respect to logit j, given the row's
// coefficient c (the loss's incoming gradient; for the mean, RN32(g / count)):
//   dx_j = RN_out(c (*) (p_j (-) q_j)),  p_j = carbon.exp(lsm_j),
//   q_j = [j == t] * (1 (-) eps) (+) (eps (/) C).
CARBON_HD double cross_entropy_grad_unrounded(double c, float p, bool is_target, double eps, int64_t C) {
  const double q = (is_target ? 1.0 - eps : 0.0) + eps / static_cast<double>(C);
  return c * (static_cast<double>(p) - q);
}

CARBON_HD double cross_entropy_grad_from_p(double c, float p, bool is_target, double eps, int64_t C,
                                           const FloatFormat& f) {
  return round_double(cross_entropy_grad_unrounded(c, p, is_target, eps, C), f);
}

CARBON_HD double cross_entropy_grad_value(double c, float lsm, bool is_target, double eps, int64_t C,
                                          const FloatFormat& f) {
  return cross_entropy_grad_from_p(c, exp32(lsm), is_target, eps, C, f);
}

}  // namespace carbon
