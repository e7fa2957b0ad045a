"""carbon.enable routes for the samplers of torch.distributions that draw by rejection: ``aten._standard_gamma`` (``Gamma``, ``Chi2``,
``StudentT`` sample / rsample), ``aten._sample_dirichlet`` (``Dirichlet``, ``Beta``), ``aten.poisson``
(``Poisson``, Poisson noise) and ``aten.binomial`` (``Binomial``), from carbon.Generator's draws (docs/enable.md gives the definitions;
tests/test_enable_samplers.py an independent oracle of them).

torch samples by rejection (Marsaglia and Tsang, 2000) with a loop per element whose draws come from the
device's own generator. Here every element makes the same fixed number of attempts, K = 24, each from its own
draws (element i, attempt j: flat index i·K + j of one normal and one uniform draw), and keeps the first
accepted one; the arithmetic is binary64 operations one at a time with carbon's correctly rounded float64 log,
exp and pow. So a sample depends only on (seed, offset, i), never on the device. For α ≥ 1 an attempt is
accepted with probability above 0.95: all 24 fail with probability below 10⁻³¹ (the result is then d).

Poisson: for λ < 10 the number of arrivals of a rate-1 Poisson process in [0, λ] among 64 exponential draws
(exact prefix sums, carbon.cumsum); for λ ≥ 10 Hörmann's transformed rejection (PTRS, 1993) with 24 attempts
(each accepted with probability above 0.9). Binomial likewise: waiting times between successes for n·q < 10,
Hörmann's BTRS (1993) otherwise. None needs a loop whose length depends on the values.

The reparameterized gradients (``_standard_gamma_grad``, ``_dirichlet_grad``: ``rsample`` with
``requires_grad``) are in carbon/_enable_sampler_grads.py.
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


def _is_empty(op: str, args: dict, *tensors: Tensor) -> bool:
    """Refuses an explicit torch.Generator and dtypes other than carbon's three; True for an empty input."""
    if args.get("generator") is not None:
        raise routes.NotCovered(f"{op} with an explicit generator (carbon draws from carbon.Generator)")
    for t in tensors:
        routes._need_random_dtype(op, t.dtype)
    return tensors[0].numel() == 0


def standard_gamma(args: dict) -> Any:
    alpha = args["self"]
    if _is_empty("_standard_gamma", args, alpha):
        return aten.empty_like(alpha)
    g = standard_gamma64(alpha.double()).to(torch.float32)
    return _to_dtype(g, alpha.dtype, torch.finfo(alpha.dtype).tiny, float("inf"))  # torch's clamp to the smallest normal


def sample_dirichlet(args: dict) -> Any:
    alpha = args["self"]
    if _is_empty("_sample_dirichlet", args, alpha):
        return aten.empty_like(alpha)
    g = standard_gamma64(alpha.double()).to(torch.float32)
    total = carbon_ops.sum(g, [-1], True, None)  # the exact sum, rounded once
    x = aten.div(g, total)
    finfo = torch.finfo(alpha.dtype)
    return _to_dtype(x, alpha.dtype, finfo.tiny, 1.0 - finfo.eps)


# ---- Poisson ---------------------------------------------------------------------------------------------------

COUNT_DRAWS = 64  # λ < 10: P(Poisson(10) > 63) < 10⁻²⁹
_LOG_FACTORIAL = [float.fromhex(h) for h in (
    "0.0", "0.0", "0x1.62e42fefa39efp-1", "0x1.cab0bfa2a2002p+0", "0x1.96ca77c922cf9p+1",
    "0x1.326643c4479c9p+2", "0x1.a51273acf01cap+2", "0x1.10ce1f32dcc30p+3", "0x1.5358e82fcb70dp+3", "0x1.99a8921a7f7cfp+3",
    "0x1.e357590954d15p+3", "0x1.180973f3a8d74p+4", "0x1.3fcba16d50143p+4", "0x1.68d5a9c3b32cep+4", "0x1.930f3df162a42p+4",
    "0x1.be636a63fd346p+4")]  # RN64(log k!), k < 16 (mpmath)
_HALF_LOG_2PI = float.fromhex("0x1.d67f1c864beb5p-1")


