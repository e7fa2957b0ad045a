// attention_logits: input checks and the CPU kernel (an elementwise loop).
#include "attention.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "../dtypes.h"
#include "../reduce/reduce_kernel.h"
#include "attention_kernel.h"

namespace carbon {

at::Tensor attention_logits(const at::Tensor& s, double scale, const std::optional<at::Tensor>& mask, bool causal) {
  const char* op = "attention_logits";
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "carbon.", op, ": scores must be float32, got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.is_cpu() || s.is_cuda(), "carbon.", op, ": tensors on ", s.device(),
                    " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(s.dim() == 3, "carbon.", op, ": expected scores [B, Tq, Tk], got shape ", s.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "carbon.", op, ": scale must be finite, got ", scale);
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    check_supported_dtype(op, "mask", *mask);
    TORCH_CHECK_VALUE(mask->device() == s.device(), "carbon.", op,
                      ": expected all tensors on one device, but scores are on ", s.device(), " and mask is on ",
                      mask->device());
    TORCH_CHECK_VALUE(mask->sizes() == s.sizes(), "carbon.", op, ": mask has shape ", mask->sizes(),
                      " but the scores have shape ", s.sizes());
    m = *mask;
  }
  const at::Tensor sc = s.contiguous();
  at::Tensor out = at::empty_like(sc);
  if (out.numel() == 0) return out;
  if (sc.is_cpu()) {
    attention_logits_cpu(sc, scale, m, causal, out);
  } else {
#ifdef CARBON_WITH_CUDA
    attention_logits_cuda(sc, scale, m, causal, out);
#endif
  }
  return out;
}

namespace {

// One row of logits: z_j = attention_logit(s_j, scale, m_j, causal && j > i).
// The first pass rounds with branch-free integer operations, so it vectorizes
// (round_double's normal-range path: RN32 of a double whose magnitude lies in
// float32's normal range is round_normal_bits, and results at or above
// 2^128, and infinities, are +-inf; a signed zero is kept as it is, as
// round_double keeps it). Any other value (NaN, or a magnitude below
// float32's smallest normal) sends the row through attention_logit itself,
// which is the definition.
template <typename MaskAt>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void logits_row(const float* in, double scale,
                                                                           MaskAt mask_at, int64_t limit,
                                                                           int64_t Tk, float* o) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  uint32_t ok = 1;
  for (int64_t j = 0; j < limit; ++j) {
    const double v = static_cast<double>(in[j]) * scale + mask_at(j);
    const uint64_t u = double_to_bits(v), mag = u & ~kSignBit;
    const uint64_t rounded = round_normal_bits(mag, f);
    const bool zero = mag == 0;
    const bool big = (mag >= normal_min_bits(f)) & (mag <= kExpMask);  // normal range, overflow or inf
    ok &= (zero | big) ? 1u : 0u;
    const uint32_t magbits = zero ? 0u : (rounded >= overflow_bits(f) ? 0x7F800000u : encode_normal(rounded, f));
    const uint32_t bits = (static_cast<uint32_t>(u >> 63) << 31) | magbits;
    std::memcpy(o + j, &bits, sizeof bits);
  }
  if (!ok)
    for (int64_t j = 0; j < limit; ++j) o[j] = static_cast<float>(attention_logit(in[j], scale, mask_at(j), false));
  for (int64_t j = limit; j < Tk; ++j) o[j] = -INFINITY;  // attention_logit's causal case
}

}  // namespace

void attention_logits_cpu(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out) {
  const int64_t B = s.size(0), Tq = s.size(1), Tk = s.size(2);
  const float* in = s.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  auto run = [&](auto mask_row) {
    at::parallel_for(0, B * Tq, std::max<int64_t>(1, 16384 / std::max<int64_t>(Tk, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / Tq, i = r % Tq;
        const int64_t limit = causal ? std::min(i + 1, Tk) : Tk;  // entries j > i are masked out
        logits_row(in + r * Tk, scale, mask_row(b, i), limit, Tk, o + r * Tk);
      }
    });
  };
  // Without a mask m = -0: x + -0 == x, signed zeros included.
  if (!mask.defined()) return run([](int64_t, int64_t) { return [](int64_t) { return -0.0; }; });
  with_element_type(mask.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* m = mask.const_data_ptr<T>();
    const int64_t sb = mask.stride(0), sq = mask.stride(1), sk = mask.stride(2);
    run([=](int64_t b, int64_t i) {
      const T* row = m + b * sb + i * sq;
      return [=](int64_t j) { return element_value(row[j * sk]); };
    });
  });
}

}  // namespace carbon
