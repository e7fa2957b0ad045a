// Per-row logic of layer_norm and rms_norm, shared by the CPU and CUDA
// kernels (docs/contract.md §7 is the definition implemented here).
//
// Notation: RN32 = correctly rounded to float32, RN_out to the output format;
// (+) (-) (x) are IEEE binary64 operations. Per row of n values x_i:
//
//   layer_norm:  mu = RN32(sum x / n)                       exact sum, one rounding
//                var = RN32(sum (x - mu)^2 / n)              exact, one rounding
//                r = RN32(1 / RN32(sqrt(RN32(var + RN32(eps)))))
//                xhat = RN32((x (-) mu) (x) r),   y = RN_out((xhat (x) w) (+) b)
//   rms_norm:    ms = RN32(sum x^2 / n),  r as above,  xhat = RN32(x (x) r),  y = RN_out(xhat (x) w)
//
// The statistics are decided by the tiers of the reductions
// (reduce_kernel.h): an fp64 sum by a tree of known depth and the monotone
// rounding test, else the exact accumulator. The kernels (norm_cpu.cpp,
// norm_cuda.cu) own the loops and trees; the decisions and the elementwise
// formulas are here, so both devices perform the same operations.
#pragma once

#include <cmath>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "../reduce/reduce_kernel.h"

namespace carbon {

// The output format of an element type (outputs have x's dtype).
template <typename T>
struct FormatOf;
template <>
struct FormatOf<float> {
  using type = Format<FormatId::kFloat32>;
};
template <>
struct FormatOf<c10::BFloat16> {
  using type = Format<FormatId::kBFloat16>;
};
template <>
struct FormatOf<c10::Half> {
  using type = Format<FormatId::kFloat16>;
};

using F32 = Format<FormatId::kFloat32>;

CARBON_HD double rn32(double x) { return round_double(x, F32::get()); }


// ---------------------------------------------------------------- statistics

// Tier 1 of RN32(c / n), c an exact sum of exact terms (values, or products
// of two values) whose fp64 sum `sum` and absolute sum `abs_sum` were formed
// by a tree of depth `depth`.
CARBON_HD bool mean_fast(double sum, double abs_sum, int64_t n, int64_t depth, double* out) {
  return reduce_round_fast(sum, abs_sum, n, depth, true, F32::get(), out);
}

// Tier 1 of RN32(S / n) for S = sum of n NONNEGATIVE reals s_i, from
// T = the fp64 sum (tree of depth `depth`) of approximations t_i with
// |t_i - s_i| <= gamma_k s_i (k = `term_error`: 0 when t_i = x_i (x) x_i is
// exact, 3 for t_i = d (x) d with d = x (-) mu, since |d - (x - mu)| <= u|x - mu|
// and the square adds one more rounding: (1 + u)^3 - 1 <= gamma_3). Then
//   |T - sum t| <= gamma_d sum t <= gamma_d T / (1 - gamma_d),
//   |sum t - S| <= gamma_k S     <= gamma_k T / ((1 - gamma_k)(1 - gamma_d)),
// and the factor 1 / ((1 - gamma_d)(1 - gamma_k)) < 1 + 2^-21 for fewer than
// 2^31 terms is covered by kBoundSlack. T == 0 means every t_i, hence every
// s_i, is 0 (a nonzero s_i is at least 2^-298, and so is t_i): S = +0.
CARBON_HD bool mean_of_squares_fast(double T, int64_t n, int64_t depth, int term_error, double* out) {
  if (T == 0.0) {
    *out = 0.0;
    return true;
  }
  const double beta = (gamma_n(depth) + gamma_n(term_error)) * T * kBoundSlack;
  return round_quotient_if_decided(T, beta, static_cast<double>(n), F32::get(), out);
}

// Exact-tier terms of (x - mu)^2 = x*x + x*(-2 mu) + mu*mu: three exact
// products of values (2 mu is exact in fp64), so the accumulator holds the
// exact sum of squares. Only for finite x and mu.
CARBON_HD void add_centered_square(int64_t* limb, uint32_t& flags, double x, double mu) {
  exact_sum_add_product(limb, flags, x, x);
  exact_sum_add_product(limb, flags, x, -2.0 * mu);
  exact_sum_add_product(limb, flags, mu, mu);
}

// The exact tier's rounding: RN32(sum / n).
CARBON_HD double exact_mean_round(int64_t* limb, uint32_t flags, int64_t n) {
  return exact_sum_round_divided(limb, flags, static_cast<uint64_t>(n), F32::get());
}

// r = RN32(1 / s), s = RN32(sqrt(w)), w = RN32(var + eps32). var and eps32 are
// float32 values: RN32 of their fp64 sum is RN32 of the exact sum (the fp64
// sum is exact unless the exponents differ by more than 29, and then both
// round to the larger operand). sqrt and 1/s of float32 values computed in
// fp64 and rounded to float32 are correctly rounded (53 >= 2 * 24 + 2).
// var = 0 and eps = 0 give r = +inf; var = +inf gives r = 0; NaN stays NaN.
CARBON_HD double rstd_of(double var, double eps32) {
  const double w = rn32(var + eps32);
  const double s = rn32(sqrt(w));
  return rn32(1.0 / s);
}

// ---------------------------------------------------------------- elementwise

CARBON_HD double ln_xhat(double x, double mu, double r) { return rn32((x - mu) * r); }
CARBON_HD double rms_xhat(double x, double r) { return rn32(x * r); }

// y before its rounding to the output format: (xhat (x) w) (+) b; the product
// is exact. Without a weight w = 1; without a bias nothing is added (so a -0
// product stays -0).
CARBON_HD double affine(double xhat, const double* w, const double* b) {
  const double p = w ? xhat * *w : xhat;
  return b ? p + *b : p;
}

// g = RN32(dy (x) w) (dy itself without a weight).
CARBON_HD double scaled_grad(double dy, const double* w) { return w ? rn32(dy * *w) : dy; }

// layer_norm: dx before rounding = r (x) ((g (-) A) (-) (xhat (x) B)).
CARBON_HD double ln_dx(double g, double xhat, double A, double B, double r) { return r * ((g - A) - xhat * B); }
// rms_norm:   dx before rounding = r (x) (g (-) (xhat (x) B)).
CARBON_HD double rms_dx(double g, double xhat, double B, double r) { return r * (g - xhat * B); }

}  // namespace carbon
