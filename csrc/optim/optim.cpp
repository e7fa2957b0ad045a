// The optimizer ops: input checks, host constants, and the CPU loops over
// optim_kernel.h's per-element updates (the CUDA kernels are in
// optim_cuda.cu). Every element is updated independently, so the split over
// threads plays no role; the sum of squares uses fixed chunks and the tiers
// of reduce_kernel.h, whose result does not depend on the split either.
#include "optim.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

#include "../dtypes.h"
#include "../reduce/chain_tree.h"

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

template <typename Fn>
void with_param_type(const at::Tensor& p, Fn&& fn) {
  with_element_type(p.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format_of(p.scalar_type()), [&](auto fmt) { fn(T{}, decltype(fmt){}); });
  });
}

// float32 parameters take a fast path: a branch-free pass over a block with
// NormalRounding into temporaries (meant to vectorize; gcc does not yet), then a commit that recomputes with
// the exact rounding every element whose results left the normal range
// (zeros, subnormals, overflow, NaN). Both compute the same formula, so the
// bits are those of the exact path.
constexpr int64_t kBlock = 256;

CARBON_HD uint32_t encode_normal_f32(double v) {
  const uint64_t u = double_to_bits(v);
  return static_cast<uint32_t>((u >> 63) << 31) | encode_normal(u & ~kSignBit, state_format());
}

__attribute__((target_clones("avx2", "default"))) void adam_block_f32(
    const float* __restrict__ p, const float* __restrict__ g, const float* __restrict__ m,
    const float* __restrict__ v, int64_t n, const AdamConstants& constants, uint32_t* __restrict__ pb,
    uint32_t* __restrict__ mb, uint32_t* __restrict__ vb, uint8_t* __restrict__ ok) {
  const AdamConstants c = constants;
  const FloatFormat f = state_format();
  for (int64_t i = 0; i < n; ++i) {
    NormalRounding r;
    const AdamResult res = adam_update(static_cast<double>(p[i]), static_cast<double>(g[i]),
                                       static_cast<double>(m[i]), static_cast<double>(v[i]), c, f, r);
    pb[i] = encode_normal_f32(res.p);
    mb[i] = encode_normal_f32(res.m);
    vb[i] = encode_normal_f32(res.v);
    ok[i] = r.ok;
  }
}

void adam_cpu_f32(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                  const AdamConstants& c) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  float* pp = p.mutable_data_ptr<float>();
  const float* gp = g.const_data_ptr<float>();
  float* mp = m.mutable_data_ptr<float>();
  float* vp = v.mutable_data_ptr<float>();
  at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
    uint32_t pb[kBlock], mb[kBlock], vb[kBlock];
    uint8_t ok[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t len = std::min(kBlock, end - b);
      adam_block_f32(pp + b, gp + b, mp + b, vp + b, len, c, pb, mb, vb, ok);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t i = b + k;
        if (ok[k]) {
          reinterpret_cast<uint32_t*>(pp)[i] = pb[k];
          reinterpret_cast<uint32_t*>(mp)[i] = mb[k];
          reinterpret_cast<uint32_t*>(vp)[i] = vb[k];
        } else {
          const AdamResult r = adam_update(load(pp, i), load(gp, i), load(mp, i), load(vp, i), c, f);
          store_value(mp, i, r.m, state_format());
          store_value(vp, i, r.v, state_format());
          store_value(pp, i, r.p, f);
        }
      }
    }
  });
}

void adam_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
              const AdamConstants& c) {
  if (p.scalar_type() == at::kFloat) return adam_cpu_f32(p, g, m, v, c);
  with_param_type(p, [&](auto element, auto fmt) {
    using T = decltype(element);
    constexpr FloatFormat f = decltype(fmt)::get();
    T* pp = p.mutable_data_ptr<T>();
    const T* gp = g.const_data_ptr<T>();
    float* mp = m.mutable_data_ptr<float>();
    float* vp = v.mutable_data_ptr<float>();
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const AdamResult r = adam_update(load(pp, i), load(gp, i), load(mp, i), load(vp, i), c, f);
        store_value(mp, i, r.m, state_format());
        store_value(vp, i, r.v, state_format());
        store_value(pp, i, r.p, f);
      }
    });
  });
}

__attribute__((target_clones("avx2", "default"))) void sgd_block_f32(
    const float* __restrict__ p, const float* __restrict__ g, const float* __restrict__ b, int64_t n,
    const SgdConstants& constants, uint32_t* __restrict__ pb, uint32_t* __restrict__ bb, uint8_t* __restrict__ ok) {
  const SgdConstants c = constants;
  const FloatFormat f = state_format();
  for (int64_t i = 0; i < n; ++i) {
    NormalRounding r;
    const double b0 = (b && !c.first_step) ? static_cast<double>(b[i]) : 0.0;
    const SgdResult res = sgd_update(static_cast<double>(p[i]), static_cast<double>(g[i]), b0, c, f, r);
    pb[i] = encode_normal_f32(res.p);
    bb[i] = encode_normal_f32(res.b);
    ok[i] = r.ok;
  }
}

