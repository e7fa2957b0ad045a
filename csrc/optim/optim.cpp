// The optimizer ops: input checks, host constants, and the CPU loops over
// optim_kernel.h's per-element updates (the CUDA kernels are in
// optim_cuda.cu). Every element is updated independently, so the split over
// threads plays no role; the sum of squares uses fixed chunks and the tiers
// of reduce_kernel.h, whose result does not depend on the split either.
#include "optim.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "../reduce/chain_tree.h"
#include "adam_avx2.h"
#include "adam_avx512.h"
#include "sgd_avx2.h"
#include "sgd_avx512.h"

namespace carbon {
namespace {

constexpr int64_t kGrain = 32768;

void check_float(const char* op, const char* list, size_t i, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_supported(t.scalar_type()), "carbon.", op, ": ", list, "[", i, "] has dtype ", t.scalar_type(),
                   "; supported dtypes are float32, bfloat16 and float16");
}

// The parameter list against one other list (grads or a state): lengths,
// devices, shapes, dtypes (`state`: float32), contiguity.
void check_list(const char* op, at::TensorList params, at::TensorList other, const char* name, bool state) {
  TORCH_CHECK_VALUE(other.size() == params.size(), "carbon.", op, ": expected as many ", name, " as params (",
                    params.size(), "), got ", other.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& t = other[i];
    TORCH_CHECK_VALUE(t.device() == p.device(), "carbon.", op, ": expected all tensors on one device, but params[",
                      i, "] is on ", p.device(), " and ", name, "[", i, "] is on ", t.device());
    TORCH_CHECK_VALUE(t.sizes() == p.sizes(), "carbon.", op, ": ", name, "[", i, "] has shape ", t.sizes(),
                      " but params[", i, "] has shape ", p.sizes());
    if (state) {
      TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "carbon.", op, ": ", name, "[", i, "] must be float32, got ",
                       t.scalar_type());
    } else {
      TORCH_CHECK_TYPE(t.scalar_type() == p.scalar_type(), "carbon.", op, ": ", name, "[", i, "] has dtype ",
                       t.scalar_type(), " but params[", i, "] has dtype ", p.scalar_type());
    }
    TORCH_CHECK_VALUE(t.is_contiguous(), "carbon.", op, ": ", name, "[", i, "] must be contiguous");
  }
}

void check_params(const char* op, at::TensorList params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    check_float(op, "params", i, p);
    TORCH_CHECK_VALUE(p.is_cpu() || p.is_cuda(), "carbon.", op, ": tensors on ", p.device(),
                      " are not supported (CPU and CUDA only)");
    TORCH_CHECK_VALUE(p.device() == params[0].device(), "carbon.", op,
                      ": expected all tensors on one device, but params[0] is on ", params[0].device(),
                      " and params[", i, "] is on ", p.device());
    TORCH_CHECK_VALUE(p.is_contiguous(), "carbon.", op, ": params[", i, "] must be contiguous");
  }
}

// fn(T{}, Format<...>{}) for p's element type and its format (the three
// supported pairs only).
template <typename Fn>
void with_param_type(const at::Tensor& p, Fn&& fn) {
  switch (p.scalar_type()) {
    case at::kBFloat16:
      return fn(c10::BFloat16{}, Format<FormatId::kBFloat16>{});
    case at::kHalf:
      return fn(c10::Half{}, Format<FormatId::kFloat16>{});
    default:
      return fn(float{}, Format<FormatId::kFloat32>{});
  }
}

// Runs fn(i, begin, end) over the elements of every tensor i (numels[i]) in
// one parallel region rather than one per tensor: pieces of kPiece elements
// (whole blocks) split evenly over the threads. Each element's update is
// independent of the others, so the split never shows in the bits.
constexpr int64_t kPiece = 16384;

template <typename Fn>
void for_pieces(const std::vector<int64_t>& numels, Fn&& fn) {
  struct Piece {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    for (int64_t b = 0; b < numels[i]; b += kPiece) pieces.push_back({i, b, std::min(b + kPiece, numels[i])});
    total += numels[i];
  }
  auto run = [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) fn(pieces[k].tensor, pieces[k].begin, pieces[k].end);
  };
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (total < kGrain) return run(0, n);  // too little work for a parallel region
  carbon::parallel_for(0, n, 1, run);
}

