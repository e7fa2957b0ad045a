"""carbon.enable's routes for the LU family (docs/enable.md): torch.linalg.lu_factor(_ex), lu, lu_solve, solve(_ex),
inv(_ex), det, slogdet (and logdet), torch.cholesky_solve and torch.cholesky_inverse. LAPACK's getrf / getrs and
cuSOLVER / MAGMA choose different blockings, so their bits differ between devices (and between batch sizes on a
GPU); here every entry is one rounding of an exact dot product, so the bits are the same everywhere.

**LU with partial pivoting** of A (m × n, k = min(m, n)), column by column j = 0 … k − 1, A' being A with the rows
swapped so far:

    c_i     = RN(A'[i, j] − Σ_{t < j} L[i, t] · U[t, j])     for i ≥ j (exact sum, rounded once)
    p       = the first i ≥ j with |c_i| maximal (NaN counts as maximal, as torch.argmax); swap rows j and p of A',
              of L's first j columns and of c; pivots[j] = p + 1 (LAPACK's 1-based row interchanges)
    U[j, j] = c_j,   L[i, j] = RN(c_i / c_j) for i > j (c_i itself where c_j = 0: the column is then all zeros)
    U[j, l] = RN(A'[j, l] − Σ_{t < j} L[j, t] · U[t, l])     for l > j

so A = P L U with L unit lower triangular. info = 1 + the first j with c_j = 0, else 0 (LAPACK's). pivot=False
skips the search (p = j), on the CPU too (where torch refuses it).

**Solving** A X = B from (LU, pivots): B's rows permuted by the pivots (exact), then L y = B' and U X = y by the
substitution of carbon/_enable_triangular.py (each entry RN(RN(b − exact Σ) / diagonal), no division for L).
adjoint: Uᵀ y = B, Lᵀ z = y, X = P z. left=False solves the transposed system. solve = lu_factor then lu_solve;
inv = solve with the identity.

**det** = ±RN(⋯RN(RN(U₀₀·U₁₁)·U₂₂)⋯) — the diagonal's product in index order, one rounding per step (torch's
`prod` route), the sign from the number of row interchanges. **slogdet**: sign = ±1 from the interchanges and
the signs of the diagonal (0 when an entry is 0); logabsdet = RN(exact Σ_i LOG|U_ii|) with carbon's log. As torch,
det and slogdet factor Aᵀ when A is contiguous (det Aᵀ = det A; their backward formulas expect that LU).

**cholesky_solve** (A = L Lᵀ, or Uᵀ U with L = Uᵀ): L y = B, Lᵀ X = y. **cholesky_inverse**: Y = L⁻¹ by
substitution with the identity, then RN(exact YᵀY) per entry (carbon.bmm), so the result is exactly symmetric, as
LAPACK's potri's.

Cost: a Python loop of k steps of carbon.baddbmm (and n for each substitution) — fine for the small matrices of
flows, Gaussian processes and distributions, slow for large n. Only float32 is covered (torch has no half-precision
LU; float64 raises). No value is read on the host.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from carbon import _enable_routes as routes
from carbon._enable_triangular import _substitute

__all__ = ["linalg_lu_factor_ex", "linalg_lu", "linalg_lu_solve", "linalg_solve_ex", "linalg_inv_ex", "linalg_det",
           "linalg_slogdet", "cholesky_solve", "cholesky_inverse"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _matrix_input(op: str, a: Tensor, square: bool = True) -> bool:
    """True when carbon computes this op of `a`; False for inputs torch refuses itself (PASS: torch's own
    error). float64 raises NotCovered."""
    if a.dim() < 2 or not a.is_floating_point() or a.is_complex() or (square and a.shape[-1] != a.shape[-2]):
        return False
    if a.dtype == torch.float64:
        routes._need_carbon_dtype(op, a)
    return a.dtype == torch.float32


def _swap(t: Tensor, index: Tensor) -> Tensor:
    """t (N, r, c) with its rows reordered by index (N, r)."""
    return aten.gather(t, 1, index.unsqueeze(-1).expand(t.shape))


def _factor(a: Tensor, pivot: bool) -> tuple:
    """(LU, pivots, info) of A (N, m, n) float32: the module's recurrence."""
    batch, m, n = a.shape
    k = min(m, n)
    work = a.contiguous()
    lower = aten.zeros([batch, m, k], dtype=a.dtype, device=a.device)
    upper = aten.zeros([batch, k, n], dtype=a.dtype, device=a.device)
    rows = aten.arange(m, device=a.device).expand(batch, m)
    pivots, zero = [], []
    for j in range(k):
        column = work[:, j:, j:j + 1]
        if j:
            column = carbon_ops.baddbmm(column, aten.neg(lower[:, j:, :j]), upper[:, :j, j:j + 1], None)
        if pivot:
            p = aten.add(aten.argmax(aten.abs(column), 1), j)  # (N, 1): the first largest |c_i|
            index = aten.scatter(rows, 1, p, j)
            index[:, j:j + 1] = p
            work, lower = _swap(work, index), _swap(lower, index)
            column = _swap(column, aten.sub(index[:, j:], j))
            pivots.append(aten.add(p, 1))
        else:
            pivots.append(aten.full([batch, 1], j + 1, dtype=torch.int64, device=a.device))
        head = column[:, :1, :]
        is_zero = aten.eq(head, 0)
        zero.append(is_zero.reshape(-1))
        upper[:, j:j + 1, j:j + 1] = head
        if j + 1 < m:
            lower[:, j + 1:, j:j + 1] = aten.where(is_zero, column[:, 1:], routes.true_divide(column[:, 1:], head))
        if j + 1 < n:
            row = work[:, j:j + 1, j + 1:]
            if j:
                row = carbon_ops.baddbmm(row, aten.neg(lower[:, j:j + 1, :j]), upper[:, :j, j + 1:], None)
            upper[:, j:j + 1, j + 1:] = row
    below = aten.gt(aten.arange(m, device=a.device).unsqueeze(-1), aten.arange(n, device=a.device))
    lu = aten.where(below, aten.constant_pad_nd(lower, [0, n - k]), aten.constant_pad_nd(upper, [0, 0, 0, m - k]))
    if k == 0:
        return lu, aten.zeros([batch, 0], dtype=torch.int32, device=a.device), \
            aten.zeros([batch], dtype=torch.int32, device=a.device)
    failed = aten.stack(zero, 1)
    first = aten.argmax(failed.to(torch.int32), 1)
    info = aten.where(aten.any(failed, 1), aten.add(first, 1), 0).to(torch.int32)
    return lu, aten.cat(pivots, 1).to(torch.int32), info


