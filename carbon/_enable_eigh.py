"""carbon.enable's route for torch.linalg.eigh / eigvalsh (docs/enable.md): the cyclic Jacobi method with a fixed
schedule and a fixed number of sweeps, in binary64, every step an IEEE operation (the square roots IEEE's, through
routes.sqrt_rn), so the eigenvalues and eigenvectors have the same bits on every device and batch size. LAPACK's syevd and
cuSOLVER's syevj / syevd give different bits (and different eigenvector signs).

For a float32 matrix (only the UPLO triangle read, mirrored; exact in binary64), with n rounded up to an even m
(an odd n's extra index takes no rotations): SWEEPS = 12 sweeps, each of m − 1 rounds of the round-robin
pairing (index 0 fixed, the others rotating: round r pairs position i with position m − 1 − i of the list
0, r + 1, …, m − 1, 1, …, r — the circle method), the n/2 pairs of a round rotated together:

    θ = RN(RN(a_qq − a_pp) / RN(2·a_pq)),  t = RN(σ / RN(|θ| + √RN(RN(θ²) + 1))) with σ = +1 for θ ≥ 0, else −1,
    c = RN(1 / √RN(RN(t²) + 1)),  s = RN(t·c)                    (a_pq = 0: c = 1, s = 0)

columns p and q of A and of V (V₀ = I) become RN(RN(c·x_p) − RN(s·x_q)) and RN(RN(s·x_p) + RN(c·x_q)), then rows
p and q of A likewise, then a_pq = a_qp = 0 (what the exact rotation gives: A ← Jᵀ A J). The eigenvalues
are A's diagonal sorted ascending (stable: equal values keep their index order), each rounded to float32; the
eigenvectors V's columns in that order, each column's sign chosen so that its entry of largest magnitude (the first
such) is positive, rounded to float32. Twelve sweeps bring the off-diagonal part of any matrix of moderate size
(n ≲ 500) to binary64 rounding level (Jacobi converges quadratically), so the float32 results are essentially those
of the exact decomposition.

Cost: 12·(m − 1) rounds of ~30 vectorized operations in Python — ~30 ms for n = 8, ~0.35 s for n = 64 on one CPU
thread. No value is read on the host.
"""

from __future__ import annotations

import math
from typing import Any, List, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["linalg_eigh"]

aten = torch.ops.aten

SWEEPS = 12


