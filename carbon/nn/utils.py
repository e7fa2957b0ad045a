"""carbon.nn.utils.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ with an
exactly defined norm and scaling (docs/contract.md §12)."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Union

import torch
from torch import Tensor

from carbon.optim._layout import Aliases, write_back

__all__ = ["clip_grad_norm_"]

CLIP_EPS = 1e-6  # torch's: coef = max_norm / (total_norm + 1e-6)


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: Optional[bool] = None) -> Tensor:
    """Scale the gradients of ``parameters`` in place so that their total
    norm is at most ``max_norm``; returns the total norm (before clipping) as
    a 0-dim float32 tensor on the gradients' device.

    norm_type 2: total = RN32(sqrt(RN32(exact sum of g^2 over all gradients)));
    norm_type inf: total = max |g| (exact). Then every gradient becomes
    RN(g * c) with c = min(RN32(max_norm / (total + 1e-6)), 1), computed on
    the device (no host synchronization unless ``error_if_nonfinite``).
    ``foreach`` is accepted for torch compatibility and ignored."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if norm_type != 2.0 and norm_type != math.inf:
        raise NotImplementedError(f"carbon.nn.utils.clip_grad_norm_: norm_type={norm_type} is not supported "
                                  "(carbon computes the 2-norm and the inf-norm exactly; use torch for others)")
    if not grads:
        return torch.tensor(0.0)
    devices = {g.device for g in grads}
    if len(devices) > 1:
        raise ValueError(f"carbon.nn.utils.clip_grad_norm_: expected all gradients on one device, got {sorted(map(str, devices))}")
    device = grads[0].device
    grads = [g.detach() for g in grads]
    nonempty = [g for g in grads if g.numel() > 0]
    if not nonempty:
        total = torch.zeros((), dtype=torch.float32, device=device)
    elif norm_type == 2.0:
        total = torch.ops.carbon.sum_squares(nonempty, True)
    else:
        total = torch.stack([torch.linalg.vector_norm(g, math.inf).float() for g in nonempty]).max()
        # A NaN gradient makes the max NaN with whatever bits the device's
        # kernels give it (a GPU's max or abs may keep a payload or write
        # 0x7FFFFFFF): return the canonical NaN (contract §1) on every device.
        total = torch.where(total.isnan(), torch.full((), math.nan, dtype=torch.float32, device=device), total)
    if error_if_nonfinite and bool(total.isnan() | total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`")
    if nonempty:
        aliases = [Aliases(g) for g in nonempty]  # contiguous aliases of channels_last / transposed gradients
        torch.ops.carbon.clip_scale_([a.param for a in aliases], total, max_norm, CLIP_EPS)
        write_back(aliases)
    return total
