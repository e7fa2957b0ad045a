"""carbon.enable's routes for torch.linalg.svd / svdvals, pinv and lstsq (docs/enable.md): the one-sided Jacobi
method (Hestenes) with a fixed schedule and a fixed number of sweeps, in binary64, every step an IEEE operation,
IEEE's binary64 square root (routes.sqrt_rn) or a sum in a fixed pairwise order, so U, S and Vh have the same bits
on every device and batch size. LAPACK's gesdd and cuSOLVER's gesvdj give different bits (and different signs).

For a float32 matrix A (m × n) with m ≥ n (otherwise the SVD of Aᵀ, transposed back), G = A in binary64 and
V = I: SWEEPS = 12 sweeps of the circle method's rounds over the n columns (the pairing of carbon/_enable_eigh.py),
a round's pairs rotated together:

    α = Σ g_p², β = Σ g_q², γ = Σ g_p·g_q        (each product rounded, then summed pairwise: x₀ + x₁, x₂ + x₃, …,
                                                   level by level, an odd level padded with +0)
    ζ = RN(RN(β − α) / RN(2γ)),  t = RN(σ / RN(|ζ| + √RN(RN(ζ²) + 1))) with σ = +1 for ζ ≥ 0, else −1,
    c = RN(1 / √RN(RN(t²) + 1)),  s = RN(t·c)                    (γ = 0: c = 1, s = 0)

and columns p, q of G and V become RN(RN(c·x_p) − RN(s·x_q)) and RN(RN(s·x_p) + RN(c·x_q)). Then σ_j = √(Σ g_j²)
(the same pairwise sum), sorted descending (stable); V's columns and G's in that order; u_j = RN(g_j / σ_j), each
pair (u_j, v_j) signed so that v_j's first entry of largest magnitude is positive; S, U, V rounded to float32. Columns
with σ_j = 0 — and, with full_matrices, the columns beyond n — come from the complete QR (carbon's Householder QR,
carbon/_enable_qr.py) of the float32 U whose zero-σ columns are set to 0: its Q's columns there are orthogonal to
the others. Vh = Vᵀ.

Cost: 12·(n − 1) Python rounds of ~50 vectorized operations — ~0.04 s for 8 columns, ~0.4 s for 64 on one CPU thread. No
value is read on the host.
"""

from __future__ import annotations

import math
from typing import Any, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes
from carbon._enable_eigh import _rotate_columns, _rotation, _schedule, linalg_eigh
from carbon._enable_qr import _qr_one

