"""Carbon's exact normalizations: ``layer_norm`` and ``rms_norm``.

Each row's statistics are exact sums rounded once to float32 (the mean
RN32(sum x / n), the variance RN32(sum (x - mean)^2 / n) with the real
square, the mean square RN32(sum x^2 / n)); everything after them is a fixed
sequence of IEEE float64 operations and roundings. So the bits depend only on
the row's values: not on the batch, the layout, the thread count or the
device. docs/contract.md §7 is the precise definition (gradients, special
values, empty inputs).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["layer_norm", "rms_norm"]

Shape = Union[int, Sequence[int], torch.Size]


def _shape(normalized_shape: Shape) -> List[int]:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return [int(s) for s in normalized_shape]


def layer_norm(x: Tensor, normalized_shape: Shape, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.layer_norm`` semantics, bit-exact.

    Per row (the trailing ``normalized_shape`` dims): mean = RN32(sum x / n),
    var = RN32(sum (x - mean)^2 / n) (exact), rstd = RN32(1 / RN32(sqrt(RN32(var
    + RN32(eps))))), xhat = RN32((x - mean) * rstd) and y = RN((xhat * w) + b) in
    x's dtype (fp64 operations). ``weight`` and ``bias`` must have x's dtype
    and shape ``normalized_shape``. Differentiable in x, weight and bias."""
    return torch.ops.carbon.layer_norm(x, _shape(normalized_shape), weight, bias, float(eps))[0]


def rms_norm(x: Tensor, normalized_shape: Shape, weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """``torch.nn.functional.rms_norm`` semantics, bit-exact.

    Per row: ms = RN32(sum x^2 / n) (exact), rstd = RN32(1 / RN32(sqrt(RN32(ms +
    RN32(eps))))), xhat = RN32(x * rstd), y = RN(xhat * w) in x's dtype. ``eps``
    None means torch's default, the float32 machine epsilon 2^-23 (for every
    dtype, as torch does). Differentiable in x and weight."""
    return torch.ops.carbon.rms_norm(x, _shape(normalized_shape), weight, None if eps is None else float(eps))[0]