// ---- the steps on the CPU.
//
// Each block of kBlock elements first takes a branch-free pass (one loop
// that vectorizes: every format, flag and constant is fixed for it) that
// rounds with NormalRounding into small temporaries and tells whether every
// result was zero or normal. Then the temporaries are copied out, or, for a
// block where some result was not (subnormal, overflow, NaN), the whole
// block is recomputed element by element with the exact rounding. Both passes
// compute the same formula and agree on every zero or normal result, so the
// bits are those of the exact path; the split into blocks and threads plays
// no role (every element is independent).
constexpr int64_t kBlock = 256;

// x86-64-v4 (AVX-512) where the CPU has it: 64-bit lanes compare into mask
// registers and narrow to 32 bits in one instruction (vpmovqd); v3 (AVX2)
// otherwise. The same IEEE operations in every clone, so the same bits.
#define CARBON_OPTIM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

template <typename F>
using Bits = typename F::Bits;
using F32 = Format<FormatId::kFloat32>;

// Bits in F of v, which must be zero or a normal number of F (as
// NormalRounding returns with ok == 1): float_format.h's integer encoding,
// except for float32, where the conversion to float does it in one
// instruction. That conversion is exact for such a v -- nothing is rounded,
// and neither v nor the result is subnormal, so the CPU's flush-to-zero /
// denormals-are-zero modes play no role: the same bits as encode(v, f).
template <typename F>
inline Bits<F> encode_exact(double v) {
  if constexpr (std::is_same_v<F, F32>) {
    const float x = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits;
  } else {
    return static_cast<Bits<F>>(encode_normal_or_zero(v, F::get()));
  }
}

// kAmsgrad: AMSGrad, whose state max_exp_avg_sq is w (read and written);
// otherwise w and wb are not touched (null).
template <typename T, typename F, bool kAmsgrad>
CARBON_OPTIM_CLONES uint32_t adam_block(const T* __restrict__ p, const T* __restrict__ g, const float* __restrict__ m,
                                        const float* __restrict__ v, const float* __restrict__ w, int64_t n,
                                        const AdamConstants& constants, Bits<F>* __restrict__ pb,
                                        uint32_t* __restrict__ mb, uint32_t* __restrict__ vb,
                                        uint32_t* __restrict__ wb) {
  const AdamConstants c = constants;
  constexpr FloatFormat f = F::get();
  uint32_t all_ok = 1;
  for (int64_t i = 0; i < n; ++i) {
    NormalRounding r;
    const double w0 = kAmsgrad ? element_value(w[i]) : 0.0;
    const AdamResult res = adam_update<kAmsgrad>(element_value(p[i]), element_value(g[i]), element_value(m[i]),
                                                 element_value(v[i]), w0, c, f, r);
    pb[i] = encode_exact<F>(res.p);
    mb[i] = encode_exact<F32>(res.m);
    vb[i] = encode_exact<F32>(res.v);
    if constexpr (kAmsgrad) wb[i] = encode_exact<F32>(res.v_max);
    all_ok &= r.ok;
  }
  return all_ok;
}

