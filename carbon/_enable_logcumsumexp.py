"""carbon.enable's route for torch.logcumsumexp (docs/enable.md): a left-to-right fold in binary64, each step a
fixed sequence of IEEE operations and carbon's correctly rounded float64 exp and log, rounded to the output dtype
once per position. torch scans in the input's precision on the CPU and with a parallel scan on a GPU, so its bits
differ between devices.

    y₀ = x₀,   yₖ = m + LOG1P(EXP(−|yₖ₋₁ − xₖ|))   with m = max(yₖ₋₁, xₖ)      (binary64)
    LOG1P(t) = t if RN(1 + t) = 1, else RN(LOG(RN(1 + t)) · RN(t / RN(RN(1 + t) − 1)))   (Goldberg's formula)

with yₖ = yₖ₋₁ when xₖ = −∞, yₖ = xₖ when yₖ₋₁ = −∞, +∞ when either is +∞, NaN from a NaN on. The output is
RN(yₖ) in float32, then carbon's rounding to bfloat16 / float16. Binary64 keeps the fold's own error (a few units
of 2⁻⁵³ per step) far below a float32 rounding step for any practical length. A Python loop over the dimension
(meant for short dimensions: sequence models' log-space prefix sums), no value read on the host.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["logcumsumexp"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _log1p(t: Tensor) -> Tensor:
    """Goldberg's log1p from a correctly rounded log: accurate to a few binary64 units for t ≥ 0."""
    u = aten.add(t, 1.0)
    ratio = routes.true_divide(t, aten.sub(u, 1.0))
    return aten.where(aten.eq(u, 1.0), t, aten.mul(carbon_ops.log(u), ratio))


def _step(y: Tensor, x: Tensor) -> Tensor:
    """One binary64 step of the fold (y the running value, x the next element)."""
    m = aten.maximum(y, x)
    r = aten.add(m, _log1p(carbon_ops.exp(aten.neg(aten.abs(aten.sub(y, x))))))
    r = aten.where(aten.eq(x, float("-inf")), y, r)
    r = aten.where(aten.eq(y, float("-inf")), x, r)
    return aten.where(aten.eq(m, float("inf")), m, r)  # a NaN makes m NaN, so it stays NaN


def logcumsumexp(args: dict) -> Any:
    x, dim = args["self"], args["dim"]
    if not x.is_floating_point() or x.is_complex():
        return routes.PASS  # torch's own error (integers) or the complex refusal
    routes._need_carbon_dtype("logcumsumexp", x)
    if x.dim() == 0:
        return x.clone()
    dim %= x.dim()
    moved = aten.movedim(x, dim, 0).to(torch.float64)
    out = aten.empty_like(moved)
    if moved.shape[0] > 0:
        y = moved[0]
        out[0] = y
        for k in range(1, moved.shape[0]):
            y = _step(y, moved[k])
            out[k] = y
    out32 = aten.movedim(out, 0, dim).to(torch.float32)
    result = out32 if x.dtype == torch.float32 else carbon_ops.round_to(out32, x.dtype, 1)
    return result.contiguous()  # an out= tensor is filled by carbon.enable
