"""Carbon's matmul family: correctly rounded, hence identical everywhere.

Every function here returns, for each output element, the exact value of
``bias + sum_k a[..., i, k] * b[..., k, j]`` rounded once to nearest (ties to
even) in the output dtype. The bits are a function of the input values only:
the same on any CPU and CUDA GPU, at any batch size, thread count and memory
layout. docs/contract.md is the precise statement.

Supported dtypes: float32, bfloat16 and float16, mixed freely. The output
dtype defaults to ``torch.promote_types`` of the operands' dtypes and can be
chosen with ``out_dtype`` (e.g. bfloat16 inputs with a float32 output).
All functions are differentiable; every gradient is itself correctly rounded.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

__all__ = ["mm", "addmm", "bmm", "baddbmm", "linear", "matmul"]


def mm(a: Tensor, b: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix product ``a @ b`` of an (M, K) and a (K, N) tensor, correctly rounded.

    Raises ValueError for wrong ranks, mismatched shapes or devices and
    TypeError for unsupported dtypes. K = 0 gives zeros (+0).
    """
    return torch.ops.carbon.mm(a, b, out_dtype)


def addmm(bias: Tensor, a: Tensor, b: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``bias + a @ b`` with the bias inside the single rounding.

    ``bias`` broadcasts to (M, N) (e.g. shape (N,) for a linear layer).
    """
    return torch.ops.carbon.addmm(bias, a, b, out_dtype)


def bmm(a: Tensor, b: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Batched product of a (B, M, K) and a (B, K, N) tensor, correctly rounded."""
    return torch.ops.carbon.bmm(a, b, out_dtype)


def baddbmm(bias: Tensor, a: Tensor, b: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``bias + bmm(a, b)`` with the bias inside the single rounding; bias broadcasts to (B, M, N)."""
    return torch.ops.carbon.baddbmm(bias, a, b, out_dtype)


def linear(
    input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, out_dtype: Optional[torch.dtype] = None
) -> Tensor:
    """``input @ weight.T + bias`` for an input of shape (..., K) and a weight of shape (N, K).

    Same semantics as ``torch.nn.functional.linear``. All leading dimensions
    are folded into one, so in the backward pass the weight gradient is ONE
    correctly rounded sum over every token of every batch (never a sum of
    per-batch rounded partials), and the bias gradient likewise.
    """
    if weight.dim() != 2:
        raise ValueError(f"carbon.linear: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if input.dim() == 0:
        raise ValueError("carbon.linear: input must have at least one dimension")
    if input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"carbon.linear: input's last dimension ({input.shape[-1]}) does not match "
            f"weight's in_features ({weight.shape[1]})"
        )
    rows = input.reshape(math.prod(input.shape[:-1]), weight.shape[1])
    out = mm(rows, weight.t(), out_dtype=out_dtype) if bias is None else addmm(bias, rows, weight.t(), out_dtype=out_dtype)
    return out.reshape(*input.shape[:-1], weight.shape[0])


def matmul(a: Tensor, b: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``torch.matmul`` semantics for 1-D, 2-D and N-D operands, correctly rounded.

    Leading dimensions of an N-D operand multiplied by a 2-D one are folded
    into the matrix dimension (one reduction for the other operand's
    gradient). Two N-D operands must have equal batch shapes: broadcasting a
    batch dimension would make autograd sum that operand's gradient with
    torch's (inexact) reduction, so it is refused until carbon has one.
    """
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("carbon.matmul: both operands need at least one dimension")
    if a.dim() == 1 and b.dim() == 1:
        return matmul(a.unsqueeze(0), b.unsqueeze(-1), out_dtype=out_dtype).reshape(())
    if a.dim() == 1:
        return matmul(a.unsqueeze(0), b, out_dtype=out_dtype).squeeze(-2)
    if b.dim() == 1:
        return matmul(a, b.unsqueeze(-1), out_dtype=out_dtype).squeeze(-1)
    if b.dim() == 2:
        return linear(a, b.t(), out_dtype=out_dtype)
    if a.dim() == 2:
        # (..., M, N) = ((..., N, K) @ (K, M)) transposed: fold b's batch into rows.
        return linear(b.transpose(-1, -2), a, out_dtype=out_dtype).transpose(-1, -2)
    if a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"carbon.matmul: batch shapes {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} differ; "
            "carbon does not broadcast batch dimensions"
        )
    batch = a.shape[:-2]
    count = math.prod(batch)
    out = bmm(a.reshape(count, *a.shape[-2:]), b.reshape(count, *b.shape[-2:]), out_dtype=out_dtype)
    return out.reshape(*batch, *out.shape[-2:])