template <typename T, typename F, bool kAmsgrad>
void adam_range(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor* w, int64_t begin, int64_t end, const AdamConstants& c) {
  constexpr FloatFormat f = F::get();
  T* pp = p.mutable_data_ptr<T>();
  const T* gp = g.const_data_ptr<T>();
  float* mp = m.mutable_data_ptr<float>();
  float* vp = v.mutable_data_ptr<float>();
  float* wp = kAmsgrad ? w->mutable_data_ptr<float>() : nullptr;
#ifdef CARBON_ADAM_AVX512
  // The AVX-512 loop, whose hardware roundings are RN32 under the default
  // MXCSR and RN_T through float32 (to nearest, or to odd where the float32
  // is a midpoint of T; adam_avx512.h); the same bits as below.
  if (adam_avx512::available())
    return adam_avx512::step<kAmsgrad>(pp + begin, gp + begin, mp + begin, vp + begin, wp ? wp + begin : nullptr,
                                       end - begin, c);
#endif
#ifdef CARBON_ADAM_AVX2
  // No AVX-512 (or switched off): the AVX2 loop, the same operations and
  // roundings four lanes at a time (adam_avx2.h); the same bits as below.
  if (cpu::avx2())
    return adam_avx2::step<kAmsgrad>(pp + begin, gp + begin, mp + begin, vp + begin, wp ? wp + begin : nullptr,
                                     end - begin, c);
#endif
  Bits<F> pb[kBlock];
  uint32_t mb[kBlock], vb[kBlock], wb[kAmsgrad ? kBlock : 1];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t len = std::min(kBlock, end - b);
    if (adam_block<T, F, kAmsgrad>(pp + b, gp + b, mp + b, vp + b, wp ? wp + b : nullptr, len, c, pb, mb, vb, wb)) {
      std::memcpy(pp + b, pb, len * sizeof(T));
      std::memcpy(mp + b, mb, len * sizeof(float));
      std::memcpy(vp + b, vb, len * sizeof(float));
      if constexpr (kAmsgrad) std::memcpy(wp + b, wb, len * sizeof(float));
      continue;
    }
    for (int64_t i = b; i < b + len; ++i) adam_element<kAmsgrad>(pp, gp, mp, vp, wp, i, c, f);
  }
}

// max_exp_avg_sqs: AMSGrad's states, or empty (plain Adam / AdamW).
// constants_of(i): tensor i's constants.
template <typename ConstantsOf>
void adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
              at::TensorList max_exp_avg_sqs, ConstantsOf&& constants_of) {
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params) numels.push_back(p.numel());
  const bool amsgrad = !max_exp_avg_sqs.empty();
  for_pieces(numels, [&](size_t i, int64_t begin, int64_t end) {
    const AdamConstants& c = constants_of(i);
    with_param_type(params[i], [&](auto element, auto fmt) {
      using T = decltype(element);
      using F = decltype(fmt);
      if (amsgrad) {
        adam_range<T, F, true>(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], &max_exp_avg_sqs[i], begin, end, c);
      } else {
        adam_range<T, F, false>(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], nullptr, begin, end, c);
      }
    });
  });
}

// SgdConstants with its flags fixed at compile time (they hide the base's
// runtime members), so sgd_update's branches disappear from the loops.
template <bool kMomentum, bool kFirstStep, bool kNesterov>
struct SgdFlags : SgdConstants {
  static constexpr bool has_momentum = kMomentum, first_step = kFirstStep, nesterov = kNesterov;
  explicit SgdFlags(const SgdConstants& c) : SgdConstants(c) {}
};

template <typename T, typename F, typename C>
CARBON_OPTIM_CLONES uint32_t sgd_block(const T* __restrict__ p, const T* __restrict__ g, const float* __restrict__ b,
                                       int64_t n, const C& constants, Bits<F>* __restrict__ pb,
                                       uint32_t* __restrict__ bb) {
  const C c = constants;
  constexpr FloatFormat f = F::get();
  uint32_t all_ok = 1;
  for (int64_t i = 0; i < n; ++i) {
    NormalRounding r;
    double b0 = 0.0;
    if constexpr (C::has_momentum && !C::first_step) b0 = element_value(b[i]);
    const SgdResult res = sgd_update(element_value(p[i]), element_value(g[i]), b0, c, f, r);
    pb[i] = encode_exact<F>(res.p);
    if constexpr (C::has_momentum) bb[i] = encode_exact<F32>(res.b);
    all_ok &= r.ok;
  }
  return all_ok;
}