void sgd_cpu_f32(const at::Tensor& p, const at::Tensor& g, const at::Tensor* b, const SgdConstants& c) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  float* pp = p.mutable_data_ptr<float>();
  const float* gp = g.const_data_ptr<float>();
  float* bp = b ? b->mutable_data_ptr<float>() : nullptr;
  at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
    uint32_t pbits[kBlock], bbits[kBlock];
    uint8_t ok[kBlock];
    for (int64_t blk = begin; blk < end; blk += kBlock) {
      const int64_t len = std::min(kBlock, end - blk);
      sgd_block_f32(pp + blk, gp + blk, bp ? bp + blk : nullptr, len, c, pbits, bbits, ok);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t i = blk + k;
        if (ok[k]) {
          reinterpret_cast<uint32_t*>(pp)[i] = pbits[k];
          if (bp) reinterpret_cast<uint32_t*>(bp)[i] = bbits[k];
        } else {
          const double b0 = (bp && !c.first_step) ? load(bp, i) : 0.0;
          const SgdResult r = sgd_update(load(pp, i), load(gp, i), b0, c, f);
          if (bp) store_value(bp, i, r.b, state_format());
          store_value(pp, i, r.p, f);
        }
      }
    }
  });
}

void sgd_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor* b, const SgdConstants& c) {
  if (p.scalar_type() == at::kFloat) return sgd_cpu_f32(p, g, b, c);
  with_param_type(p, [&](auto element, auto fmt) {
    using T = decltype(element);
    constexpr FloatFormat f = decltype(fmt)::get();
    T* pp = p.mutable_data_ptr<T>();
    const T* gp = g.const_data_ptr<T>();
    float* bp = b ? b->mutable_data_ptr<float>() : nullptr;
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const double b0 = (bp && !c.first_step) ? load(bp, i) : 0.0;
        const SgdResult r = sgd_update(load(pp, i), load(gp, i), b0, c, f);
        if (bp) store_value(bp, i, r.b, state_format());
        store_value(pp, i, r.p, f);
      }
    });
  });
}

// ---- sum of squares on the CPU: fixed chunks, eight chains per chunk.
constexpr int64_t kChunk = 8192;

template <typename T>
double chunk_sum_of_squares(const T* x, int64_t n) {
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
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
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

}  // namespace

void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                double lr, double beta1, double beta2, double eps, double weight_decay, double bias_correction1,
                double bias_correction2_sqrt, bool decoupled, bool maximize) {
  const char* op = "adam_step_";
  check_params(op, params);
  check_list(op, params, grads, "grads", false);
  check_list(op, params, exp_avgs, "exp_avgs", true);
  check_list(op, params, exp_avg_sqs, "exp_avg_sqs", true);
  AdamConstants c;
  c.step_size = lr / bias_correction1;
  c.beta1 = beta1;
  c.one_minus_beta1 = 1.0 - beta1;
  c.beta2 = beta2;
  c.one_minus_beta2 = 1.0 - beta2;
  c.eps = eps;
  c.weight_decay = weight_decay;
  const double lr_wd = lr * weight_decay;
  c.decay = 1.0 - lr_wd;
  c.bias_correction2_sqrt = bias_correction2_sqrt;
  c.decoupled = decoupled;
  c.maximize = maximize;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    if (params[i].is_cpu()) {
      adam_cpu(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], c);
    } else {
#ifdef CARBON_WITH_CUDA
      adam_step_cuda(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], c);
#endif
    }
  }
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
  const SgdConstants c{lr, momentum, 1.0 - dampening, weight_decay, nesterov, maximize, first_step, has_momentum};
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    const at::Tensor* b = has_momentum ? &momentum_buffers[i] : nullptr;
    if (params[i].is_cpu()) {
      sgd_cpu(params[i], grads[i], b, c);
    } else {
#ifdef CARBON_WITH_CUDA
      sgd_step_cuda(params[i], grads[i], b, c);
#endif
    }
  }
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
    for (const at::Tensor& g : grads) {
      with_param_type(g, [&](auto element, auto fmt) {
        using T = decltype(element);
        constexpr FloatFormat f = decltype(fmt)::get();
        T* gp = g.mutable_data_ptr<T>();
        at::parallel_for(0, g.numel(), kGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const double scaled = load(gp, i) * coef;
            store_value(gp, i, round_double(scaled, f), f);
          }
        });
      });
    }
    return;
  }
#ifdef CARBON_WITH_CUDA
  clip_scale_cuda(grads, total_norm, max_norm, eps);
#endif
}

}  // namespace carbon