def _lu_batched(a: Tensor, pivot: bool) -> tuple:
    """_factor over any batch shape: (LU (*, m, n), pivots (*, k), info (*))."""
    batch, (m, n) = list(a.shape[:-2]), a.shape[-2:]
    lu, pivots, info = _factor(a.reshape([math.prod(batch), m, n]), pivot)
    return lu.reshape(batch + [m, n]), pivots.reshape(batch + [min(m, n)]), info.reshape(batch)


def _permutation(pivots: Tensor, m: int) -> Tensor:
    """perm (N, m) with (Pᵀ A)[i] = A[perm[i]]: the row interchanges applied in order."""
    perm = aten.arange(m, device=pivots.device).expand(pivots.shape[0], m).clone()
    for j in range(pivots.shape[1]):
        p = aten.sub(pivots[:, j:j + 1].to(torch.int64), 1)
        at_j, at_p = perm[:, j:j + 1].clone(), aten.gather(perm, 1, p)
        perm = aten.scatter(perm, 1, p, at_j)
        perm[:, j:j + 1] = at_p
    return perm


def _solve_with(lu: Tensor, pivots: Tensor, b: Tensor, adjoint: bool) -> Tensor:
    """X with A X = B (or Aᵀ X = B) for LU (N, n, n), pivots (N, n), B (N, n, r)."""
    n = lu.shape[-1]
    perm = _permutation(pivots, n).unsqueeze(-1).expand(b.shape)
    if not adjoint:
        y = _substitute(lu, aten.gather(b, 1, perm), upper=False, unit=True)
        return _substitute(lu, y, upper=True, unit=False)
    lu_t = lu.transpose(-2, -1)
    y = _substitute(lu_t, b, upper=False, unit=False)
    z = _substitute(lu_t, y, upper=True, unit=True)
    return aten.scatter(aten.empty_like(z), 1, perm, z)


def _lu_solve(lu: Tensor, pivots: Tensor, b: Tensor, left: bool, adjoint: bool) -> Tensor:
    """lu_solve with torch's broadcasting of the batch dimensions (B a matrix)."""
    if not left:  # X A = B  <=>  Aᵀ Xᵀ = Bᵀ (and X Aᵀ = B  <=>  A Xᵀ = Bᵀ)
        return _lu_solve(lu, pivots, b.transpose(-2, -1), True, not adjoint).transpose(-2, -1).contiguous()
    n, r = lu.shape[-1], b.shape[-1]
    batch = list(torch.broadcast_shapes(lu.shape[:-2], pivots.shape[:-1], b.shape[:-2]))
    if math.prod(batch) * n * r == 0:
        return aten.zeros(batch + [n, r], dtype=b.dtype, device=b.device)
    x = _solve_with(lu.expand(batch + [n, n]).reshape([-1, n, n]), pivots.expand(batch + [n]).reshape([-1, n]),
                    b.expand(batch + [n, r]).reshape([-1, n, r]), adjoint)
    return x.reshape(batch + [n, r])