template <typename T, typename F, typename C>
void sgd_range(const at::Tensor& p, const at::Tensor& g, const at::Tensor* b, int64_t begin, int64_t end,
               const C& c) {
  constexpr FloatFormat f = F::get();
  T* pp = p.mutable_data_ptr<T>();
  const T* gp = g.const_data_ptr<T>();
  float* bp = C::has_momentum ? b->mutable_data_ptr<float>() : nullptr;
#ifdef CARBON_SGD_AVX512
  // float32 parameters: the AVX-512 loop, whose hardware rounding is RN32
  // under the default MXCSR (sgd_avx512.h); the same bits as below.
  if constexpr (std::is_same_v<T, float>) {
    if (adam_avx512::available())
      return sgd_avx512::step(pp + begin, gp + begin, bp ? bp + begin : nullptr, end - begin, c);
  }
#endif
#ifdef CARBON_SGD_AVX2
  // float32 without AVX-512 (or with it switched off): the AVX2 loop
  // (sgd_avx2.h); the same bits as below.
  if constexpr (std::is_same_v<T, float>) {
    if (cpu::avx2()) return sgd_avx2::step(pp + begin, gp + begin, bp ? bp + begin : nullptr, end - begin, c);
  }
#endif
  Bits<F> pbits[kBlock];
  uint32_t bbits[kBlock];
  for (int64_t blk = begin; blk < end; blk += kBlock) {
    const int64_t len = std::min(kBlock, end - blk);
    if (sgd_block<T, F>(pp + blk, gp + blk, bp ? bp + blk : nullptr, len, c, pbits, bbits)) {
      std::memcpy(pp + blk, pbits, len * sizeof(T));
      if (bp) std::memcpy(bp + blk, bbits, len * sizeof(float));
      continue;
    }
    for (int64_t i = blk; i < blk + len; ++i) {
      const double b0 = (C::has_momentum && !C::first_step) ? load(bp, i) : 0.0;
      const SgdResult r = sgd_update(load(pp, i), load(gp, i), b0, c, f);
      if (bp) store_value(bp, i, r.b, state_format());
      store_value(pp, i, r.p, f);
    }
  }
}

template <typename C>
void sgd_cpu_flags(at::TensorList params, at::TensorList grads, at::TensorList buffers, const C& c) {
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params) numels.push_back(p.numel());
  for_pieces(numels, [&](size_t i, int64_t begin, int64_t end) {
    const at::Tensor* b = C::has_momentum ? &buffers[i] : nullptr;
    with_param_type(params[i], [&](auto element, auto fmt) {
      sgd_range<decltype(element), decltype(fmt)>(params[i], grads[i], b, begin, end, c);
    });
  });
}

void sgd_cpu(at::TensorList params, at::TensorList grads, at::TensorList buffers, const SgdConstants& c) {
  if (!c.has_momentum) return sgd_cpu_flags(params, grads, buffers, SgdFlags<false, false, false>(c));
  if (c.first_step) {
    if (c.nesterov) return sgd_cpu_flags(params, grads, buffers, SgdFlags<true, true, true>(c));
    return sgd_cpu_flags(params, grads, buffers, SgdFlags<true, true, false>(c));
  }
  if (c.nesterov) return sgd_cpu_flags(params, grads, buffers, SgdFlags<true, false, true>(c));
  return sgd_cpu_flags(params, grads, buffers, SgdFlags<true, false, false>(c));
}

// ---- sum of squares on the CPU: fixed chunks, eight chains per chunk.
constexpr int64_t kChunk = 8192;

template <typename T>
CARBON_OPTIM_CLONES double chunk_sum_of_squares(const T* x, int64_t n) {
  double s[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) s[l] = s[l] + square_of(x, k + l);
  for (; k < n; ++k) s[0] = s[0] + square_of(x, k);
  return fold_chains(s);
}

constexpr int64_t kChunkDepth = chain_depth(kChunk);

double square_at(const at::Tensor& t, int64_t i) {
  double v = 0.0;
  with_element_type(t.scalar_type(), [&](auto element) {
    using T = decltype(element);
    v = square_of(t.const_data_ptr<T>(), i);
  });
  return v;
}

