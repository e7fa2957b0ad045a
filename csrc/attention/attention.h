// Host-side interface of attention's own kernel (the rest of attention is
// carbon.bmm and carbon.softmax, composed in carbon/attention.py).
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

// z = RN32((s * scale) + mask), -inf above the diagonal when causal, for
// float32 scores s [B, Tq, Tk]; mask (optional) has the same sizes, any
// strides (broadcast dimensions have stride 0), any supported dtype.
at::Tensor attention_logits(const at::Tensor& s, double scale, const std::optional<at::Tensor>& mask, bool causal);

void attention_logits_cpu(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void attention_logits_cuda(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out);
#endif

}  // namespace carbon
