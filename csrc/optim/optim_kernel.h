// The per-element updates of Carbon's optimizers, written once for the CPU
// loop (optim.cpp) and the CUDA kernels (optim_cuda.cu). docs/contract.md §12
// states them; every operation below is one IEEE fp64 operation (the build
// disables contraction into FMAs), and the results are rounded once, with
// integer operations, into float32 (the states) or the parameter's format.
//
// Every input value of the supported formats is exact in fp64, so each
// element's result depends only on the input values and the host constants:
// the same bits on any CPU, any GPU, any thread count or launch grid.
#pragma once

#include "../exact/float_format.h"
#include "../reduce/reduce_kernel.h"  // element_value

namespace carbon {

CARBON_HD FloatFormat state_format() { return Format<FormatId::kFloat32>::get(); }

// Host constants of one Adam / AdamW step (all IEEE fp64 values).
struct AdamConstants {
  double step_size;        // lr / (1 - beta1^t)
  double beta1, one_minus_beta1;
  double beta2, one_minus_beta2;
  double eps;
  double weight_decay;     // L2 (Adam): g' = g' + wd * p, only when wd != 0
  double decay;            // AdamW: p0 = p * (1 - lr * wd)
  double bias_correction2_sqrt;
  // The flags as bit masks, which vector lanes can use where a bool
  // condition stops gcc's vectorizer: kSignBit when maximizing (g' = -g is
  // a flip of the sign bit), else 0; all ones for AdamW's decay of p (else
  // 0); all ones for Adam's L2 term (not decoupled and wd != 0, else 0).
  uint64_t grad_sign, decoupled_mask, l2_mask;
};

// beta^t by binary exponentiation (contract §12, carbon.optim.power): r = 1,
// b = beta; for each bit of t from the lowest: if set, r = r * b; then
// b = b * b. t is the integer part of a step count held as a float32 value
// (exact in fp64, and its halvings are exact too), so the loop needs no
// integer type: a float32 is below 2^128, so 128 bits suffice (an infinite t
// stops there; a NaN t runs no bit and gives 1).
CARBON_HD double beta_power(double beta, double t) {
  double r = 1.0, b = beta;
  t = trunc(t);
  for (int bit = 0; bit < 128 && t >= 1.0; ++bit) {
    const double half = trunc(t * 0.5);
    if (t != half * 2.0) r = r * b;
    b = b * b;
    t = half;
  }
  return r;
}

// The constants of an Adam step that depend on the learning rate and on
// the bias corrections c1 = 1 - beta1^t and c2s = sqrt(1 - beta2^t): the
// step size lr / c1, c2s, and AdamW's decay 1 - lr * wd (the others are set
// once per call).
CARBON_HD void set_lr_constants(AdamConstants& c, double lr, double bias_correction1, double bias_correction2_sqrt) {
  c.step_size = lr / bias_correction1;
  c.bias_correction2_sqrt = bias_correction2_sqrt;
  const double lr_wd = lr * c.weight_decay;
  c.decay = 1.0 - lr_wd;
}

// The same from t itself, with carbon.optim's host operations for c1 and
// c2s, so a step whose t and lr live in device memory (capturable steps,
// computed in the kernel) has the bits of one whose constants came from the
// host.
CARBON_HD void set_step_constants(AdamConstants& c, double lr, double t) {
  set_lr_constants(c, lr, 1.0 - beta_power(c.beta1, t), sqrt(1.0 - beta_power(c.beta2, t)));
}

// Where a capturable step (adam_step_capturable_) reads t and lr: memory on
// the parameters' device, read by the kernel itself, so that a CUDA graph
// replays with the values current at each replay rather than those of the
// capture. step == null: the step's constants came from the host.
struct AdamStepSource {
  const float* step = nullptr;   // t, one float32 value
  const float* lr32 = nullptr;   // the learning rate as a float32 tensor, or null
  const double* lr64 = nullptr;  // ... as a float64 tensor, or null
  double lr = 0.0;               // the learning rate when both are null
};

// c with its t- and lr-dependent constants set from s (float32 and float64
// values are exact in fp64).
CARBON_HD AdamConstants constants_at(AdamConstants c, const AdamStepSource& s) {
  const double lr = s.lr32 ? static_cast<double>(*s.lr32) : (s.lr64 ? *s.lr64 : s.lr);
  set_step_constants(c, lr, static_cast<double>(*s.step));
  return c;
}

// a where mask is all ones, b where it is 0: a select on the bits, exact.
CARBON_HD double select_bits(uint64_t mask, double a, double b) {
  return bits_to_double((double_to_bits(a) & mask) | (double_to_bits(b) & ~mask));
}
// -x when sign is kSignBit, x when it is 0 (negation is a flip of the sign bit).
CARBON_HD double flip_sign(double x, uint64_t sign) { return bits_to_double(double_to_bits(x) ^ sign); }

struct AdamResult {
  double p, m, v;  // each exactly representable in its format (or inf / NaN)
  double v_max;    // AMSGrad's max_exp_avg_sq' (float32); 0 without AMSGrad
};

// All ones when c holds, else 0 (for select_bits).
CARBON_HD uint64_t mask_of(bool c) { return uint64_t{0} - static_cast<uint64_t>(c); }

// IEEE 754-2019 maximum(a, b): NaN when either is NaN (as torch.maximum, which
// propagates NaN), -0 < +0, else the larger. Exact: the result is a or b (or
// a NaN). Equal operands: a & b on the bits, which is a itself, or +0 for
// {+0, -0}. Selects on bit masks (no branches), so CPU loops vectorize.
CARBON_HD double ieee_maximum(double a, double b) {
  const double equal_or_unordered = bits_to_double(double_to_bits(a) & double_to_bits(b));
  double r = select_bits(mask_of(a < b), b, equal_or_unordered);
  r = select_bits(mask_of(a > b), a, r);
  const double any_nan = a + b;  // NaN when a or b is; discarded otherwise
  return select_bits(mask_of(a != a || b != b), any_nan, r);
}

// The rounding RN_f used by the updates: exact for every double.
struct ExactRounding {
  CARBON_HD double operator()(double x, const FloatFormat& f) { return round_double(x, f); }
};

// The same rounding for results that are zero or normal in f only
// (float_format.h's branch-free round_normal_or_zero, so CPU loops over it
// vectorize); `ok` turns 0 when some value was outside that set, and the
// caller then recomputes the element with ExactRounding. A uint32_t, not a
// bool: it lives in a vector lane next to the doubles.
struct NormalRounding {
  uint32_t ok = 1;
  CARBON_HD double operator()(double x, const FloatFormat& f) {
    uint32_t x_ok;
    const double r = round_normal_or_zero(x, f, &x_ok);
    ok &= x_ok;
    return r;
  }
};

// kAmsgrad: AMSGrad (torch's amsgrad=True), with v_max the state
// max_exp_avg_sq; without it v_max is not read and the operations are the
// plain step's.
template <bool kAmsgrad = false, typename Round = ExactRounding>
CARBON_HD AdamResult adam_update(double p, double g, double m, double v, double v_max, const AdamConstants& c,
                                 const FloatFormat& f, Round&& round = Round{}) {
  // Written with selects on bit masks (no branches) so that CPU loops
  // vectorize; the products not selected are discarded.
  const double g_signed = flip_sign(g, c.grad_sign);
  const double wp = c.weight_decay * p;
  const double g_l2 = g_signed + wp;
  const double gp = select_bits(c.l2_mask, g_l2, g_signed);
  const double p_decayed = p * c.decay;
  const double p0 = select_bits(c.decoupled_mask, p_decayed, p);
  const double m_a = c.beta1 * m;
  const double m_b = c.one_minus_beta1 * gp;
  const double m1 = round(m_a + m_b, state_format());
  const double g2 = gp * gp;
  const double v_a = c.beta2 * v;
  const double v_b = c.one_minus_beta2 * g2;
  const double v1 = round(v_a + v_b, state_format());
  // AMSGrad: the denominator from v_max' = maximum(v_max, v'), a float32
  // value already; its RN32 changes nothing (NaN stays NaN) but lets
  // NormalRounding flag a subnormal / NaN / inf v_max' for the exact path.
  double v_max1 = 0.0;
  if constexpr (kAmsgrad) v_max1 = round(ieee_maximum(v_max, v1), state_format());
  const double root = sqrt(kAmsgrad ? v_max1 : v1);
  const double scaled = root / c.bias_correction2_sqrt;
  const double denom = scaled + c.eps;
  const double num = c.step_size * m1;
  const double delta = num / denom;
  return {round(p0 - delta, f), m1, v1, v_max1};
}

// Host constants of one SGD step.
struct SgdConstants {
  double lr, momentum, one_minus_dampening, weight_decay;
  uint64_t grad_sign;  // kSignBit when maximizing, else 0 (as AdamConstants)
  bool nesterov, first_step, has_momentum;
};

struct SgdResult {
  double p, b;
};

// C is SgdConstants, or (CPU loops) a type derived from it whose flags are
// static constexpr members, so that each combination is a loop without
// branches. Every branch below depends on those flags only.
template <typename C, typename Round = ExactRounding>
CARBON_HD SgdResult sgd_update(double p, double g, double b, const C& c, const FloatFormat& f,
                               Round&& round = Round{}) {
  const double g_signed = flip_sign(g, c.grad_sign);
  const double wp = c.weight_decay * p;
  const double g_l2 = g_signed + wp;
  const double gp = c.weight_decay != 0.0 ? g_l2 : g_signed;  // a select: wp is discarded when wd == 0
  double d = gp;
  double b1 = b;
  if (c.has_momentum) {
    if (c.first_step) {
      b1 = round(gp, state_format());
    } else {
      const double b_a = c.momentum * b;
      const double b_b = c.one_minus_dampening * gp;
      b1 = round(b_a + b_b, state_format());
    }
    if (c.nesterov) {
      const double mb = c.momentum * b1;
      d = gp + mb;
    } else {
      d = b1;
    }
  }
  const double step = c.lr * d;
  return {round(p - step, f), b1};
}

// Gradient clipping: coef = RN32(max_norm / (total + 1e-6)), clamped to <= 1
// (a NaN coefficient stays NaN, like torch.clamp).
CARBON_HD double clip_coefficient(double total_norm, double max_norm, double eps) {
  const double denom = total_norm + eps;
  const double coef = round_double(max_norm / denom, state_format());
  return coef > 1.0 ? 1.0 : coef;
}

// total = RN32(sqrt(S)) of the float32 value S: the fp64 square root is
// correctly rounded and 53 >= 2 * 24 + 2, so rounding it again to float32
// gives the correctly rounded float32 square root.
CARBON_HD double norm_from_sum_of_squares(double s) { return round_double(sqrt(s), state_format()); }

// Element access through typed pointers: read the exact value, write RN bits.
template <typename T>
CARBON_HD double load(const T* p, int64_t i) {
  return element_value(p[i]);
}
template <typename T>
CARBON_HD void store_value(T* p, int64_t i, double value, const FloatFormat& f) {
  // value is representable in T's format: write its bits (no FPU conversion).
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<uint32_t*>(p)[i] = encode(value, f);
  } else {
    reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(encode(value, f));
  }
}

// Element i's Adam step in place: p (format f), its gradient g, the float32
// states m, v and (kAmsgrad) w = max_exp_avg_sq.
template <bool kAmsgrad, typename T>
CARBON_HD void adam_element(T* p, const T* g, float* m, float* v, float* w, int64_t i, const AdamConstants& c,
                            const FloatFormat& f) {
  const double w0 = kAmsgrad ? load(w, i) : 0.0;
  const AdamResult r = adam_update<kAmsgrad>(load(p, i), load(g, i), load(m, i), load(v, i), w0, c, f);
  store_value(m, i, r.m, state_format());
  store_value(v, i, r.v, state_format());
  if constexpr (kAmsgrad) store_value(w, i, r.v_max, state_format());
  store_value(p, i, r.p, f);
}

// The fp64 square of an element (exact: at most 2 * 24 significant bits).
template <typename T>
CARBON_HD double square_of(const T* p, int64_t i) {
  const double v = element_value(p[i]);
  return v * v;
}

}  // namespace carbon
