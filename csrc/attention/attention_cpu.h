// Attention's fused ops (schemas in registration.cpp). On the CPU each is
// one kernel over rows, in place of the ops it fuses; on other devices it
// runs those ops one by one. Either way its bits are the composition's
// (docs/contract.md §9), which is what carbon/attention.py composes.
#pragma once

#include <ATen/core/Tensor.h>

namespace carbon {

// softmax(attention_logits(bmm(q, k^T, float32), scale, mask, causal), -1):
// the probabilities of attention, float32 [B, L, S], from q [B, L, E] and
// k [B, S, E]. On the CPU the scores live in reused scratch memory and, when
// causal, only their entries j <= i (the ones attention_logits reads) are
// computed; each row's logits go to softmax while in the cache.
at::Tensor attention_probs(const at::Tensor& q, const at::Tensor& k, double scale,
                           const std::optional<at::Tensor>& mask, bool causal);

// The gradient of the scores from the gradient of attention_probs's output:
// attention_logits(softmax_backward(grad, probs, -1, float32), scale), the
// two backward steps of the composition without a mask.
at::Tensor attention_probs_backward(const at::Tensor& grad, const at::Tensor& probs, double scale);

}  // namespace carbon
