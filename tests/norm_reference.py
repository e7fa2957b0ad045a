"""An independent reference for carbon.layer_norm / carbon.rms_norm, written
from docs/contract.md §7 alone (it never imports carbon).

* Exact statistics with Python integers: every value of float32 / bfloat16 /
  float16 times 2^SCALE is an integer (tests/oracle.py), so sums, squares and
  products are exact, and the one rounding of a quotient is done by the
  oracle's integer rounding (ties to even, subnormals, overflow).
* sqrt: an integer square root with a sticky bit, rounded once.
* The float64 steps ((x - mean) * rstd, xhat * w + b, the backward's dx) with
  numpy float64 (IEEE binary64); RN32 of a double with numpy's float32 cast
  (round to nearest even); RN to bfloat16 / float16 of a double with the
  oracle's exact rounding (one rounding, never through float32).

Results are tensors of bits (int32 / int16) with the canonical NaN, to be
compared with oracle.assert_bits_equal.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Optional, Sequence

import numpy as np
import torch

from oracle import SCALE, _round_rational, _scaled, _signed, bits_to_float, exact_sum_bits, fmt_of, round_bits, row_mean_bits, sqrt_bits

F32 = torch.float32
NAN = math.nan


# ---------------------------------------------------------------- rounding


def rn(value, dtype) -> float:
    """RN_dtype of an exact value (int, Fraction or Python float), as a float."""
    return bits_to_float(round_bits(value, dtype), dtype)


def rn32_array(v: np.ndarray) -> np.ndarray:
    """RN32 of float64 values (numpy's cast: round to nearest, ties to even)."""
    with np.errstate(all="ignore"):
        return v.astype(np.float32).astype(np.float64)


def bits_of(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Bits (int32 / int16 tensor) of RN_dtype of float64 values, canonical NaN."""
    f = fmt_of(dtype)
    flat = values.reshape(-1)
    if dtype == F32:
        with np.errstate(all="ignore"):
            b = flat.astype(np.float32).view(np.int32).astype(np.int64)
        b[np.isnan(flat)] = _signed(f.nan_bits, f)
        out = b.tolist()
    else:
        cache = {}
        out = []
        for v in flat.tolist():
            key = v if v == v else "nan"
            if isinstance(key, float) and key == 0:
                key = ("z", math.copysign(1.0, v))
            if key not in cache:
                cache[key] = _signed(round_bits(v, dtype), f)
            out.append(cache[key])
    return torch.tensor(out, dtype=f.bits_dtype).reshape(values.shape)


def sqrt_rn32(w: float) -> float:
    """RN32(sqrt(w)) for a float32 value w >= 0 (or inf / NaN), exactly."""
    if math.isnan(w) or w == math.inf or w == 0:
        return w
    return bits_to_float(sqrt_bits(w, F32), F32)


def rstd_of(var: float, eps: float) -> float:
    """r = RN32(1 / RN32(sqrt(RN32(var + RN32(eps))))), each step exact then rounded."""
    eps32 = rn(eps, F32)
    if math.isnan(var):
        return NAN
    w = rn(Fraction(var) + Fraction(eps32), F32) if math.isfinite(var) else var
    s = sqrt_rn32(w)
    if s == 0:
        return math.inf
    if math.isinf(s):
        return 0.0
    return rn(1 / Fraction(s), F32)


# ---------------------------------------------------------------- exact statistics


def _mean_bits(values: List[float]) -> float:
    return bits_to_float(row_mean_bits(values, F32), F32)


def mean_of_products(a: Sequence[float], b: Sequence[float]) -> float:
    """RN32(sum a_k * b_k / n), exact products, the contract's special rules."""
    n = len(a)
    if all(math.isfinite(u) and math.isfinite(v) for u, v in zip(a, b)):
        total = sum(_scaled(u) * _scaled(v) for u, v in zip(a, b))
        if total != 0:
            return bits_to_float(_round_rational(abs(total), n << (2 * SCALE), total < 0, fmt_of(F32)), F32)
    # special values or an exact zero: the sum's rules (inf / n = inf, zero signs)
    return bits_to_float(exact_sum_bits(list(zip(a, b)), F32), F32)


def variance(row: List[float], mu: float) -> float:
    """RN32(sum (x - mu)^2 / n) with the real squares; NaN when mu is not finite."""
    if not math.isfinite(mu):
        return NAN
    m = _scaled(mu)
    total = sum((_scaled(x) - m) ** 2 for x in row)
    if total == 0:
        return 0.0
    return bits_to_float(_round_rational(total, len(row) << (2 * SCALE), False, fmt_of(F32)), F32)


def mean_square(row: List[float]) -> float:
    """RN32(sum x^2 / n) exact (NaN if a NaN, +inf if an inf)."""
    if any(math.isnan(x) for x in row):
        return NAN
    if any(math.isinf(x) for x in row):
        return math.inf
    total = sum(_scaled(x) ** 2 for x in row)
    if total == 0:
        return 0.0
    return bits_to_float(_round_rational(total, len(row) << (2 * SCALE), False, fmt_of(F32)), F32)


# ---------------------------------------------------------------- helpers


def _rows(x: torch.Tensor, normalized_shape: Sequence[int]) -> np.ndarray:
    n = math.prod(normalized_shape)
    return x.detach().cpu().double().reshape(-1, n).numpy()


def _param(p: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    return None if p is None else p.detach().cpu().double().reshape(-1).numpy()


def _lead(x: torch.Tensor, normalized_shape: Sequence[int]) -> tuple:
    return tuple(x.shape[: x.dim() - len(normalized_shape)])


def _stats(x: torch.Tensor, normalized_shape, eps: float, rms: bool):
    rows = _rows(x, normalized_shape)
    mus, rs = [], []
    for row in rows:
        vals = row.tolist()
        if rms:
            mu, var = 0.0, mean_square(vals)
        else:
            mu = _mean_bits(vals)
            var = variance(vals, mu)
        mus.append(mu)
        rs.append(rstd_of(var, eps))
    return rows, np.array(mus, dtype=np.float64), np.array(rs, dtype=np.float64)


def _xhat(rows: np.ndarray, mus: np.ndarray, rs: np.ndarray, rms: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        centered = rows if rms else rows - mus[:, None]
        return rn32_array(centered * rs[:, None])


RMS_DEFAULT_EPS = 2.0**-23  # torch's default for rms_norm: float32's machine epsilon


# ---------------------------------------------------------------- forward


def layer_norm_ref(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(y bits, mean bits, rstd bits); mean / rstd of shape x.shape[:-k]."""
    rows, mus, rs = _stats(x, normalized_shape, eps, rms=False)
    xh = _xhat(rows, mus, rs, rms=False)
    w, b = _param(weight), _param(bias)
    with np.errstate(all="ignore"):
        y = xh * w[None, :] if w is not None else xh
        if b is not None:
            y = y + b[None, :]
    lead = _lead(x, normalized_shape)
    return (bits_of(y, x.dtype).reshape(x.shape), bits_of(mus, F32).reshape(lead), bits_of(rs, F32).reshape(lead))


def rms_norm_ref(x, normalized_shape, weight=None, eps=None):
    """(y bits, rstd bits)."""
    rows, mus, rs = _stats(x, normalized_shape, RMS_DEFAULT_EPS if eps is None else eps, rms=True)
    xh = _xhat(rows, mus, rs, rms=True)
    w = _param(weight)
    with np.errstate(all="ignore"):
        y = xh * w[None, :] if w is not None else xh
    return bits_of(y, x.dtype).reshape(x.shape), bits_of(rs, F32).reshape(_lead(x, normalized_shape))


# ---------------------------------------------------------------- backward


def _backward(dy, x, normalized_shape, weight, eps, rms: bool, with_bias: bool):
    rows, mus, rs = _stats(x, normalized_shape, eps, rms)
    xh = _xhat(rows, mus, rs, rms)
    d = _rows(dy, normalized_shape)
    w = _param(weight)
    with np.errstate(all="ignore"):
        g = rn32_array(d * w[None, :]) if w is not None else d
    dx = np.empty_like(rows)
    for i in range(rows.shape[0]):
        gi, xi = g[i].tolist(), xh[i].tolist()
        B = mean_of_products(gi, xi)
        with np.errstate(all="ignore"):
            if rms:
                dx[i] = rs[i] * (g[i] - xh[i] * B)
            else:
                A = _mean_bits(gi)
                dx[i] = rs[i] * ((g[i] - A) - xh[i] * B)
    dx_bits = bits_of(dx, x.dtype).reshape(x.shape)
    dw_bits = db_bits = None
    if weight is not None:
        f = fmt_of(weight.dtype)
        cols = [exact_sum_bits(list(zip(d[:, j].tolist(), xh[:, j].tolist())), weight.dtype) for j in range(d.shape[1])]
        dw_bits = torch.tensor([_signed(c, f) for c in cols], dtype=f.bits_dtype).reshape(weight.shape)
    if with_bias:
        f = fmt_of(x.dtype)
        cols = [exact_sum_bits([(v,) for v in d[:, j].tolist()], x.dtype) for j in range(d.shape[1])]
        db_bits = torch.tensor([_signed(c, f) for c in cols], dtype=f.bits_dtype).reshape(normalized_shape)
    return dx_bits, dw_bits, db_bits


def layer_norm_backward_ref(dy, x, normalized_shape, weight=None, with_bias=False, eps=1e-5):
    """(dx bits, dweight bits or None, dbias bits or None)."""
    return _backward(dy, x, normalized_shape, weight, eps, rms=False, with_bias=with_bias)


def rms_norm_backward_ref(dy, x, normalized_shape, weight=None, eps=None):
    """(dx bits, dweight bits or None)."""
    dx, dw, _ = _backward(dy, x, normalized_shape, weight, RMS_DEFAULT_EPS if eps is None else eps, rms=True,
                          with_bias=False)
    return dx, dw