at::Tensor sum_squares_cpu(at::TensorList tensors, bool take_sqrt) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  struct Chunk {
    size_t tensor;
    int64_t begin, len;
  };
  std::vector<Chunk> chunks;
  int64_t n = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t numel = tensors[t].numel();
    for (int64_t b = 0; b < numel; b += kChunk) chunks.push_back({t, b, std::min(kChunk, numel - b)});
    n += numel;
  }
  std::vector<double> partial(chunks.size());
  carbon::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& ch = chunks[c];
      with_element_type(tensors[ch.tensor].scalar_type(), [&](auto element) {
        using T = decltype(element);
        partial[c] = chunk_sum_of_squares(tensors[ch.tensor].const_data_ptr<T>() + ch.begin, ch.len);
      });
    }
  });
  double sum = 0.0;  // chunk partials added in order
  for (const double s : partial) sum = sum + s;
  const int64_t depth = kChunkDepth + static_cast<int64_t>(chunks.size()) + 1;
  double value;
  if (n == 0) {
    value = 0.0;
  } else if (!reduce_round_fast(sum, sum, n, depth, false, f, &value)) {  // squares: |x| sum == sum
    // Tiers 2 and 3 over the concatenation of the tensors (value_at is
    // called with k = 0, 1, ..., n - 1 in order, in each of two passes).
    size_t cur = 0;
    int64_t start = 0;
    auto value_at = [&](int64_t k) {
      if (k < start) cur = 0, start = 0;
      while (k >= start + tensors[cur].numel()) start += tensors[cur++].numel();
      return square_at(tensors[cur], k - start);
    };
    value = reduce_exact_values(n, value_at, sum, false, f);
  }
  if (take_sqrt) value = norm_from_sum_of_squares(value);
  at::Tensor out = at::empty({}, at::TensorOptions().dtype(at::kFloat));
  store_value(out.mutable_data_ptr<float>(), 0, value, f);
  return out;
}

// ---- clip_scale_ on the CPU: g = RN_F(g * coef), in place.
//
// coef == 1 (the norm is within max_norm, the common case): g * 1 is g for
// every value but NaN, and RN_F of a value of F is itself, so the only bits
// that change are NaNs, which become F's one NaN. A scan finds them (no
// write at all without them).
template <typename F>
CARBON_OPTIM_CLONES uint32_t count_nans(const Bits<F>* __restrict__ x, int64_t n) {
  constexpr FloatFormat f = F::get();
  const uint32_t magnitude = (f.total_bits == 32 ? 0xFFFFFFFFu : 0xFFFFu) >> 1;
  const uint32_t inf = ((1u << (f.total_bits - f.precision)) - 1u) << (f.precision - 1);
  uint32_t nans = 0;
  for (int64_t i = 0; i < n; ++i) nans += static_cast<uint32_t>((x[i] & magnitude) > inf);
  return nans;
}

// Otherwise the branch-free rounding of a block into temporaries, as in the
// steps above; a block with a result that is not zero or normal is redone
// with the exact rounding.
template <typename T, typename F>
CARBON_OPTIM_CLONES uint32_t clip_block(const T* __restrict__ x, int64_t n, double coef, Bits<F>* __restrict__ out) {
  constexpr FloatFormat f = F::get();
  uint32_t all_ok = 1;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t ok;
    const double r = round_normal_or_zero(element_value(x[i]) * coef, f, &ok);
    out[i] = encode_exact<F>(r);
    all_ok &= ok;
  }
  return all_ok;
}

template <typename T, typename F>
void clip_range(const at::Tensor& g, int64_t begin, int64_t end, double coef) {
  constexpr FloatFormat f = F::get();
  T* gp = g.mutable_data_ptr<T>();
  Bits<F>* x = reinterpret_cast<Bits<F>*>(gp);
  Bits<F> out[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t len = std::min(kBlock, end - b);
    if (coef == 1.0) {
      if (count_nans<F>(x + b, len) == 0) continue;
      for (int64_t i = b; i < b + len; ++i)
        if (is_nan(decode(x[i], f))) x[i] = static_cast<Bits<F>>(f.nan_bits);
      continue;
    }
    if (clip_block<T, F>(gp + b, len, coef, out)) {
      std::memcpy(x + b, out, len * sizeof(Bits<F>));
      continue;
    }
    for (int64_t i = b; i < b + len; ++i) {
      const double scaled = load(gp, i) * coef;
      store_value(gp, i, round_double(scaled, f), f);
    }
  }
}

}  // namespace

