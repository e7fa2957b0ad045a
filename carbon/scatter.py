"""Carbon's exact indexed accumulations: ``index_add``, ``scatter_add`` and
``embedding`` (whose backward accumulates gradient rows by token).

Every destination element receives RN(exact sum of its old value and all of
its contributions): one rounding, whatever the order or duplication of the
indices, the thread count or the device. PyTorch's ``index_add_`` /
``scatter_add_`` on a GPU add in the order of atomics, so their bits change
from run to run; Carbon's do not. docs/contract.md §11 is the precise
definition (special values, signed zeros, out-of-range indices).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["index_add", "scatter_add", "index_put", "index_add_", "scatter_add_", "index_put_", "embedding"]


def _check_alpha(op: str, alpha: float) -> None:
    if alpha != 1:
        raise ValueError(f"carbon.{op}: only alpha=1 is supported (got {alpha!r}); scale the source first")


def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1) -> Tensor:
    """Out-of-place ``torch.index_add``: for each j along ``dim``,
    ``out[..., j, ...] = RN(self[..., j, ...] + sum of source[..., k, ...] over
    k with index[k] == j)``, one rounding of the exact sum (the old value is
    one of the terms). ``self`` and ``source`` share a dtype (float32,
    bfloat16 or float16); ``index`` is 1-D int64 or int32. Only ``alpha=1``."""
    _check_alpha("index_add", alpha)
    return torch.ops.carbon.index_add(self, dim, index, source)


def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """Out-of-place ``torch.scatter_add`` (same index-shape rules): each
    element of ``self`` becomes RN(its old value + the exact sum of every
    ``src`` element scattered to it)."""
    return torch.ops.carbon.scatter_add(self, dim, index, src)


def index_put(self: Tensor, indices: Sequence[Optional[Tensor]], values: Tensor, accumulate: bool = True) -> Tensor:
    """Out-of-place ``torch.index_put(self, indices, values, accumulate=True)``
    for one 1-D int64/int32 index tensor on dim 0 (embedding-style rows):
    ``index_add(self, 0, indices[0], values)`` with ``values`` broadcast to
    ``(len(indices[0]), *self.shape[1:])``. Negative indices are refused
    (IndexError on the CPU), ``accumulate=False`` raises ValueError (with
    duplicate indices its result is not defined by the values)."""
    if not accumulate:
        raise ValueError("carbon.index_put: only accumulate=True is supported (use torch.index_put otherwise)")
    if len(indices) != 1 or indices[0] is None or indices[0].dim() != 1:
        raise ValueError("carbon.index_put: expected exactly one 1-D index tensor (rows of dim 0)")
    index = indices[0]
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"carbon.index_put: index has dtype {index.dtype}; expected int64 or int32")
    try:
        values = values.expand((index.shape[0], *self.shape[1:]))
    except RuntimeError as e:
        raise ValueError(f"carbon.index_put: values of shape {tuple(values.shape)} cannot be broadcast to "
                         f"{(index.shape[0], *self.shape[1:])}") from e
    return torch.ops.carbon.index_add(self, 0, index, values)


def index_add_(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1) -> Tensor:
    """In-place ``Tensor.index_add_``: ``self`` receives :func:`index_add`'s
    result (each destination one rounding of its exact sum) and is returned."""
    return self.copy_(index_add(self, dim, index, source, alpha=alpha))


def scatter_add_(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """In-place ``Tensor.scatter_add_``: ``self`` receives
    :func:`scatter_add`'s result and is returned."""
    return self.copy_(scatter_add(self, dim, index, src))


def index_put_(self: Tensor, indices: Sequence[Optional[Tensor]], values: Tensor, accumulate: bool = True) -> Tensor:
    """In-place ``Tensor.index_put_(indices, values, accumulate=True)``:
    ``self`` receives :func:`index_put`'s result and is returned (same
    restrictions)."""
    return self.copy_(index_put(self, indices, values, accumulate))


def embedding(input: Tensor, weight: Tensor, padding_idx: Optional[int] = None) -> Tensor:
    """``torch.nn.functional.embedding(input, weight, padding_idx)``: rows of
    ``weight`` gathered (exact). The gradient of ``weight`` is, for each row j,
    RN(exact sum of the output gradients of every token equal to j): +0 for
    rows no token uses, and zeros for the ``padding_idx`` row. ``max_norm``
    and ``sparse`` are not supported."""
    if padding_idx is None:
        pad = -1
    else:
        pad = padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
        if not 0 <= pad < weight.shape[0]:
            raise ValueError(f"carbon.embedding: padding_idx {padding_idx} is out of range for {weight.shape[0]} rows")
    return torch.ops.carbon.embedding(weight, input, pad)
