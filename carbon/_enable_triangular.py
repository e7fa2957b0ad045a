"""carbon.enable's routes for torch.linalg.solve_triangular and torch.linalg.cholesky(_ex) (docs/enable.md):
substitution and the Cholesky factorization as fixed sequences of exact dot products (carbon.baddbmm, one
rounding each), one division (or square root) per element, so the results have the same bits on every device,
thread count and batch size. torch.distributions.MultivariateNormal factors its covariance with cholesky and
evaluates log_prob through solve_triangular (the Mahalanobis term L⁻¹(x − μ)); LAPACK and cuSOLVER / cuBLAS
give different bits.

**solve_triangular.**
For A X = B with A lower triangular (n × n) and the rows of X computed in order i = 0 … n − 1:

    X[i, :] = RN( RN(B[i, :] − Σ_{j < i} A[i, j] · X[j, :]) / A[i, i] )

(the sum exact, rounded once with B inside it; no division with unitriangular=True). Upper triangular: the
rows in the order n − 1 … 0 with j > i. left=False (X A = B) solves Aᵀ Xᵀ = Bᵀ in the same way. Only A's
triangle is read. Batch dimensions broadcast as in torch; each matrix is solved alone.

**cholesky** (lower; A's lower triangle is read), column by column j = 0 … n − 1:

    c_i = RN(A[i, j] − Σ_{k < j} L[i, k] · L[j, k])   for i ≥ j (exact sums, rounded once)
    L[j, j] = RN(√c_j),   L[i, j] = RN(c_i / L[j, j])   for i > j

upper=True factors the transpose of A's upper triangle and returns Lᵀ. info (cholesky_ex) is 0, or 1 + the
first j whose c_j is not > 0 (NaN included), as LAPACK's; the columns from there on are whatever the formulas
give (NaN), where LAPACK leaves them unspecified. torch.linalg.cholesky raises from info, as without carbon.

Cost: n steps of carbon.baddbmm in Python — fine for the small matrices of distributions (action or latent
dimensions), slow for large n. No value is read on the host (no device synchronization).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["linalg_solve_triangular", "linalg_cholesky_ex"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _substitute(a: Tensor, b: Tensor, upper: bool, unit: bool) -> Tensor:
    """X with A X = B for A (N, n, n) triangular and B (N, n, k): the module's recurrence, row by row."""
    n = a.shape[-1]
    minus_a = aten.neg(a)  # exact: the dot products then give RN(b - sum)
    x = aten.empty_like(b, memory_format=torch.contiguous_format)
    for i in (reversed(range(n)) if upper else range(n)):
        known = slice(i + 1, n) if upper else slice(0, i)
        row = b[:, i:i + 1, :]
        if known.stop > known.start:
            row = carbon_ops.baddbmm(row, minus_a[:, i:i + 1, known], x[:, known, :], None)
        if not unit:
            row = routes.true_divide(row, a[:, i:i + 1, i:i + 1])
        x[:, i:i + 1, :] = row
    return x


def linalg_solve_triangular(args: dict) -> Any:
    a, b = args["self"], args["B"]
    upper, left, unit = args["upper"], args.get("left", True), args.get("unitriangular", False)
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != a.shape[-2] or a.dtype != b.dtype or a.device != b.device \
            or not a.is_floating_point() or a.is_complex():
        return routes.PASS  # torch's own error (complex ones are refused elsewhere)
    routes._need_carbon_dtype("linalg_solve_triangular", a)
    n = a.shape[-1]
    if (b.shape[-2] if left else b.shape[-1]) != n:
        return routes.PASS
    try:
        batch = list(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except RuntimeError:
        return routes.PASS
    if not left:  # X A = B  <=>  A^T X^T = B^T
        a, b, upper = a.transpose(-2, -1), b.transpose(-2, -1), not upper
    k = b.shape[-1]
    if math.prod(batch) * n * k == 0:  # nothing to solve
        x = aten.empty(batch + [n, k], dtype=b.dtype, device=b.device)
    else:
        a = a.expand(batch + [n, n]).reshape([-1, n, n])
        b = b.expand(batch + [n, k]).reshape([-1, n, k])
        x = _substitute(a, b, upper, unit).reshape(batch + [n, k])
    return x if left else x.transpose(-2, -1).contiguous()


def _cholesky_lower(a: Tensor) -> tuple:
    """(L, info) for A (N, n, n): the module's column recurrence; info (N,) int32."""
    n = a.shape[-1]
    lower = aten.zeros_like(a, memory_format=torch.contiguous_format)
    bad = []
    for j in range(n):
        column = a[:, j:, j:j + 1]
        if j:
            column = carbon_ops.baddbmm(column, aten.neg(lower[:, j:, :j]), lower[:, j:j + 1, :j].transpose(-2, -1), None)
        pivot = column[:, :1, :]
        bad.append(aten.logical_not(aten.gt(pivot, 0)).reshape(-1))  # NaN is not > 0
        root = routes.sqrt_rn(pivot)
        lower[:, j:j + 1, j:j + 1] = root
        if j + 1 < n:
            lower[:, j + 1:, j:j + 1] = routes.true_divide(column[:, 1:, :], root)
    failed = aten.stack(bad, 1)  # (N, n)
    first = aten.argmax(failed.to(torch.int32), 1)  # the first failing column (0 when none fails)
    info = aten.where(aten.any(failed, 1), aten.add(first, 1), 0).to(torch.int32)
    return lower, info


def linalg_cholesky_ex(args: dict) -> Any:
    a, upper = args["self"], args.get("upper", False)
    if a.dim() < 2 or a.shape[-1] != a.shape[-2] or not a.is_floating_point() or a.is_complex():
        return routes.PASS  # torch's own error
    routes._need_carbon_dtype("linalg_cholesky", a)
    n, batch = a.shape[-1], list(a.shape[:-2])
    if math.prod(batch) * n == 0:
        lower = aten.zeros(batch + [n, n], dtype=a.dtype, device=a.device)
        info = aten.zeros(batch, dtype=torch.int32, device=a.device)
    else:
        source = a.transpose(-2, -1) if upper else a
        lower, info = _cholesky_lower(source.reshape([-1, n, n]))
        lower, info = lower.reshape(batch + [n, n]), info.reshape(batch)
    factor = lower.transpose(-2, -1).contiguous() if upper else lower
    if args.get("check_errors", False):  # torch's own check (reads info on the host, as torch does)
        aten._linalg_check_errors(info, "torch.linalg.cholesky_ex", is_matrix=a.dim() == 2)
    return routes._into_outs(args, factor, info, names=("L", "info"))
