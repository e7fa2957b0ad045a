"""carbon.enable's route for torch.linalg.qr (docs/enable.md): Householder QR as a fixed sequence of exact dot
products (carbon.mm, one rounding each) and single IEEE operations, so Q and R have the same bits on every
device and thread count. torch.nn.init.orthogonal_ — the usual initialization of RL policy and value networks
— draws a normal matrix and takes the Q of its QR; LAPACK and cuSOLVER give different bits.

For an m × n float32 matrix A and k = 0 … min(m, n) − 1, on the column x = A[k:, k] (α = x₀, the rest r):
    s = RN(Σ r²), ν = RN(Σ x²) (exact sums, rounded once), β = −copysign(RN(√ν), α) — when the column's
    largest |entry| lies outside [2⁻⁶⁰, 2⁶⁰], the sums are of x·2ᵏ (exact; k brings it near 1) and
    β = −copysign(RN(√ν)·2⁻ᵏ, α), so the squares neither overflow nor vanish;
    τ = RN(RN(β − α) / β), v = (1, RN(r / RN(α − β))), t = RN(τ·v);
    when s = 0 (no sub-diagonal mass): β = α, τ = 0, v = t = (1, 0, …) and nothing changes;
    the trailing columns A[k:, k+1:] ← RN(A − RN(tᵢ·wⱼ)) with w = RN(vᵀ A[k:, k+1:]) (exact dot products);
    R[k, k] = β, and R is the upper triangle of the final A.
Q = H₀ H₁ … from the identity's first columns (min(m, n) of them, or m with mode="complete"), applied last
first, each as Q[k:, k:] ← RN(Q − RN(tᵢ·wⱼ)), w = RN(vᵀ Q[k:, k:]) (LAPACK's dorg2r order). This is LAPACK's
geqr2 / org2r algorithm with its sign convention; only the arithmetic is pinned down. torch.geqrf returns the
factorization in LAPACK's compact form (R and the v's below the diagonal, and τ), and
torch.linalg.householder_product (orgqr) runs the Q recurrence on any such reflectors and τ's
(nn.utils.parametrizations.orthogonal's householder map uses both).

Cost: 2·min(m, n) steps of carbon.mm on a vector and a block, in Python — milliseconds for the matrices of
RL networks, seconds for 1024-wide ones. No value is read on the host (no device synchronization).
"""

from __future__ import annotations

