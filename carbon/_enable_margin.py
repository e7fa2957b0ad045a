"""carbon.enable's routes for F.multi_margin_loss (nn.MultiMarginLoss) and its backward (docs/enable.md). torch adds
each sample's hinge terms one by one in the input's precision (and on a GPU in a block reduction), so its bits
depend on the device; here each sum is exact and rounded once.

For scores x (N, C) (or (C,)), targets y, p ∈ {1, 2}, margin m (rounded to float32, as torch's kernel takes it) and
optional class weights w, in float32 (bfloat16 and float16 inputs widened, the result rounded to their dtype at the
end):

    z_d    = RN(RN(m − x_y) + x_d)                      (torch's order of operations)
    h_d    = z_d (p = 1) or RN(z_d·z_d), then RN(h_d·w_y) with weights; 0 where d = y or z_d ≤ 0
    loss_i = RN(exact Σ_d h_d / C)                        (one rounding: carbon.mean)
    reduction: none, carbon.mean (RN(exact Σ_i loss_i / N)) or carbon.sum

Backward, with s = RN(1 / RN(N·C)) for 'mean' and RN(1 / C) otherwise:
    k_d = s (p = 1) or RN(RN(2·s)·z_d), then RN(k_d·w_y); 0 where d = y or z_d ≤ 0
    grad_d = RN(k_d·g_i) for d ≠ y,   grad_y = RN(RN(−exact Σ_d k_d)·g_i)
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["multi_margin_loss", "multi_margin_loss_backward"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _prepare(args: dict) -> Optional[Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], int]]:
    """(x (N, C) float32, targets (N, 1), active hinge mask, z, per-sample weight (N, 1) or None, p), or None when
    torch should raise its own error."""
    x, target, weight = args["self"], args["target"], args.get("weight")
    p, margin = int(args.get("p", 1)), float(args.get("margin", 1))
    if not x.is_floating_point() or x.is_complex() or x.dim() not in (1, 2) or p not in (1, 2) or x.numel() == 0:
        return None
    routes._need_carbon_dtype("multi_margin_loss", x, weight)
    x2 = (x if x.dim() == 2 else x.unsqueeze(0)).to(torch.float32)
    t = target.reshape(-1, 1).to(torch.int64)
    if t.shape[0] != x2.shape[0]:
        return None
    picked = aten.gather(x2, 1, t)
    z = aten.add(aten.rsub(picked, margin), x2)
    classes = aten.arange(x2.shape[1], device=x.device).unsqueeze(0)
    active = aten.logical_and(aten.gt(z, 0.0), aten.ne(classes, t))
    w = None if weight is None else aten.gather(weight.to(torch.float32).unsqueeze(0).expand(t.shape[0], -1), 1, t)
    return x2, t, active, z, w, p


def multi_margin_loss(args: dict) -> Any:
    prepared = _prepare(args)
    if prepared is None:
        return routes.PASS
    x2, _, active, z, w, p = prepared
    h = z if p == 1 else aten.mul(z, z)
    if w is not None:
        h = aten.mul(h, w)
    h = aten.where(active, h, 0.0)
    losses = carbon_ops.mean(h.contiguous(), [1], False, None)  # (N,)
    reduction, x = args.get("reduction", 1), args["self"]
    if reduction == 1:
        result = carbon_ops.mean(losses, None, False, None)
    elif reduction == 2:
        result = carbon_ops.sum(losses, None, False, None)
    else:
        result = losses if x.dim() == 2 else losses.reshape(())
    result = result.to(x.dtype) if x.dtype == torch.float32 else carbon_ops.round_to(result, x.dtype, 1)
    return result  # an out= tensor is filled by carbon.enable


def multi_margin_loss_backward(args: dict) -> Any:
    prepared = _prepare(args)
    if prepared is None:
        return routes.PASS
    x2, t, active, z, w, p = prepared
    g, x, reduction = args["grad_output"], args["self"], args.get("reduction", 1)
    n, c = x2.shape
    one = aten.ones([], dtype=torch.float32, device=x.device)
    s = routes.true_divide(one, float(n * c) if reduction == 1 else float(c))
    k = aten.mul(aten.mul(s, 2.0), z) if p == 2 else aten.expand(s, z.shape)
    if w is not None:
        k = aten.mul(k, w)
    k = aten.where(active, k, 0.0)
    target_share = aten.neg(carbon_ops.sum(k.contiguous(), [1], True, None))  # (N, 1)
    grad = aten.scatter(k, 1, t, target_share)  # k is 0 at d = y: the target's entry becomes −Σ
    g2 = g.to(torch.float32).reshape(-1, 1) if g.dim() else g.to(torch.float32)
    grad = aten.mul(grad, g2)
    grad = grad if x.dim() == 2 else grad.reshape(x.shape)
    grad = grad.to(x.dtype) if x.dtype == torch.float32 else carbon_ops.round_to(grad, x.dtype, 1)
    return routes._into_outs(args, grad.contiguous(), names=("grad_input",))[0]
