"""carbon.enable's route for torch.linalg.matrix_exp (docs/enable.md): scaling and squaring with a degree-18 Taylor
polynomial, every product an exact dot product rounded once (carbon.bmm). torch chooses among polynomial degrees
and evaluation schemes by the matrix's norm, with different kernels per device; here the scheme is fixed and
only the number of squarings depends on the matrix.

For a float32 matrix A (n × n): ‖A‖₁ = max_j RN(exact Σᵢ |Aᵢⱼ|); s = the least s ≥ 0 with ‖A‖₁ ≤ θ·2ˢ,
θ = 3.010066362817634 (torch's bound for degree 18; the Taylor remainder there is below 2⁻²⁶ of the result);
B = RN(A·2⁻ˢ); X₁₉ = I and, for k = 18 … 1, Xₖ = RN(I + RN(RN(B·Xₖ₊₁) / k)) (Horner's rule); then X₁ is
squared s times, X ← RN(X·X). Batches: each matrix with its own s.

The norms are read on the host to count the squarings (one synchronization per call, as torch's own matrix_exp
makes; such a call cannot be captured in a CUDA graph). The backward is torch's formula: the matrix exponential
of a 2n × 2n block matrix, through this route again.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["linalg_matrix_exp"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

THETA = 3.010066362817634
DEGREE = 18


def _squarings(norm: float) -> int:
    """The least s ≥ 0 with norm ≤ θ·2ˢ (exact comparisons; NaN and ∞ give 0: the result is NaN anyway)."""
    if not math.isfinite(norm):
        return 0
    s = 0
    while norm > THETA * 2.0 ** s:
        s += 1
    return s


def _matrix_exp(a: Tensor) -> Tensor:
    """The module's definition for A (N, n, n) float32."""
    batch, n, _ = a.shape
    norms = aten.amax(carbon_ops.sum(aten.abs(a).contiguous(), [1], False, None), [1])  # max column sum
    counts = [_squarings(v) for v in norms.tolist()]  # the host read
    scale = torch.tensor([2.0 ** -s for s in counts], dtype=torch.float32).to(a.device)
    b = aten.mul(a, scale.reshape(batch, 1, 1))
    eye = aten.eye(n, dtype=a.dtype, device=a.device).expand(batch, n, n).contiguous()
    x = eye
    for k in range(DEGREE, 0, -1):
        x = aten.add(eye, routes.true_divide(carbon_ops.bmm(b, x, None), float(k)))
    steps = torch.tensor(counts, dtype=torch.int64).to(a.device).reshape(batch, 1, 1)
    for i in range(max(counts, default=0)):
        x = aten.where(aten.gt(steps, i), carbon_ops.bmm(x, x, None), x)
    return x


def linalg_matrix_exp(args: dict) -> Any:
    a = args["self"]
    if a.dim() < 2 or a.shape[-1] != a.shape[-2] or not a.is_floating_point() or a.is_complex():
        return routes.PASS  # torch's own error (complex inputs are refused elsewhere)
    if a.dtype != torch.float32:
        raise routes.NotCovered(f"linalg_matrix_exp in {a.dtype}: carbon covers float32")
    lead, n = list(a.shape[:-2]), a.shape[-1]
    if a.numel() == 0:
        result = aten.eye(n, dtype=a.dtype, device=a.device).expand(lead + [n, n]).contiguous()
    else:
        result = _matrix_exp(a.reshape([math.prod(lead), n, n])).reshape(lead + [n, n])
    return result  # an out= tensor is filled by carbon.enable