namespace {

void check_adam_lists(const char* op, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                      at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs) {
  check_params(op, params);
  check_list(op, params, grads, "grads", false);
  check_list(op, params, exp_avgs, "exp_avgs", true);
  check_list(op, params, exp_avg_sqs, "exp_avg_sqs", true);
  // AMSGrad: one max_exp_avg_sq per parameter; plain Adam / AdamW: none.
  if (!max_exp_avg_sqs.empty()) check_list(op, params, max_exp_avg_sqs, "max_exp_avg_sqs", true);
}

// The constants that do not depend on lr or t (set_lr_constants sets the others).
AdamConstants adam_constants(double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                             bool maximize) {
  AdamConstants c;
  c.beta1 = beta1;
  c.one_minus_beta1 = 1.0 - beta1;
  c.beta2 = beta2;
  c.one_minus_beta2 = 1.0 - beta2;
  c.eps = eps;
  c.weight_decay = weight_decay;
  c.grad_sign = maximize ? kSignBit : 0;
  c.decoupled_mask = decoupled ? ~uint64_t{0} : 0;
  c.l2_mask = (!decoupled && weight_decay != 0.0) ? ~uint64_t{0} : 0;
  return c;
}

}  // namespace

void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList max_exp_avg_sqs, double lr, double beta1, double beta2, double eps, double weight_decay,
                double bias_correction1, double bias_correction2_sqrt, bool decoupled, bool maximize) {
  check_adam_lists("adam_step_", params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs);
  AdamConstants c = adam_constants(beta1, beta2, eps, weight_decay, decoupled, maximize);
  set_lr_constants(c, lr, bias_correction1, bias_correction2_sqrt);
  if (params.empty()) return;
  if (params[0].is_cpu())
    return adam_cpu(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, [&](size_t) -> const AdamConstants& {
      return c;
    });
#ifdef CARBON_WITH_CUDA
  adam_step_cuda(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, {}, c, AdamStepSource{});
#endif
}

void adam_step_capturable_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps,
                           double lr, const std::optional<at::Tensor>& lr_tensor, double beta1, double beta2,
                           double eps, double weight_decay, bool decoupled, bool maximize) {
  const char* op = "adam_step_capturable_";
  check_adam_lists(op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs);
  TORCH_CHECK_VALUE(steps.size() == params.size(), "carbon.", op, ": expected as many steps as params (",
                    params.size(), "), got ", steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    TORCH_CHECK_TYPE(steps[i].scalar_type() == at::kFloat && steps[i].numel() == 1, "carbon.", op, ": steps[", i,
                     "] must be a one-element float32 tensor, got ", steps[i].scalar_type(), " with ",
                     steps[i].numel(), " elements");
    TORCH_CHECK_VALUE(steps[i].device() == params[i].device(), "carbon.", op, ": steps[", i, "] is on ",
                      steps[i].device(), " but params[", i, "] is on ", params[i].device());
  }
  AdamStepSource source;
  source.lr = lr;
  if (lr_tensor.has_value()) {
    const at::Tensor& t = *lr_tensor;
    TORCH_CHECK_TYPE((t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) && t.numel() == 1, "carbon.",
                     op, ": lr must be a one-element float32 or float64 tensor, got ", t.scalar_type(), " with ",
                     t.numel(), " elements");
    TORCH_CHECK_VALUE(params.empty() || t.is_cpu() || t.device() == params[0].device(), "carbon.", op,
                      ": lr is on ", t.device(), " but the params are on ",
                      params.empty() ? t.device() : params[0].device());
    if (t.is_cpu()) {  // read here: a host value (no device synchronization)
      source.lr = t.scalar_type() == at::kFloat ? static_cast<double>(*t.const_data_ptr<float>())
                                                : *t.const_data_ptr<double>();
    } else if (t.scalar_type() == at::kFloat) {
      source.lr32 = t.const_data_ptr<float>();
    } else {
      source.lr64 = t.const_data_ptr<double>();
    }
  }
  const AdamConstants base = adam_constants(beta1, beta2, eps, weight_decay, decoupled, maximize);
  if (params.empty()) return;
  if (params[0].is_cpu()) {
    std::vector<AdamConstants> constants;
    for (const at::Tensor& step : steps) {
      AdamStepSource s = source;
      s.step = step.const_data_ptr<float>();
      constants.push_back(constants_at(base, s));
    }
    return adam_cpu(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                    [&](size_t i) -> const AdamConstants& { return constants[i]; });
  }
#ifdef CARBON_WITH_CUDA
  adam_step_cuda(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, base, source);
#endif
}

