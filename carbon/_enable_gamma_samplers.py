"""carbon.enable routes for the gamma family's samplers: ``aten._standard_gamma`` (``Gamma``, ``Chi2``,
``StudentT`` sample / rsample) and ``aten._sample_dirichlet`` (``Dirichlet``, ``Beta``), from carbon.Generator's
draws (docs/enable.md gives the definition; tests/test_enable_gamma_samplers.py an independent oracle of it).

torch samples by rejection (Marsaglia and Tsang, 2000) with a loop per element whose draws come from the
device's own generator. Here every element makes the same fixed number of attempts, K = 24, each from its own
draws (element i, attempt j: flat index i·K + j of one normal and one uniform draw), and keeps the first
accepted one; the arithmetic is binary64 operations one at a time with carbon's correctly rounded float64 log,
exp and pow. So a sample depends only on (seed, offset, i), never on the device. For α ≥ 1 an attempt is
accepted with probability above 0.95: all 24 fail with probability below 10⁻³¹ (the result is then d).

The reparameterized gradients (``_standard_gamma_grad``, ``_dirichlet_grad``: ``rsample`` with
``requires_grad``) are not covered and raise under strict mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from carbon import _enable_routes as routes

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

ATTEMPTS = 24
_THIRD = 1.0 / 3.0  # RN64(1/3)


def _uniforms(shape: list, device: torch.device) -> Tensor:
    """k·2⁻²⁴ draws (carbon's float32 uniforms), as float64."""
    return routes._uniform_values(shape, 0.0, 1.0, torch.float32, device).double()


def standard_gamma64(alpha: Tensor) -> Tensor:
    """Gamma(α, 1) samples in binary64 for a float64 tensor α of float32 values (the definition in
    docs/enable.md); three draws: K normals and K uniforms per element, then one uniform per element."""
    shape, device = list(alpha.shape), alpha.device
    boosted = aten.where(aten.lt(alpha, 1.0), aten.add(alpha, 1.0), alpha)  # a = α + 1 below 1
    d = aten.sub(boosted, _THIRD)
    c = carbon_ops.pow_tensor_scalar(aten.mul(d, 9.0), -0.5)  # 1/√(9d), correctly rounded
    x = routes._normal_values(shape + [ATTEMPTS], 0.0, 1.0, torch.float32, device).double()
    u = _uniforms(shape + [ATTEMPTS], device)
    d1, c1 = d.unsqueeze(-1), c.unsqueeze(-1)
    t = aten.add(aten.mul(c1, x), 1.0)
    v = aten.mul(aten.mul(t, t), t)
    positive = aten.gt(v, 0.0)
    log_v = carbon_ops.log(aten.where(positive, v, 1.0))
    # log u < x²/2 + d·(1 − v + log v)
    bound = aten.add(aten.mul(aten.mul(x, x), 0.5), aten.mul(d1, aten.add(aten.rsub(v, 1.0), log_v)))
    accepted = aten.logical_and(positive, aten.lt(carbon_ops.log(u), bound))
    attempt = aten.arange(ATTEMPTS, device=device)
    first = aten.amin(aten.where(accepted, attempt, ATTEMPTS - 1), -1, True)  # the first accepted (K − 1: none)
    chosen = aten.mul(d, aten.gather(v, -1, first).squeeze(-1))
    g = aten.where(aten.any(accepted, -1), chosen, d)
    # α < 1: G(α) = G(α + 1)·U^(1/α) (u = 0 gives 0)
    boost = carbon_ops.exp(routes.true_divide(carbon_ops.log(_uniforms(shape, device)), alpha))
    g = aten.where(aten.lt(alpha, 1.0), aten.mul(g, boost), g)
    nan = aten.logical_or(aten.isnan(alpha), aten.lt(alpha, 0.0))
    return aten.where(nan, float("nan"), aten.where(aten.eq(alpha, 0.0), 0.0, g))


def _to_dtype(x32: Tensor, dtype: torch.dtype, low: float, high: float) -> Tensor:
    """float32 clamped to [low, high] (torch's clamps), then the input's dtype by carbon's rounding, NaN with
    the canonical bits (torch's vectorized CPU clamp and conversion of bfloat16 give NaN other bits)."""
    x32 = aten.clamp(x32, low, high)
    x32 = aten.where(aten.isnan(x32), float("nan"), x32)
    return x32 if dtype == torch.float32 else carbon_ops.round_to(x32, dtype, 1)


def _alpha64(op: str, alpha: Tensor) -> Tensor:
    routes._need_random_dtype(op, alpha.dtype)
    return alpha.double()


def standard_gamma(args: dict) -> Any:
    alpha = args["self"]
    if args.get("generator") is not None:
        raise routes.NotCovered("_standard_gamma with an explicit generator (carbon draws from carbon.Generator)")
    if alpha.numel() == 0:
        return aten.empty_like(alpha)
    g = standard_gamma64(_alpha64("_standard_gamma", alpha)).to(torch.float32)
    return _to_dtype(g, alpha.dtype, torch.finfo(alpha.dtype).tiny, float("inf"))  # torch's clamp to the smallest normal


def sample_dirichlet(args: dict) -> Any:
    alpha = args["self"]
    if args.get("generator") is not None:
        raise routes.NotCovered("_sample_dirichlet with an explicit generator (carbon draws from carbon.Generator)")
    if alpha.numel() == 0:
        return aten.empty_like(alpha)
    g = standard_gamma64(_alpha64("_sample_dirichlet", alpha)).to(torch.float32)
    total = carbon_ops.sum(g, [-1], True, None)  # the exact sum, rounded once
    x = aten.div(g, total)
    finfo = torch.finfo(alpha.dtype)
    return _to_dtype(x, alpha.dtype, finfo.tiny, 1.0 - finfo.eps)