def _rounds(n: int) -> List[Tuple[List[int], List[int]]]:
    """The round-robin schedule for n indices: (p's, q's) per round, p < q, pairs with the padding index dropped."""
    m = n + (n % 2)
    rounds = []
    for r in range(m - 1):
        order = [0] + [(r + k) % (m - 1) + 1 for k in range(m - 1)]
        ps, qs = [], []
        for i in range(m // 2):
            a, b = order[i], order[m - 1 - i]
            if max(a, b) < n:
                ps.append(min(a, b))
                qs.append(max(a, b))
        rounds.append((ps, qs))
    return rounds


def _rotate_columns(x: Tensor, p: Tensor, q: Tensor, c: Tensor, s: Tensor) -> Tensor:
    xp, xq = aten.index_select(x, 2, p), aten.index_select(x, 2, q)
    new_p = aten.sub(aten.mul(c, xp), aten.mul(s, xq))
    new_q = aten.add(aten.mul(s, xp), aten.mul(c, xq))
    x = aten.index_copy(x, 2, p, new_p)
    return aten.index_copy(x, 2, q, new_q)


def _schedule(n: int, device: torch.device) -> List[Tuple[Tensor, Tensor]]:
    """_rounds(n) as index tensors on the device (rounds without a pair dropped)."""
    return [(torch.tensor(ps, dtype=torch.int64).to(device), torch.tensor(qs, dtype=torch.int64).to(device))
            for ps, qs in _rounds(n) if ps]


def _rotation(a_pp: Tensor, a_qq: Tensor, a_pq: Tensor) -> Tuple[Tensor, Tensor]:
    """(c, s) of the rotation that zeros a_pq (the module's formulas; c = 1, s = 0 where a_pq = 0), each (N, pairs),
    returned as (N, 1, pairs) for _rotate_columns. The one-sided SVD passes (‖g_p‖², ‖g_q‖², g_p·g_q)."""
    theta = aten.div(aten.sub(a_qq, a_pp), aten.mul(a_pq, 2.0))
    sigma = aten.where(aten.ge(theta, 0.0), 1.0, -1.0)
    t = aten.div(sigma, aten.add(aten.abs(theta), routes.sqrt_rn(aten.add(aten.mul(theta, theta), 1.0))))
    c = aten.div(1.0, routes.sqrt_rn(aten.add(aten.mul(t, t), 1.0)))
    s = aten.mul(t, c)
    rotate = aten.ne(a_pq, 0.0)
    return aten.where(rotate, c, 1.0).unsqueeze(1), aten.where(rotate, s, 0.0).unsqueeze(1)


def _jacobi(a: Tensor) -> Tuple[Tensor, Tensor]:
    """(diagonal, V) after the fixed sweeps, for symmetric A (N, n, n) float64."""
    batch, n, _ = a.shape
    v = aten.eye(n, dtype=a.dtype, device=a.device).expand(batch, n, n).contiguous()
    schedule = _schedule(n, a.device)
    for _ in range(SWEEPS):
        for p, q in schedule:
            diag = aten.diagonal(a, 0, 1, 2)
            c, s = _rotation(aten.index_select(diag, 1, p), aten.index_select(diag, 1, q), a[:, p, q])
            a = _rotate_columns(a, p, q, c, s)
            v = _rotate_columns(v, p, q, c, s)
            a = _rotate_columns(a.transpose(1, 2), p, q, c, s).transpose(1, 2)
            a = aten.index_put(a, [None, p, q], aten.zeros([], dtype=a.dtype, device=a.device))
            a = aten.index_put(a, [None, q, p], aten.zeros([], dtype=a.dtype, device=a.device))
    return aten.diagonal(a, 0, 1, 2), v


def _decompose(a32: Tensor, upper: bool) -> Tuple[Tensor, Tensor]:
    """(eigenvalues (N, n), eigenvectors (N, n, n)) in float32 for A (N, n, n)."""
    a = a32.to(torch.float64)
    a = aten.triu(a) if upper else aten.tril(a)
    a = aten.add(a, aten.transpose(aten.triu(a, 1) if upper else aten.tril(a, -1), 1, 2))  # mirror: exact
    values, vectors = _jacobi(a.contiguous())
    values, order = aten.sort.stable(values, stable=True, dim=1)
    vectors = aten.gather(vectors, 2, order.unsqueeze(1).expand(vectors.shape))
    top = aten.argmax(aten.abs(vectors), 1, True)  # the first entry of largest magnitude in each column
    flip = aten.lt(aten.gather(vectors, 1, top), 0.0)
    vectors = aten.where(flip, aten.neg(vectors), vectors)
    return values.to(torch.float32), vectors.to(torch.float32)


def linalg_eigh(args: dict) -> Any:
    a, uplo, compute_v = args["A"], args.get("UPLO", "L"), args.get("compute_v", True)
    if a.dim() < 2 or a.shape[-1] != a.shape[-2] or not a.is_floating_point() or a.is_complex() \
            or uplo.upper() not in ("L", "U"):
        return routes.PASS  # torch's own error (complex inputs are refused elsewhere)
    if a.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_eigh in {a.dtype}: carbon covers float32")
    lead, n = list(a.shape[:-2]), a.shape[-1]
    if a.numel() == 0:
        values = aten.zeros(lead + [n], dtype=a.dtype, device=a.device)
        vectors = aten.eye(n, dtype=a.dtype, device=a.device).expand(lead + [n, n]).contiguous()
    else:
        values, vectors = _decompose(a.reshape([math.prod(lead), n, n]), uplo.upper() == "U")
        values, vectors = values.reshape(lead + [n]), vectors.reshape(lead + [n, n])
    if not compute_v:
        vectors = aten.empty([0], dtype=a.dtype, device=a.device)
    return routes._into_outs(args, values, vectors, names=("eigenvalues", "eigenvectors"))
