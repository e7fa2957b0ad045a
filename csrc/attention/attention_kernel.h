// The one elementwise step of Carbon's attention, shared by the CPU and CUDA
// kernels (docs/contract.md §9): the logits
//     z_ij = RN32( (s_ij ⊗ scale) ⊕ m_ij ),   -inf where causal and j > i,
// from the exactly rounded scores s = RN32(q k^T), in IEEE fp64 operations
// and one rounding; without a mask m = -0, the identity of addition (so a
// -0 score stays -0). Its gradient with respect to s is the same step with no
// mask: RN32(dz ⊗ scale).
#pragma once

#include <cmath>

#include "../exact/float_format.h"

namespace carbon {

CARBON_HD double attention_logit(double s, double scale, double mask, bool masked_out) {
  if (masked_out) return -INFINITY;
  return round_double(s * scale + mask, Format<FormatId::kFloat32>::get());
}

}  // namespace carbon