def linalg_lu_factor_ex(args: dict) -> Any:
    a, pivot = args["A"], args.get("pivot", True)
    if not _matrix_input("linalg_lu_factor", a, square=False):
        return routes.PASS
    lu, pivots, info = _lu_batched(a, pivot)
    if args.get("check_errors", False):
        aten._linalg_check_errors(info, "torch.linalg.lu_factor_ex", is_matrix=a.dim() == 2)
    return routes._into_outs(args, lu, pivots, info, names=("LU", "pivots", "info"))


def linalg_lu(args: dict) -> Any:
    """P, L, U with A = P L U from the factorization above."""
    a, pivot = args["A"], args.get("pivot", True)
    if not _matrix_input("linalg_lu", a, square=False):
        return routes.PASS
    lu, pivots, _ = _lu_batched(a, pivot)
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = list(a.shape[:-2])
    rows = aten.arange(m, device=a.device)
    lower = aten.where(aten.eq(rows.unsqueeze(-1), aten.arange(k, device=a.device)), 1.0,
                       aten.tril(lu[..., :k], -1)).to(a.dtype)
    upper = aten.triu(lu[..., :k, :])
    perm = _permutation(pivots.reshape([math.prod(batch), k]), m).reshape(batch + [m])
    # P[perm[i], i] = 1: the identity's columns in the order perm
    p = aten.eq(rows.unsqueeze(-1), perm.unsqueeze(-2)).to(a.dtype)
    return routes._into_outs(args, p, lower, upper, names=("P", "L", "U"))


def linalg_lu_solve(args: dict) -> Any:
    lu, pivots, b = args["LU"], args["pivots"], args["B"]
    if not _matrix_input("linalg_lu_solve", lu) or b.dtype != lu.dtype or b.dim() < 2 or b.device != lu.device:
        return routes.PASS
    left, adjoint = args.get("left", True), args.get("adjoint", False)
    if (b.shape[-2] if left else b.shape[-1]) != lu.shape[-1]:
        return routes.PASS
    x = _lu_solve(lu, pivots, b, left, adjoint)
    return x  # an out= tensor is filled by carbon.enable


def _is_vector_rhs(a: Tensor, b: Tensor) -> bool:
    """torch's rule (linalg_solve_is_vector_rhs): B is a vector when 1-D or of A's batch shape plus n."""
    return b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])


def linalg_solve_ex(args: dict) -> Any:
    """torch.linalg.solve: (result, LU, pivots, info), LU the factorization of A itself (the backward solves
    with adjoint=True)."""
    a, b, left = args["A"], args["B"], args.get("left", True)
    if not _matrix_input("linalg_solve", a) or b.dtype != a.dtype or b.device != a.device:
        return routes.PASS
    vector = _is_vector_rhs(a, b)
    if vector and not left:
        return routes.PASS
    rhs = b.unsqueeze(-1) if vector else b
    if rhs.dim() < 2 or (rhs.shape[-2] if left else rhs.shape[-1]) != a.shape[-1]:
        return routes.PASS
    try:
        torch.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
    except RuntimeError:
        return routes.PASS
    lu, pivots, info = _lu_batched(a, True)
    x = _lu_solve(lu, pivots, rhs, left, False)
    if vector:
        x = x.squeeze(-1)
    if args.get("check_errors", False):
        aten._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=a.dim() == 2)
    return routes._into_outs(args, x, lu, pivots, info, names=("result", "LU", "pivots", "info"))


def linalg_inv_ex(args: dict) -> Any:
    a = args["A"]
    if not _matrix_input("linalg_inv", a):
        return routes.PASS
    lu, pivots, info = _lu_batched(a, True)
    n = a.shape[-1]
    eye = aten.eye(n, dtype=a.dtype, device=a.device).expand(a.shape)
    x = _lu_solve(lu, pivots, eye, True, False)
    if args.get("check_errors", False):
        aten._linalg_check_errors(info, "torch.linalg.inv_ex", is_matrix=a.dim() == 2)
    return routes._into_outs(args, x, info, names=("inverse", "info"))


def _det_factor(a: Tensor) -> tuple:
    """(LU, pivots, U's diagonal) with torch's choice for det and slogdet: the LU of Aᵀ when A is contiguous
    (det Aᵀ = det A), else of A."""
    lu, pivots, _ = _lu_batched(a.transpose(-2, -1) if a.is_contiguous() else a, True)
    return lu, pivots, aten.diagonal(lu, 0, -2, -1)