void sgd_step_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
               double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
               bool first_step) {
  const char* op = "sgd_step_";
  check_params(op, params);
  check_list(op, params, grads, "grads", false);
  const bool has_momentum = momentum != 0.0;
  if (has_momentum) {
    check_list(op, params, momentum_buffers, "momentum_buffers", true);
  } else {
    TORCH_CHECK_VALUE(momentum_buffers.empty(), "carbon.", op, ": momentum_buffers must be empty when momentum is 0");
  }
  const SgdConstants c{lr, momentum, 1.0 - dampening, weight_decay, maximize ? kSignBit : 0, nesterov, first_step,
                       has_momentum};
  if (params.empty()) return;
  if (params[0].is_cpu()) return sgd_cpu(params, grads, momentum_buffers, c);
#ifdef CARBON_WITH_CUDA
  sgd_step_cuda(params, grads, momentum_buffers, c);
#endif
}

at::Tensor sum_squares(at::TensorList tensors, bool sqrt) {
  const char* op = "sum_squares";
  TORCH_CHECK_VALUE(!tensors.empty(), "carbon.", op, ": expected at least one tensor");
  int64_t n = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_float(op, "tensors", i, tensors[i]);
    TORCH_CHECK_VALUE(tensors[i].device() == tensors[0].device(), "carbon.", op,
                      ": expected all tensors on one device, but tensors[0] is on ", tensors[0].device(),
                      " and tensors[", i, "] is on ", tensors[i].device());
    n += tensors[i].numel();
  }
  // Fewer than 2^31 terms keeps the exact accumulator's limbs from overflowing.
  TORCH_CHECK_VALUE(n < (int64_t(1) << 31) - 1, "carbon.", op, ": at most 2^31 - 2 elements in all are supported");
  std::vector<at::Tensor> contiguous;
  for (const at::Tensor& t : tensors) contiguous.push_back(t.contiguous());
  if (tensors[0].is_cpu()) return sum_squares_cpu(contiguous, sqrt);
#ifdef CARBON_WITH_CUDA
  return sum_squares_cuda(contiguous, sqrt);
#else
  TORCH_CHECK(false, "carbon.", op, ": built without CUDA");
#endif
}

void clip_scale_(at::TensorList grads, const at::Tensor& total_norm, double max_norm, double eps) {
  const char* op = "clip_scale_";
  for (size_t i = 0; i < grads.size(); ++i) {
    check_float(op, "grads", i, grads[i]);
    TORCH_CHECK_VALUE(grads[i].device() == total_norm.device(), "carbon.", op, ": grads[", i, "] is on ",
                      grads[i].device(), " but total_norm is on ", total_norm.device());
    TORCH_CHECK_VALUE(grads[i].is_contiguous(), "carbon.", op, ": grads[", i, "] must be contiguous");
  }
  TORCH_CHECK_TYPE(total_norm.scalar_type() == at::kFloat && total_norm.numel() == 1, "carbon.", op,
                   ": total_norm must be a one-element float32 tensor");
  if (total_norm.is_cpu()) {
    const double total = load(total_norm.const_data_ptr<float>(), 0);
    const double coef = clip_coefficient(total, max_norm, eps);
    std::vector<int64_t> numels;
    for (const at::Tensor& g : grads) numels.push_back(g.numel());
    for_pieces(numels, [&](size_t i, int64_t begin, int64_t end) {
      with_param_type(grads[i], [&](auto element, auto fmt) {
        clip_range<decltype(element), decltype(fmt)>(grads[i], begin, end, coef);
      });
    });
    return;
  }
#ifdef CARBON_WITH_CUDA
  clip_scale_cuda(grads, total_norm, max_norm, eps);
#endif
}

}  // namespace carbon
