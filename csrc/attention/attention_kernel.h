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

// A NaN result (a NaN score or mask, or +inf + -inf) is §1's canonical NaN,
// whatever sign and payload the hardware's arithmetic gave it (x86 makes
// inf + -inf a negative NaN and keeps a NaN operand's sign).
CARBON_HD double attention_logit(double s, double scale, double mask, bool masked_out) {
  if (masked_out) return -INFINITY;
  const double z = s * scale + mask;
  if (z != z) return canonical_nan();
  return round_double(z, Format<FormatId::kFloat32>::get());
}

}  // namespace carbon
