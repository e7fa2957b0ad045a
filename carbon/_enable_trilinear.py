"""carbon.enable's route for aten._trilinear, the op behind torch.nn.Bilinear / F.bilinear (forward and backward):
y[b, o] = Σᵢⱼ x1[b, i]·W[o, i, j]·x2[b, j] + bias[o]. torch evaluates it as two batched products (bmm), whose
bits depend on the device; here each of the two steps is an exact sum rounded once (carbon.bmm):

    buf = RN(Σ_{sum dims where i3 is broadcast} i1·i2)      (keepdim)
    out = RN(Σ_{the other sum dims} buf·i3)

after unsqueezing each input at its expand dims, as torch does (its unroll_dim only splits the work: here
every summed dimension is inside one exact sum). A summed dimension that only one operand of a pair has is
summed first (exact, one rounding), as torch's sumproduct_pair does. For nn.Bilinear's forward that is
buf[b, o, j] = RN(Σᵢ x1[b, i]·W[o, i, j]) and y = RN(Σⱼ buf[b, o, j]·x2[b, j]); the bias is a separate add.
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["trilinear"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _sum_product_pair(a: Tensor, b: Tensor, sum_dims: Sequence[int]) -> Tensor:
    """RN(Σ over sum_dims of a·b) for a and b of one rank that broadcast; the summed dims kept with size 1."""
    nd = a.dim()
    summed = set(sum_dims)
    for d in sorted(summed):  # a dimension only one operand has: summed first
        if a.shape[d] > 1 and b.shape[d] == 1:
            a = carbon_ops.sum(a, [d], True, None)
        elif b.shape[d] > 1 and a.shape[d] == 1:
            b = carbon_ops.sum(b, [d], True, None)
    both = [d for d in range(nd) if a.shape[d] > 1 and b.shape[d] > 1]
    batch = [d for d in both if d not in summed]
    contract = [d for d in both if d in summed]
    left = [d for d in range(nd) if d not in summed and a.shape[d] > 1 and b.shape[d] == 1]
    right = [d for d in range(nd) if d not in summed and b.shape[d] > 1 and a.shape[d] == 1]
    ones_a = [d for d in range(nd) if d not in batch + contract + left]  # extent 1 in a
    ones_b = [d for d in range(nd) if d not in batch + contract + right]
    size = lambda t, dims: math.prod(t.shape[d] for d in dims)  # noqa: E731
    lhs = a.permute(batch + left + contract + ones_a).reshape(size(a, batch), size(a, left), size(a, contract))
    rhs = b.permute(batch + contract + right + ones_b).reshape(size(b, batch), size(b, contract), size(b, right))
    out = carbon_ops.bmm(lhs, rhs, None)  # (batch, left, right): one rounding per element
    order = batch + left + right
    out = out.reshape([a.shape[d] for d in batch + left] + [b.shape[d] for d in right])
    out = out.reshape(out.shape + (1,) * (nd - len(order)))
    rest = [d for d in range(nd) if d not in order]
    return out.permute([(order + rest).index(d) for d in range(nd)])


def trilinear(args: dict) -> Any:
    i1, i2, i3 = args["i1"], args["i2"], args["i3"]
    expands = [list(args["expand1"]), list(args["expand2"]), list(args["expand3"])]
    sumdim = list(args["sumdim"])
    if not (i1.dtype == i2.dtype == i3.dtype) or not i1.is_floating_point():
        return routes.PASS  # torch's own error
    routes._need_carbon_dtype("_trilinear", i1)
    total = i1.dim() + len(expands[0])
    tensors: List[Tensor] = [i1, i2, i3]
    for k in range(3):
        for d in range(total):
            if d in expands[k]:
                tensors[k] = tensors[k].unsqueeze(d)
    try:
        full = torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        return routes.PASS  # torch's own error
    out_shape = [1 if d in sumdim else full[d] for d in range(total)]
    if any(t.numel() == 0 for t in tensors):
        out = aten.zeros(out_shape, dtype=i1.dtype, device=i1.device)
    else:
        buf = _sum_product_pair(tensors[0], tensors[1], [d for d in sumdim if d in expands[2]])
        out = _sum_product_pair(buf, tensors[2], [d for d in sumdim if d not in expands[2]])
    for d in sorted(sumdim, reverse=True):
        out = out.squeeze(d)
    return out.contiguous()