def log_factorial64(k: Tensor) -> Tensor:
    """log k! for a float64 tensor of integers k ≥ 0: the table below 16, else Stirling's series in z = k + 1
    to 1/(1260 z⁵) (error < 1/(1680 z⁷) < 10⁻¹²), binary64 steps with carbon's float64 log."""
    z = aten.add(k, 1.0)
    inv = aten.div(aten.full_like(z, 1.0), z)
    w = aten.mul(inv, inv)
    series = aten.mul(inv, aten.add(aten.mul(w, aten.add(aten.mul(w, 1.0 / 1260.0), -1.0 / 360.0)), 1.0 / 12.0))
    stirling = aten.add(aten.add(aten.sub(aten.mul(aten.sub(z, 0.5), carbon_ops.log(z)), z), _HALF_LOG_2PI), series)
    table = torch.tensor(_LOG_FACTORIAL, dtype=torch.float64, device=k.device)
    small = aten.lt(k, 16.0)
    return aten.where(small, table[aten.clamp(k, 0, 15).to(torch.int64)], stirling)


def _poisson_small(lam: Tensor) -> Tensor:
    """λ < 10: #{j < 64 : S_j ≤ λ}, S_j = RN32(exact prefix sum of E_0 … E_j), E_i = RN32(−LOG(1 − u_i))."""
    u = routes._uniform_values(list(lam.shape) + [COUNT_DRAWS], 0.0, 1.0, torch.float32, lam.device)
    e = aten.neg(carbon_ops.log(aten.rsub(u, 1.0)))
    arrivals = carbon_ops.cumsum_rows(e.reshape([-1, COUNT_DRAWS]), None).reshape(e.shape)
    return aten.sum(aten.le(arrivals, lam.to(torch.float32).unsqueeze(-1)), -1).double()


def _poisson_ptrs(lam: Tensor) -> Tensor:
    """λ ≥ 10: PTRS, 24 attempts from uniforms U = u − ½ and V (two draws of shape λ.shape + [24])."""
    shape, device = list(lam.shape) + [ATTEMPTS], lam.device
    u = aten.sub(_uniforms(shape, device), 0.5)
    v = _uniforms(shape, device)
    lam1 = lam.unsqueeze(-1)
    b = aten.add(aten.mul(carbon_ops.pow_tensor_scalar(lam1, 0.5), 2.53), 0.931)
    a = aten.add(aten.mul(b, 0.02483), -0.059)
    log_inv_alpha = carbon_ops.log(aten.add(aten.div(aten.full_like(b, 1.1328), aten.sub(b, 3.4)), 1.1239))
    v_r = aten.rsub(aten.div(aten.full_like(b, 3.6224), aten.sub(b, 2.0)), 0.9277)
    us = aten.rsub(aten.abs(u), 0.5)
    k = aten.floor(aten.add(aten.add(aten.mul(aten.add(aten.div(aten.mul(a, 2.0), us), b), u), lam1), 0.43))
    quick = aten.logical_and(aten.ge(us, 0.07), aten.le(v, v_r))
    rejected = aten.logical_or(aten.lt(k, 0.0), aten.logical_and(aten.lt(us, 0.013), aten.gt(v, us)))
    k0 = aten.clamp_min(k, 0.0)
    lhs = aten.sub(aten.add(carbon_ops.log(v), log_inv_alpha),
                   carbon_ops.log(aten.add(aten.div(a, aten.mul(us, us)), b)))
    rhs = aten.sub(aten.add(aten.neg(lam1), aten.mul(k0, carbon_ops.log(lam1))), log_factorial64(k0))
    accepted = aten.logical_or(quick, aten.logical_and(aten.logical_not(rejected), aten.le(lhs, rhs)))
    attempt = aten.arange(ATTEMPTS, device=device)
    first = aten.amin(aten.where(accepted, attempt, ATTEMPTS - 1), -1, True)
    chosen = aten.gather(k0, -1, first).squeeze(-1)
    return aten.where(aten.any(accepted, -1), chosen, aten.floor(lam))  # none accepted (< 10⁻²⁴): ⌊λ⌋


def poisson(args: dict) -> Any:
    rates = args["self"]
    if _is_empty("poisson", args, rates):
        return aten.empty_like(rates)
    lam = rates.double()
    bad = aten.logical_or(aten.logical_not(aten.isfinite(lam)), aten.lt(lam, 0.0))  # torch raises (a host read)
    small = aten.lt(lam, 10.0)
    count = aten.where(small, _poisson_small(aten.where(bad, 0.0, lam)), _poisson_ptrs(aten.where(aten.logical_or(small, bad), 10.0, lam)))
    out = aten.where(bad, float("nan"), count).to(torch.float32)
    return out if rates.dtype == torch.float32 else carbon_ops.round_to(out, rates.dtype, 1)


# ---- binomial --------------------------------------------------------------------------------------------------

WAIT_CAP = 2.0 ** 47  # waiting times are capped here: 64 of them sum exactly in binary64


