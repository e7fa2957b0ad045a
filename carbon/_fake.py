"""Fake (meta) implementations: output shapes and dtypes without computing,
for torch.compile, FakeTensor tracing and the meta device."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _out_dtype(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    return out_dtype if out_dtype is not None else torch.promote_types(a.dtype, b.dtype)


def _check_inner(op: str, a: Tensor, b: Tensor) -> None:
    torch._check(
        a.shape[-1] == b.shape[-2],
        lambda: f"carbon.{op}: shapes cannot be multiplied ({tuple(a.shape)} and {tuple(b.shape)})",
    )


@torch.library.register_fake("carbon::mm")
def _mm_fake(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_inner("mm", a, b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_out_dtype(a, b, out_dtype))


@torch.library.register_fake("carbon::addmm")
def _addmm_fake(bias: Tensor, a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return _mm_fake(a, b, out_dtype)


@torch.library.register_fake("carbon::bmm")
def _bmm_fake(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_inner("bmm", a, b)
    torch._check(a.shape[0] == b.shape[0], lambda: "carbon.bmm: batch sizes differ")
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=_out_dtype(a, b, out_dtype))


@torch.library.register_fake("carbon::baddbmm")
def _baddbmm_fake(bias: Tensor, a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return _bmm_fake(a, b, out_dtype)
