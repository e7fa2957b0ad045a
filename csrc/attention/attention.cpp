// attention_logits: input checks and the CPU kernel (an elementwise loop).
#include "attention.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

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

void attention_logits_cpu(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out) {
  const int64_t B = s.size(0), Tq = s.size(1), Tk = s.size(2);
  const float* in = s.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  auto run = [&](auto mask_value) {
    at::parallel_for(0, B * Tq, std::max<int64_t>(1, 16384 / std::max<int64_t>(Tk, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / Tq, i = r % Tq;
        for (int64_t j = 0; j < Tk; ++j)
          o[r * Tk + j] = static_cast<float>(attention_logit(in[r * Tk + j], scale, mask_value(b, i, j), causal && j > i));
      }
    });
  };
  if (!mask.defined()) return run([](int64_t, int64_t, int64_t) { return -0.0; });  // -0: x + -0 == x, signed zeros included
  with_element_type(mask.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* m = mask.const_data_ptr<T>();
    const int64_t sb = mask.stride(0), sq = mask.stride(1), sk = mask.stride(2);
    run([=](int64_t b, int64_t i, int64_t j) { return element_value(m[b * sb + i * sq + j * sk]); });
  });
}

}  // namespace carbon