def _binomial_small(n: Tensor, q: Tensor) -> Tensor:
    """n·q < 10: the number of successes as waiting times G_j = ⌊LOG(u_j) / LOG(1 − q)⌋ + 1 (64 uniforms per
    element), #{j : G_0 + … + G_j ≤ n}; the G are integers below 2^47, so their prefix sums are exact."""
    u = _uniforms(list(n.shape) + [COUNT_DRAWS], n.device)
    log_q = carbon_ops.log(aten.rsub(q, 1.0)).unsqueeze(-1)  # 1 − q exact (q ≤ ½ a float32 value)
    wait = aten.add(aten.floor(aten.div(carbon_ops.log(u), log_q)), 1.0)
    never = aten.logical_or(aten.eq(log_q, 0.0), aten.isnan(wait))  # q = 0: no success ever
    wait = aten.where(never, WAIT_CAP, aten.clamp_max(wait, WAIT_CAP))
    return aten.sum(aten.le(aten.cumsum(wait, -1), n.unsqueeze(-1)), -1).double()


def _binomial_btrs(n: Tensor, q: Tensor) -> Tensor:
    """n·q ≥ 10: Hörmann's BTRS with 24 attempts from uniforms U = u − ½ and V."""
    shape, device = list(n.shape) + [ATTEMPTS], n.device
    u = aten.sub(_uniforms(shape, device), 0.5)
    v = _uniforms(shape, device)
    n1, q1 = n.unsqueeze(-1), q.unsqueeze(-1)
    nq = aten.mul(n1, q1)
    spq = carbon_ops.pow_tensor_scalar(aten.mul(nq, aten.rsub(q1, 1.0)), 0.5)
    b = aten.add(aten.mul(spq, 2.53), 1.15)
    a = aten.add(aten.add(aten.mul(b, 0.0248), -0.0873), aten.mul(q1, 0.01))
    c = aten.add(nq, 0.5)
    v_r = aten.rsub(aten.div(aten.full_like(b, 4.2), b), 0.92)
    alpha = aten.mul(aten.add(aten.div(aten.full_like(b, 5.1), b), 2.83), spq)
    lpq = carbon_ops.log(aten.div(q1, aten.rsub(q1, 1.0)))
    m = aten.floor(aten.mul(aten.add(n1, 1.0), q1))
    h = aten.add(log_factorial64(m), log_factorial64(aten.sub(n1, m)))
    us = aten.rsub(aten.abs(u), 0.5)
    k = aten.floor(aten.add(aten.mul(aten.add(aten.div(aten.mul(a, 2.0), us), b), u), c))
    valid = aten.logical_and(aten.ge(k, 0.0), aten.le(k, n1))
    quick = aten.logical_and(aten.ge(us, 0.07), aten.le(v, v_r))
    k0 = aten.where(valid, k, 0.0)
    lhs = carbon_ops.log(aten.div(aten.mul(v, alpha), aten.add(aten.div(a, aten.mul(us, us)), b)))
    rhs = aten.add(aten.sub(aten.sub(h, log_factorial64(k0)), log_factorial64(aten.sub(n1, k0))),
                   aten.mul(aten.sub(k0, m), lpq))
    accepted = aten.logical_and(valid, aten.logical_or(quick, aten.le(lhs, rhs)))
    attempt = aten.arange(ATTEMPTS, device=device)
    first = aten.amin(aten.where(accepted, attempt, ATTEMPTS - 1), -1, True)
    chosen = aten.gather(k0, -1, first).squeeze(-1)
    return aten.where(aten.any(accepted, -1), chosen, aten.floor(aten.mul(n, q)))  # none accepted: ⌊n·q⌋


def binomial(args: dict) -> Any:
    count, prob = args["count"], args["prob"]
    if _is_empty("binomial", args, count, prob):
        return aten.empty_like(count)
    n, p = count.double(), prob.double()
    bad = aten.logical_or(aten.logical_or(aten.logical_not(aten.isfinite(n)), aten.lt(n, 0.0)),
                          aten.logical_not(aten.logical_and(aten.ge(p, 0.0), aten.le(p, 1.0))))
    n = aten.where(bad, 0.0, n)
    flip = aten.gt(p, 0.5)
    q = aten.where(bad, 0.0, aten.where(flip, aten.rsub(p, 1.0), p))  # 1 − p exact
    small = aten.lt(aten.mul(n, q), 10.0)
    easy = aten.logical_or(small, bad)
    count_small = _binomial_small(n, q)
    count_big = _binomial_btrs(aten.where(easy, 100.0, n), aten.where(easy, 0.5, q))
    x = aten.where(small, count_small, count_big)
    x = aten.where(flip, aten.sub(n, x), x)
    out = aten.where(bad, float("nan"), x).to(torch.float32)
    return out if count.dtype == torch.float32 else carbon_ops.round_to(out, count.dtype, 1)
