"""Carbon's exact reductions: ``sum`` and ``mean``, correctly rounded.

``sum`` returns RN(exact sum of the reduced elements) and ``mean`` returns
RN(exact sum / n), each rounded once (ties to even) into the output dtype.
The bits depend only on the values reduced: not on their order, the layout,
the other rows, the thread count or the device. docs/contract.md is the
precise statement (special values, signed zeros, empty reductions).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["sum", "mean", "round_to"]

Dims = Union[int, Sequence[int], None]


def _dim_list(dim: Dims) -> Optional[list]:
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def sum(x: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None) -> Tensor:  # noqa: A001
    """``torch.sum`` semantics, correctly rounded: RN(exact sum) over ``dim``
    (all dimensions when None or empty). An empty reduction gives +0."""
    return torch.ops.carbon.sum(x, _dim_list(dim), keepdim, dtype)


def mean(x: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``torch.mean`` semantics, correctly rounded: RN(exact sum / n), one
    rounding of the exact quotient. An empty reduction gives NaN."""
    return torch.ops.carbon.mean(x, _dim_list(dim), keepdim, dtype)


def round_to(x: Tensor, dtype: torch.dtype, divisor: int = 1) -> Tensor:
    """RN_dtype(x / divisor) elementwise, one rounding of the exact value:
    a correctly rounded conversion between float32, bfloat16 and float16
    (canonical NaN, subnormals kept, overflow to inf), the same on every
    device. ``divisor`` is an integer in [1, 2^32)."""
    return torch.ops.carbon.round_to(x, dtype, divisor)
