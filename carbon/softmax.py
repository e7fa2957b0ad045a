"""Carbon's softmax family: ``softmax``, ``log_softmax`` and ``cross_entropy``.

Each is defined in docs/contract.md §8 as a fixed sequence of correctly
rounded steps around one exact sum per row, so its bits depend only on the
row's values: not on the other rows, the thread count, the layout or the
device. Gradients are defined the same way.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["softmax", "log_softmax", "cross_entropy"]

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def softmax(x: Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Softmax over ``dim``: RN(e_j / S) with e_j = carbon.exp(RN32(x_j - max))
    and S the correctly rounded exact sum of the e_j. ``dtype`` is the output
    dtype (default: x's); the computation always starts from x's exact values.
    A row of only -inf gives zeros; a row with NaN or +inf gives NaN."""
    return torch.ops.carbon.softmax(x, dim, dtype)


def log_softmax(x: Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Log-softmax over ``dim``: RN(d_j - L) with d_j = RN32(x_j - max) and
    L = carbon.log(S). A row of only -inf gives -inf; a row with NaN or +inf
    gives NaN."""
    return torch.ops.carbon.log_softmax(x, dim, dtype)


def cross_entropy(
    input: Tensor,
    target: Tensor,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """``torch.nn.functional.cross_entropy`` with class-index targets: input
    [C], [N, C] or [N, C, d1, ...]; target of int64 class indices. The loss
    of each row comes from carbon's log_softmax; ``mean`` is the exact sum of
    the row losses divided by the number of rows whose target is not
    ``ignore_index``, rounded once (NaN when every row is ignored)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"carbon.cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if target.is_floating_point():
        raise TypeError("carbon.cross_entropy: only class-index targets (int64) are supported, not class probabilities")
    if input.dim() == 0:
        raise ValueError("carbon.cross_entropy: input must have a class dimension, got a 0-dim tensor")
    if input.dim() == 1:
        rows, flat_target = input.unsqueeze(0), target.reshape(1) if target.dim() == 0 else target
        out_shape: tuple = ()
    else:
        expected = (input.shape[0],) + tuple(input.shape[2:])
        if tuple(target.shape) != expected:
            raise ValueError(
                f"carbon.cross_entropy: target has shape {tuple(target.shape)}, expected {expected} for input of shape {tuple(input.shape)}"
            )
        rows = input if input.dim() == 2 else input.movedim(1, -1).reshape(-1, input.shape[1])
        flat_target = target.reshape(-1)
        out_shape = tuple(target.shape)
    loss, _, _ = torch.ops.carbon.cross_entropy(
        rows, flat_target, _REDUCTIONS[reduction], ignore_index, float(label_smoothing)
    )
    return loss.reshape(out_shape) if reduction == "none" else loss