import math
from typing import Any, List, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["linalg_qr", "geqrf", "linalg_householder_product"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _dot_rows(v: Tensor, block: Tensor) -> Tensor:
    """RN(exact vᵀ block), one rounding per column: (1, columns)."""
    return carbon_ops.mm(v.reshape(1, -1), block)


def _reflect(block: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """RN(block − RN(tᵢ · wⱼ)) with w = RN(vᵀ block): two roundings per element, no fused operation."""
    w = _dot_rows(v, block)
    return aten.sub(block, aten.mul(t.reshape(-1, 1), w))


def _power_of_two(exponent: Tensor) -> Tensor:
    """2^e as float32 for integer e in [−126, 127], from its bits (exact on every device)."""
    return aten.bitwise_left_shift(aten.add(exponent.to(torch.int32), 127), 23).view(torch.float32)


def _column_scale(x: Tensor) -> Tuple[Tensor, Tensor]:
    """(2^k, 2^−k) bringing the column's largest |entry| near 1 when it lies outside [2^−60, 2^60] (else 1, 1):
    the squares then neither overflow nor vanish. Exact: products by powers of two."""
    top = aten.amax(aten.abs(x), [0], True)
    exponent = aten.frexp(top)[1].to(torch.int32)  # top = m·2^e, 0.5 <= m < 1
    k = aten.where(aten.logical_and(aten.gt(top, 0), aten.logical_or(aten.gt(top, 2.0 ** 60), aten.lt(top, 2.0 ** -60))),
                   aten.clamp(aten.neg(exponent), -126, 126), 0)
    return _power_of_two(k), _power_of_two(aten.neg(k))


def _reflector(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(β, τ, v) of the column x, as in the module's docstring; β, τ of shape (1,)."""
    alpha, rest = x[:1], x[1:]
    up, down = _column_scale(x)
    scaled = aten.mul(x, up)
    s = _dot_rows(scaled[1:], scaled[1:].reshape(-1, 1)).reshape(1)
    nu = _dot_rows(scaled, scaled.reshape(-1, 1)).reshape(1)
    beta = aten.neg(aten.copysign(aten.mul(routes.sqrt_rn(nu), down), alpha))
    flat = aten.eq(s, 0)
    beta = aten.where(flat, alpha, beta)
    zero = aten.zeros_like(alpha)
    tau = aten.where(flat, zero, routes.true_divide(aten.sub(beta, alpha), beta))
    scaled = routes.true_divide(rest, aten.sub(alpha, beta))
    v = aten.cat([aten.ones_like(alpha), aten.where(flat, zero, scaled)])
    return beta, tau, v


def _geqrf_one(a: Tensor) -> Tuple[Tensor, Tensor]:
    """LAPACK's compact form of one matrix: R on and above the diagonal, each reflector's v below it (its
    leading 1 implied), and τ."""
    m, n = a.shape
    work = a.clone(memory_format=torch.contiguous_format)
    taus: List[Tensor] = []
    for k in range(min(m, n)):
        beta, tau, v = _reflector(work[k:, k])
        if k + 1 < n:
            work[k:, k + 1:] = _reflect(work[k:, k + 1:], aten.mul(tau, v), v)
        work[k, k] = beta.reshape(())
        work[k + 1:, k] = v[1:]
        taus.append(tau)
    tau = aten.cat(taus) if taus else aten.empty([0], dtype=a.dtype, device=a.device)
    return work, tau


def _householder_one(reflectors: Tensor, tau: Tensor, columns: int) -> Tensor:
    """H₀ H₁ … H_{k−1} applied to the identity's first `columns` columns, the last reflector first (dorg2r's
    order): Q[i:, i:] ← RN(Q − RN(tⱼ·wₗ)), w = RN(vᵀ Q[i:, i:]), v = (1, reflectors[i + 1:, i]), t = RN(τᵢ·v)."""
    m = reflectors.shape[0]
    q = aten.eye(m, columns, dtype=reflectors.dtype, device=reflectors.device)
    for i in reversed(range(tau.shape[0])):
        v = aten.cat([aten.ones_like(tau[i:i + 1]), reflectors[i + 1:, i]])
        q[i:, i:] = _reflect(q[i:, i:], aten.mul(tau[i:i + 1], v), v)
    return q


def _qr_one(a: Tensor, mode: str) -> Tuple[Tensor, Tensor]:
    m, n = a.shape
    work, tau = _geqrf_one(a)
    rows = m if mode == "complete" else min(m, n)
    r = aten.triu(work[:rows] if mode != "complete" else work)
    if mode == "r":
        return aten.empty([0], dtype=a.dtype, device=a.device), r
    return _householder_one(work, tau, rows), r


def linalg_qr(a: dict) -> Any:
    x, mode = a["A"], a.get("mode", "reduced")
    if x.dim() < 2 or mode not in ("reduced", "complete", "r") or x.is_complex():
        return routes.PASS  # torch's own error (or a complex QR, which carbon refuses elsewhere)
    if x.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_qr in {x.dtype}: carbon covers float32")
    lead, (m, n) = list(x.shape[:-2]), x.shape[-2:]
    q_cols = r_rows = m if mode == "complete" else min(m, n)
    if x.numel() == 0:  # an empty batch or matrix: Q is the identity's first columns, R is empty
        q = aten.empty([0], dtype=x.dtype, device=x.device) if mode == "r" else \
            aten.eye(m, q_cols, dtype=x.dtype, device=x.device).expand(lead + [m, q_cols]).contiguous()
        return _into_qr_outs(a, q, aten.zeros(lead + [r_rows, n], dtype=x.dtype, device=x.device))
    pieces = [_qr_one(mat, mode) for mat in x.reshape([math.prod(lead), m, n]).unbind(0)]
    qs, rs = zip(*pieces)
    q = qs[0] if mode == "r" else aten.stack(list(qs)).reshape(lead + [m, q_cols])
    return _into_qr_outs(a, q, aten.stack(list(rs)).reshape(lead + [r_rows, n]))


def geqrf(a: dict) -> Any:
    """torch.geqrf: (the compact reflectors and R, τ) of the factorization above."""
    x = a["self"]
    if x.dim() < 2 or x.is_complex() or not x.is_floating_point():
        return routes.PASS
    if x.dtype != torch.float32:
        raise routes.NotCovered(f"geqrf in {x.dtype}: carbon covers float32")
    lead, (m, n) = list(x.shape[:-2]), x.shape[-2:]
    if x.numel() == 0:
        result = (aten.zeros(lead + [m, n], dtype=x.dtype, device=x.device),
                  aten.zeros(lead + [min(m, n)], dtype=x.dtype, device=x.device))
    else:
        pieces = [_geqrf_one(mat) for mat in x.reshape([math.prod(lead), m, n]).unbind(0)]
        result = (aten.stack([p[0] for p in pieces]).reshape(lead + [m, n]),
                  aten.stack([p[1] for p in pieces]).reshape(lead + [min(m, n)]))
    return routes._into_outs(a, *result, names=("a", "tau"))


def linalg_householder_product(a: dict) -> Any:
    """torch.linalg.householder_product (torch.orgqr): the product of the reflectors stored below the diagonal
    of `input` with scales τ, the module's Q recurrence."""
    x, tau = a["input"], a["tau"]
    if x.dim() < 2 or x.is_complex() or not x.is_floating_point() or tau.dtype != x.dtype \
            or tau.device != x.device or tau.dim() != x.dim() - 1:
        return routes.PASS
    if x.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_householder_product in {x.dtype}: carbon covers float32")
    lead, (m, n) = list(x.shape[:-2]), x.shape[-2:]
    if not (m >= n >= tau.shape[-1]) or list(tau.shape[:-1]) != lead:
        return routes.PASS  # torch's own error
    if x.numel() == 0:
        q = aten.eye(m, n, dtype=x.dtype, device=x.device).expand(lead + [m, n]).contiguous()
    else:
        count = math.prod(lead)
        mats, taus = x.reshape([count, m, n]).unbind(0), tau.reshape([count, tau.shape[-1]]).unbind(0)
        q = aten.stack([_householder_one(mat, t, n) for mat, t in zip(mats, taus)]).reshape(lead + [m, n])
    return q


def _into_qr_outs(a: dict, q: Tensor, r: Tensor) -> Tuple[Tensor, Tensor]:
    """(Q, R), written into linalg_qr.out's Q and R when given."""
    return routes._into_outs(a, q, r, names=("Q", "R"))
