"""Exact reference for matrix products, independent of Carbon's kernels:
:func:`correctly_rounded_reference`, :func:`count_correctly_rounded`,
:func:`round_double_to` and :func:`sample_indices` (used by the benchmarks;
until the training demo replaced it, the matmul demo of carbon/demo.py).

Every product of two float32 / bfloat16 / float16 values is exact in double,
and ``math.fsum`` returns the exact sum of doubles rounded once to double
(d = RN64(c)). Rounding d again to float32 can be wrong only when d lies
exactly on a float32 midpoint (every float32 midpoint is a double, so
otherwise c and d are on the same side of every midpoint); in that case the
sign of ``fsum(terms + [-d])`` (exact, since fsum is correctly rounded) says
which way c lies. The same holds for bfloat16 and float16. The final rounding
is done with exact integer arithmetic here, not with a hardware conversion.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "correctly_rounded_reference",
    "count_correctly_rounded",
    "round_double_to",
    "sample_indices",
]

# (precision incl. hidden bit, exponent of the smallest normal, largest exponent)
_FORMATS = {
    torch.float32: (24, -126, 127),
    torch.bfloat16: (8, -126, 127),
    torch.float16: (11, -14, 15),
}


def round_double_to(d: float, dtype: torch.dtype, midpoint_sign: Optional[Callable[[], int]] = None) -> float:
    """RN (ties to even) of the double ``d`` into ``dtype``, returned as a Python float.

    ``d`` stands for an exact value ``c`` with ``d == RN64(c)``. If ``d`` is
    exactly a midpoint of ``dtype``, ``midpoint_sign()`` must return the sign of
    ``c - d`` (-1, 0, +1) and decides the direction; without it ``c == d`` is
    assumed. Overflow gives +-inf, underflow keeps subnormals and the sign.
    """
    precision, min_normal_exp, max_exp = _FORMATS[dtype]
    if d == 0.0 or math.isnan(d) or math.isinf(d):
        return d
    negative = d < 0.0
    x = -d if negative else d
    _, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1: the leading bit has weight 2**(e-1)
    q = max(e - precision, min_normal_exp - precision + 1)  # weight of the result's last bit
    scaled = math.ldexp(x, -q)  # exact: a power-of-two scaling that stays normal
    kept = math.floor(scaled)
    rest = scaled - kept  # exact: scaled < 2**(precision+1) has no bits below 2**-53 * scaled
    if rest > 0.5:
        kept += 1
    elif rest == 0.5:
        s = midpoint_sign() if midpoint_sign is not None else 0
        if negative:
            s = -s  # c - d > 0 moves the magnitude down for a negative d
        if s > 0 or (s == 0 and kept % 2 == 1):
            kept += 1
    if q > max_exp + 1 or kept >= 2 ** (max_exp + 1 - q):  # kept * 2**q >= 2**(max_exp+1)
        return -math.inf if negative else math.inf
    r = math.ldexp(kept, q)
    return -r if negative else r


def _reference_from_terms(terms: List[float], dtype: torch.dtype) -> float:
    """Correctly rounded ``sum(terms)`` in ``dtype`` (terms are exact doubles)."""
    if not all(math.isfinite(t) for t in terms):
        if any(math.isnan(t) for t in terms):
            return math.nan
        pos = any(t == math.inf for t in terms)
        neg = any(t == -math.inf for t in terms)
        return math.nan if (pos and neg) else (math.inf if pos else -math.inf)
    d = math.fsum(terms)
    if d == 0.0:
        # An exact zero: -0 iff there is a term and every term is -0 (IEEE's
        # rule for x + y applied to the whole sum; docs/contract.md).
        all_neg_zero = bool(terms) and all(t == 0.0 and math.copysign(1.0, t) < 0 for t in terms)
        return -0.0 if all_neg_zero else 0.0

    def midpoint_sign() -> int:
        r = math.fsum(terms + [-d])
        return (r > 0) - (r < 0)

    return round_double_to(d, dtype, midpoint_sign)


def sample_indices(m: int, n: int, count: int, seed: int = 0) -> List[Tuple[int, int]]:
    """``count`` distinct (row, column) positions of an m x n output (all of them if fewer)."""
    total = m * n
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(total, generator=g)[: min(count, total)].tolist()
    return [(f // n, f % n) for f in flat]


def correctly_rounded_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    indices: Sequence[Tuple[int, int]],
    *,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> List[float]:
    """RN_out(bias[i, j] + sum_k a[i, k] * b[k, j]) for each (i, j) in ``indices``.

    ``a`` (M, K) and ``b`` (K, N) may be on any device; only the sampled rows
    and columns are copied to the CPU. ``bias`` broadcasts to (M, N). The
    output dtype defaults to the promoted input dtype, as in carbon.mm.
    """
    out_dtype = out_dtype or torch.promote_types(a.dtype, b.dtype)
    if not indices:
        return []
    rows = torch.tensor([i for i, _ in indices], device=a.device)
    cols = torch.tensor([j for _, j in indices], device=b.device)
    a_rows = a.index_select(0, rows).cpu().double()          # (S, K)
    b_cols = b.index_select(1, cols).t().cpu().double()      # (S, K)
    products = (a_rows * b_cols).tolist()  # exact: at most 2 x 24 significant bits, no underflow
    if bias is not None:
        full = bias.expand(a.shape[0], b.shape[1])
        extra = full[rows.to(full.device), cols.to(full.device)].cpu().double().tolist()
        for p, x in zip(products, extra):
            p.append(x)
    return [_reference_from_terms(p, out_dtype) for p in products]


def _same_value(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def count_correctly_rounded(
    out: torch.Tensor, indices: Sequence[Tuple[int, int]], reference: Sequence[float]
) -> int:
    """How many of the sampled entries of the 2-D ``out`` equal ``reference`` (sign of zero included)."""
    if not indices:
        return 0
    rows = torch.tensor([i for i, _ in indices], device=out.device)
    cols = torch.tensor([j for _, j in indices], device=out.device)
    got = out[rows, cols].cpu().double().tolist()  # exact for every supported dtype
    return sum(_same_value(g, r) for g, r in zip(got, reference))