__all__ = ["linalg_svd", "linalg_pinv", "linalg_lstsq"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

SWEEPS = 12


def _pairwise_sum(x: Tensor) -> Tensor:
    """Σ over dimension 1 in a fixed pairwise order (adjacent pairs, level by level, +0 padding an odd level)."""
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = aten.constant_pad_nd(x, [0, 0, 0, 1] if x.dim() == 3 else [0, 1])
        x = aten.add(x[:, 0::2], x[:, 1::2])
    return x[:, 0]


def _one_sided_jacobi(g: Tensor) -> Tuple[Tensor, Tensor]:
    """(G, V) after the fixed sweeps, for G (N, m, n) float64 with m ≥ n."""
    batch, _, n = g.shape
    v = aten.eye(n, dtype=g.dtype, device=g.device).expand(batch, n, n).contiguous()
    schedule = _schedule(n, g.device)
    for _ in range(SWEEPS):
        for p, q in schedule:
            gp, gq = aten.index_select(g, 2, p), aten.index_select(g, 2, q)
            c, s = _rotation(_pairwise_sum(aten.mul(gp, gp)), _pairwise_sum(aten.mul(gq, gq)),
                             _pairwise_sum(aten.mul(gp, gq)))  # α, β, γ: ζ = (β − α)/(2γ)
            g = _rotate_columns(g, p, q, c, s)
            v = _rotate_columns(v, p, q, c, s)
    return g, v


def _svd_tall(a32: Tensor, full: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(U, S, V) in float32 for A (N, m, n), m ≥ n: the module's definition (V, not Vh)."""
    batch, m, n = a32.shape
    g, v = _one_sided_jacobi(a32.to(torch.float64))
    norms = routes.sqrt_rn(_pairwise_sum(aten.mul(g, g)))  # (N, n)
    norms, order = aten.sort.stable(norms, stable=True, dim=1, descending=True)
    g = aten.gather(g, 2, order.unsqueeze(1).expand(g.shape))
    v = aten.gather(v, 2, order.unsqueeze(1).expand(v.shape))
    top = aten.argmax(aten.abs(v), 1, True)
    flip = aten.lt(aten.gather(v, 1, top), 0.0)  # (N, 1, n)
    v = aten.where(flip, aten.neg(v), v)
    g = aten.where(flip, aten.neg(g), g)
    nonzero = aten.gt(norms, 0.0).unsqueeze(1)  # (N, 1, n)
    u = aten.where(nonzero, aten.div(g, aten.where(nonzero, norms.unsqueeze(1), 1.0)), 0.0).to(torch.float32)
    columns = m if full else n
    if full and m > n or not _all_true(nonzero):
        completion = aten.stack([_qr_one(mat, "complete")[0] for mat in u.unbind(0)])  # (N, m, m)
        padded = aten.constant_pad_nd(u, [0, m - n])
        keep = aten.constant_pad_nd(nonzero, [0, m - n], False) if m > n else nonzero
        u = aten.where(keep, padded, completion)[:, :, :columns]
    return u, norms.to(torch.float32), v.to(torch.float32)


def _all_true(mask: Tensor) -> bool:
    """Whether no σ is zero — decided without a host read: False whenever the tensor is not on the CPU, so the
    completion (which leaves nonzero-σ columns unchanged) is then always taken."""
    return mask.device.type == "cpu" and bool(mask.all())


def linalg_svd(args: dict) -> Any:
    a, full, compute_uv = args["A"], args.get("full_matrices", False), args.get("compute_uv", True)
    if a.dim() < 2 or not a.is_floating_point() or a.is_complex():
        return routes.PASS  # torch's own error (complex inputs are refused elsewhere)
    if a.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_svd in {a.dtype}: carbon covers float32")
    lead, (m, n) = list(a.shape[:-2]), a.shape[-2:]
    k = min(m, n)
    if a.numel() == 0:
        u = aten.eye(m, m if full else k, dtype=a.dtype, device=a.device).expand(lead + [m, m if full else k])
        vh = aten.eye(n if full else k, n, dtype=a.dtype, device=a.device).expand(lead + [n if full else k, n])
        s = aten.zeros(lead + [k], dtype=a.dtype, device=a.device)
        u, vh = u.contiguous(), vh.contiguous()
    else:
        flat = a.reshape([math.prod(lead), m, n])
        if m >= n:
            u, s, v = _svd_tall(flat, full)
        else:  # Aᵀ = U' S V'ᵀ  =>  A = V' S U'ᵀ
            v, s, u = _svd_tall(flat.transpose(1, 2).contiguous(), full)
        u = u.reshape(lead + list(u.shape[1:]))
        vh = v.transpose(1, 2).contiguous().reshape(lead + [v.shape[2], v.shape[1]])
        s = s.reshape(lead + [k])
    if not compute_uv:
        u = aten.empty([0], dtype=a.dtype, device=a.device)
        vh = aten.empty([0], dtype=a.dtype, device=a.device)
    return routes._into_outs(args, u, s, vh, names=("U", "S", "Vh"))


def _tolerances(a: Tensor, args: dict) -> Tuple[Tensor, Tensor]:
    """torch's (atol, rtol) for pinv: rcond is a relative tolerance; without rtol, rtol = ε·max(m, n) (0 where a
    positive atol is given), float32 ε = 2⁻²³."""
    def scalar(v: Any) -> Tensor:
        return v.to(a.dtype) if isinstance(v, Tensor) else aten.full([], float(v), dtype=a.dtype, device=a.device)
    if "rcond" in args:
        return scalar(0.0), scalar(args["rcond"])
    atol, rtol = args.get("atol"), args.get("rtol")
    default = scalar(2.0 ** -23 * max(a.shape[-1], a.shape[-2]))
    if rtol is None:
        rtol = default if atol is None else aten.where(aten.gt(scalar(atol), 0.0), 0.0, default)
    return scalar(0.0 if atol is None else atol), scalar(rtol)


def linalg_pinv(args: dict) -> Any:
    """torch's definition on carbon's decompositions: V·diag(s⁺)·Uᵀ with s⁺ = RN(1/σ) where σ > tol, else 0,
    tol = max(atol, RN(rtol·σ_max)); hermitian: U·diag(λ⁺)·Uᵀ from eigh with |λ| against the tolerance. The scaling is
    one rounding per element, the product an exact sum rounded once (carbon.bmm)."""
    a, hermitian = args["self"], args.get("hermitian", False)
    if a.dim() < 2 or not a.is_floating_point() or a.is_complex():
        return routes.PASS
    if a.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_pinv in {a.dtype}: carbon covers float32")
    atol, rtol = _tolerances(a, args)
    lead, (m, n) = list(a.shape[:-2]), a.shape[-2:]
    if a.numel() == 0:
        result = aten.zeros(lead + [n, m], dtype=a.dtype, device=a.device)
    elif hermitian:
        values, vectors = linalg_eigh({"A": a, "UPLO": "L"})
        magnitude = aten.abs(values)
        tol = aten.maximum(atol.unsqueeze(-1), aten.mul(rtol.unsqueeze(-1), aten.amax(magnitude, [-1], True)))
        inverse = aten.where(aten.gt(magnitude, tol), routes.true_divide(1.0, values), 0.0)
        left = aten.mul(vectors, inverse.unsqueeze(-2)).reshape([-1, m, n])
        result = carbon_ops.bmm(left, vectors.reshape([-1, m, n]).transpose(1, 2).contiguous(), None)
        result = result.reshape(lead + [n, m])
    else:
        u, sv, vh = linalg_svd({"A": a, "full_matrices": False})
        tol = aten.maximum(atol.unsqueeze(-1), aten.mul(rtol.unsqueeze(-1), sv[..., :1]))
        inverse = aten.where(aten.gt(sv, tol), routes.true_divide(1.0, sv), 0.0)
        k = min(m, n)
        left = aten.mul(vh.transpose(-2, -1), inverse.unsqueeze(-2)).reshape([-1, n, k]).contiguous()
        result = carbon_ops.bmm(left, u.reshape([-1, m, k]).transpose(1, 2).contiguous(), None)
        result = result.reshape(lead + [n, m])
    return result  # an out= tensor is filled by carbon.enable


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def linalg_lstsq(args: dict) -> Any:
    """torch.linalg.lstsq with one definition on every device: the minimum-norm least-squares solution from the
    SVD above, X = RN(exact V·RN(s⁺·RN(exact UᵀB))) with s⁺ = RN(1/σ) where σ > RN(rcond·σ_max), else 0 (rcond
    defaults to 2⁻²³·max(m, n)). The other outputs follow the driver's rules (None is the CPU's default, gelsy):
    rank = the number of σ above the tolerance (gelsy, gelsd, gelss), the singular values (gelsd, gelss), and for
    gels / gelsd / gelss with m > n and every matrix of full rank, the residuals RN(exact Σᵢ RN(exact AX − B)ᵢ²)
    per column (that check reads the ranks on the host, as torch does)."""
    a, b, driver = args["self"], args["b"], args.get("driver") or "gelsy"
    if a.dim() < 2 or not a.is_floating_point() or a.is_complex() or b.dtype != a.dtype or b.device != a.device \
            or driver not in _LSTSQ_DRIVERS:
        return routes.PASS  # torch's own error
    if a.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_lstsq in {a.dtype}: carbon covers float32")
    vector = b.dim() == a.dim() - 1
    rhs = b.unsqueeze(-1) if vector else b
    m, n = a.shape[-2:]
    if rhs.dim() < 2 or rhs.shape[-2] != m:
        return routes.PASS
    try:
        lead = list(torch.broadcast_shapes(a.shape[:-2], rhs.shape[:-2]))
    except RuntimeError:
        return routes.PASS
    k, count, r = min(m, n), math.prod(lead), rhs.shape[-1]
    rcond = args.get("rcond")
    rcond = 2.0 ** -23 * max(m, n) if rcond is None else rcond
    a_flat = a.expand(lead + [m, n]).reshape([count, m, n])
    b_flat = rhs.expand(lead + [m, r]).reshape([count, m, r])
    if count * k == 0:
        sv = aten.zeros([count, k], dtype=a.dtype, device=a.device)
        x = aten.zeros([count, n, r], dtype=a.dtype, device=a.device)
    else:
        u, sv, vh = linalg_svd({"A": a_flat, "full_matrices": False})
        tol = aten.mul(sv[:, :1], float(rcond))
        inverse = aten.where(aten.gt(sv, tol), routes.true_divide(1.0, sv), 0.0)  # (count, k)
        c = carbon_ops.bmm(u.transpose(1, 2).contiguous(), b_flat.contiguous(), None)  # (count, k, r)
        d = aten.mul(c, inverse.unsqueeze(-1))
        x = carbon_ops.bmm(vh.transpose(1, 2).contiguous(), d, None)  # (count, n, r)
    rank = aten.sum(aten.gt(sv, aten.mul(sv[:, :1], float(rcond))).to(torch.int64), [-1]) if k else \
        aten.zeros([count], dtype=torch.int64, device=a.device)
    empty = aten.empty([0], dtype=a.dtype, device=a.device)
    residuals = empty
    if driver != "gelsy" and m > n and count and bool(aten.all(aten.eq(rank, n)).cpu()):  # the host read
        diff = carbon_ops.baddbmm(aten.neg(b_flat).contiguous(), a_flat.contiguous(), x, None)  # RN(AX − B)
        squares = carbon_ops.bmm(diff.transpose(1, 2).contiguous(), diff, None)  # (count, r, r)
        residuals = aten.diagonal(squares, 0, 1, 2).reshape(lead + [r])
        residuals = residuals.squeeze(-1) if vector else residuals
    solution = x.reshape(lead + [n, r])
    solution = solution.squeeze(-1) if vector else solution
    rank_out = rank.reshape(lead) if driver != "gels" else aten.empty([0], dtype=torch.int64, device=a.device)
    values = sv.reshape(lead + [k]) if driver in ("gelsd", "gelss") else empty
    return routes._into_outs(args, solution, residuals, rank_out, values,
                             names=("solution", "residuals", "rank", "singular_values"))