def _odd_interchanges(pivots: Tensor) -> Tensor:
    k = pivots.shape[-1]
    steps = aten.arange(1, k + 1, device=pivots.device, dtype=torch.int32)
    return aten.remainder(aten.sum(aten.ne(pivots, steps).to(torch.int64), [-1]), 2).to(torch.bool)


def linalg_det(args: dict) -> Any:
    a = args["A"]
    if not _matrix_input("linalg_det", a):
        return routes.PASS
    lu, pivots, diagonal = _det_factor(a)
    det = aten.ones(a.shape[:-2], dtype=a.dtype, device=a.device)
    if diagonal.shape[-1]:
        det = diagonal[..., 0].clone()
        for i in range(1, diagonal.shape[-1]):
            det = aten.mul(det, diagonal[..., i])
    det = aten.where(_odd_interchanges(pivots), aten.neg(det), det)
    return routes._into_outs(args, det, lu, pivots, names=("result", "LU", "pivots"))


def linalg_slogdet(args: dict) -> Any:
    a = args["A"]
    if not _matrix_input("linalg_slogdet", a):
        return routes.PASS
    lu, pivots, diagonal = _det_factor(a)
    negative = aten.sum(aten.lt(diagonal, 0).to(torch.int64), [-1])
    flips = aten.logical_xor(aten.remainder(negative, 2).to(torch.bool), _odd_interchanges(pivots))
    sign = aten.where(aten.any(aten.eq(diagonal, 0), -1), 0.0, aten.where(flips, -1.0, 1.0)).to(a.dtype)
    logabsdet = aten.zeros(a.shape[:-2], dtype=a.dtype, device=a.device)
    if diagonal.shape[-1]:
        logabsdet = carbon_ops.sum(carbon_ops.log(aten.abs(diagonal).contiguous()), [-1], False, None)
    return routes._into_outs(args, sign, logabsdet, lu, pivots, names=("sign", "logabsdet", "LU", "pivots"))


def _cholesky_input(op: str, b: Optional[Tensor], factor: Tensor) -> bool:
    if not _matrix_input(op, factor):
        return False
    return b is None or (b.dtype == factor.dtype and b.device == factor.device and b.dim() >= 2
                         and b.shape[-2] == factor.shape[-1])


def cholesky_solve(args: dict) -> Any:
    """X with (L Lᵀ) X = B: L y = B, Lᵀ X = y (upper: Uᵀ y = B, U X = y)."""
    b, factor, upper = args["self"], args["input2"], args.get("upper", False)
    if not _cholesky_input("cholesky_solve", b, factor):
        return routes.PASS
    try:
        batch = list(torch.broadcast_shapes(factor.shape[:-2], b.shape[:-2]))
    except RuntimeError:
        return routes.PASS
    n, r = factor.shape[-1], b.shape[-1]
    if math.prod(batch) * n * r == 0:
        x = aten.zeros(batch + [n, r], dtype=b.dtype, device=b.device)
    else:
        f = factor.expand(batch + [n, n]).reshape([-1, n, n])
        low = f.transpose(-2, -1) if upper else f
        y = _substitute(low, b.expand(batch + [n, r]).reshape([-1, n, r]), upper=False, unit=False)
        x = _substitute(low.transpose(-2, -1), y, upper=True, unit=False).reshape(batch + [n, r])
    return x  # an out= tensor is filled by carbon.enable


def cholesky_inverse(args: dict) -> Any:
    """(L Lᵀ)⁻¹ = YᵀY with Y = L⁻¹ by substitution, each entry one rounding (upper: the same with L = Uᵀ, so
    cholesky_inverse(Lᵀ, upper=True) has the bits of cholesky_inverse(L))."""
    factor, upper = args["self"], args.get("upper", False)
    if not _cholesky_input("cholesky_inverse", None, factor):
        return routes.PASS
    n, batch = factor.shape[-1], list(factor.shape[:-2])
    if math.prod(batch) * n == 0:
        x = aten.zeros(batch + [n, n], dtype=factor.dtype, device=factor.device)
    else:
        f = factor.reshape([-1, n, n])
        low = f.transpose(-2, -1) if upper else f
        eye = aten.eye(n, dtype=f.dtype, device=f.device).expand(f.shape).contiguous()
        y = _substitute(low, eye, upper=False, unit=False)
        x = carbon_ops.bmm(y.transpose(-2, -1).contiguous(), y, None).reshape(batch + [n, n])
    return x  # an out= tensor is filled by carbon.enable
