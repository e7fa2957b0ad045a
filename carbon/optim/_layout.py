"""Contiguous aliases of parameters, gradients and states for the fused
steps, whose kernels walk each tensor's memory in order.

A parameter need not be contiguous: conv weights in channels_last, a
transposed weight, a slice of a larger tensor. Every update is per element,
so the kernels only need the parameter, its gradient and its states to list
the same elements in the same order. For a dense parameter (no gaps, no
overlaps) that order is its memory order: ``t.permute(order)`` is a
contiguous alias of ``t``, updated in place, and the states are kept with the
parameter's strides (as torch.optim creates them, ``zeros_like`` with
``preserve_format``) so the same permutation makes them contiguous too. A
parameter with gaps is stepped through a contiguous copy, written back after
the kernel.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor


def memory_order(t: Tensor) -> Optional[List[int]]:
    """A permutation of t's dimensions under which t is contiguous, or None
    when t has gaps or overlapping elements (no permutation makes it so)."""
    if t.is_contiguous():
        return list(range(t.dim()))
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d)), reverse=True)
    return order if t.permute(order).is_contiguous() else None


def state_like(p: Tensor, dtype: torch.dtype, old: Optional[Tensor] = None) -> Tensor:
    """A state tensor for p: zeros (or ``old``'s values) with p's strides when
    p is dense, contiguous otherwise, on p's device in ``dtype``. ``old`` is
    returned as it is when it already is one."""
    if old is not None and old.dtype == dtype and old.device == p.device and _same_layout(old, p):
        return old
    fresh = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
    return fresh if old is None else fresh.copy_(old)


def _same_layout(t: Tensor, p: Tensor) -> bool:
    if p.is_contiguous() or memory_order(p) is None:
        return t.is_contiguous()
    return t.shape == p.shape and all(t.stride(d) == p.stride(d) for d in range(p.dim()) if p.size(d) > 1)


class Aliases:
    """The kernel's views of one parameter and of the tensors stepped with it.

    ``param`` is a contiguous alias of the parameter (or a contiguous copy,
    to be written back into ``gapped``); ``read(t)`` and ``state(t)`` give the
    gradient's and a state's views in the same element order. A state from
    :func:`state_like` is already in that order; a gradient in another layout
    is copied."""

    def __init__(self, p: Tensor) -> None:
        self.gapped: Optional[Tensor] = None
        self.order: Optional[List[int]] = None  # None: row-major, the tensors as they are (no view per step)
        if p.is_contiguous():
            self.param = p
            return
        self.order = memory_order(p)
        if self.order is None:  # gaps: a contiguous copy, written back
            self.param = p.contiguous()
            self.gapped = p
        else:
            self.param = p.permute(self.order)

    def read(self, t: Tensor) -> Tensor:
        """t (same shape as the parameter) in the kernel's element order; a
        copy when its layout differs from the parameter's."""
        return (t if self.order is None else t.permute(self.order)).contiguous()

    def state(self, t: Tensor) -> Tensor:
        """A state from :func:`state_like`, as a contiguous alias (updated in
        place by the kernel)."""
        view = t if self.order is None else t.permute(self.order)
        if not view.is_contiguous():
            raise RuntimeError("carbon.optim: a state not laid out like its parameter (internal error)")
        return view


def write_back(aliases: List[Aliases]) -> None:
    """Copy the stepped copies of parameters with gaps back into them."""
    for a in aliases:
        if a.gapped is not None:
            a.gapped.copy_(a.param)
