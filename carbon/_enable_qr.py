"""carbon.enable's route for torch.linalg.qr (docs/enable.md): Householder QR as a fixed sequence of exact dot
products (carbon.mm, one rounding each) and single IEEE operations, so Q and R have the same bits on every
device and thread count. torch.nn.init.orthogonal_ — the usual initialization of RL policy and value networks
— draws a normal matrix and takes the Q of its QR; LAPACK and cuSOLVER give different bits.

For an m × n float32 matrix A and k = 0 … min(m, n) − 1, on the column x = A[k:, k] (α = x₀, the rest r):
    s = RN(Σ r²), ν = RN(Σ x²) (exact sums, rounded once), β = −copysign(RN(√ν), α),
    τ = RN(RN(β − α) / β), v = (1, RN(r / RN(α − β))), t = RN(τ·v);
    when s = 0 (no sub-diagonal mass): β = α, τ = 0, v = t = (1, 0, …) and nothing changes;
    the trailing columns A[k:, k+1:] ← RN(A − RN(tᵢ·wⱼ)) with w = RN(vᵀ A[k:, k+1:]) (exact dot products);
    R[k, k] = β, and R is the upper triangle of the final A.
Q = H₀ H₁ … from the identity's first columns (min(m, n) of them, or m with mode="complete"), applied last
first, each as Q[k:, k:] ← RN(Q − RN(tᵢ·wⱼ)), w = RN(vᵀ Q[k:, k:]) (LAPACK's dorg2r order). This is LAPACK's
geqr2 / org2r algorithm with its sign convention; only the arithmetic is pinned down.

Cost: 2·min(m, n) steps of carbon.mm on a vector and a block, in Python — milliseconds for the matrices of
RL networks, seconds for 1024-wide ones. No value is read on the host (no device synchronization).
"""

from __future__ import annotations

from typing import Any, List, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["linalg_qr"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _dot_rows(v: Tensor, block: Tensor) -> Tensor:
    """RN(exact vᵀ block), one rounding per column: (1, columns)."""
    return carbon_ops.mm(v.reshape(1, -1), block)


def _reflect(block: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """RN(block − RN(tᵢ · wⱼ)) with w = RN(vᵀ block): two roundings per element, no fused operation."""
    w = _dot_rows(v, block)
    return aten.sub(block, aten.mul(t.reshape(-1, 1), w))


def _reflector(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(β, τ, v) of the column x, as in the module's docstring; β, τ of shape (1,)."""
    alpha, rest = x[:1], x[1:]
    s = _dot_rows(rest, rest.reshape(-1, 1)).reshape(1)
    nu = _dot_rows(x, x.reshape(-1, 1)).reshape(1)
    beta = aten.neg(aten.copysign(routes.sqrt_rn(nu), alpha))
    flat = aten.eq(s, 0)
    beta = aten.where(flat, alpha, beta)
    zero = aten.zeros_like(alpha)
    tau = aten.where(flat, zero, routes.true_divide(aten.sub(beta, alpha), beta))
    scaled = routes.true_divide(rest, aten.sub(alpha, beta))
    v = aten.cat([aten.ones_like(alpha), aten.where(flat, zero, scaled)])
    return beta, tau, v


def _qr_one(a: Tensor, mode: str) -> Tuple[Tensor, Tensor]:
    m, n = a.shape
    kk = min(m, n)
    work = a.clone(memory_format=torch.contiguous_format)
    reflectors: List[Tuple[Tensor, Tensor]] = []
    for k in range(kk):
        beta, tau, v = _reflector(work[k:, k])
        t = aten.mul(tau, v)
        if k + 1 < n:
            work[k:, k + 1:] = _reflect(work[k:, k + 1:], t, v)
        work[k, k] = beta.reshape(())
        reflectors.append((t, v))
    rows = m if mode == "complete" else kk
    r = aten.triu(work[:rows] if mode != "complete" else work)
    if mode == "r":
        return aten.empty([0], dtype=a.dtype, device=a.device), r
    q = aten.eye(m, rows, dtype=a.dtype, device=a.device)
    for k in reversed(range(kk)):
        t, v = reflectors[k]
        q[k:, k:] = _reflect(q[k:, k:], t, v)
    return q, r


def linalg_qr(a: dict) -> Any:
    x, mode = a["A"], a.get("mode", "reduced")
    if x.dim() < 2 or mode not in ("reduced", "complete", "r") or x.is_complex():
        return routes.PASS  # torch's own error (or a complex QR, which carbon refuses elsewhere)
    if x.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_qr in {x.dtype}: carbon covers float32")
    lead, (m, n) = list(x.shape[:-2]), x.shape[-2:]
    pieces = [_qr_one(mat, mode) for mat in x.reshape([-1, m, n]).unbind(0)]
    if not pieces:  # an empty batch
        q_cols = m if mode == "complete" else min(m, n)
        q = aten.empty(lead + ([m, q_cols] if mode != "r" else [0]), dtype=x.dtype, device=x.device)
        r_rows = m if mode == "complete" else min(m, n)
        return q, aten.empty(lead + [r_rows, n], dtype=x.dtype, device=x.device)
    qs, rs = zip(*pieces)
    q = aten.stack(list(qs)) if mode != "r" else qs[0]
    q = q.reshape(lead + list(q.shape[1:])) if mode != "r" else q
    return q, aten.stack(list(rs)).reshape(lead + list(rs[0].shape))
