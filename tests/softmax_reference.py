"""An exact reference for carbon.softmax / log_softmax / cross_entropy and
their gradients, written from docs/contract.md §8 alone.

The only primitives taken on trust are carbon's float32 EXP and LOG
(`exp32`, `log32`: torch.ops.carbon.exp / log when the elementwise library
is built, otherwise the stand-in the kernels use today: the C library's
exp / log in double, rounded once to float32). Everything else is
independent of carbon's kernels:

  * exact sums with integers (tests/oracle.py), one rounding;
  * RN32 of a float32 difference with numpy float32 arithmetic (IEEE);
  * fp64 steps ((-), (*), (+), (/)) with Python floats;
  * every final rounding (RN_out of a double or of an exact quotient) with
    the oracle's integer rounding, never with a torch cast.

For a row x_1..x_n (contract §8):
  m = max x_j;  d_j = RN32(x_j - m);  e_j = EXP(d_j);  S = RN32(exact sum e_j)
  softmax_j     = RN_out(e_j / S)           (exact quotient, one rounding)
  log_softmax_j = RN_out(d_j (-) LOG(S))
A row with a NaN or a +inf is all NaN; a row of -inf only gives softmax +0
and log_softmax -inf.

Results are returned as tensors of BITS (int32 / int16), like the oracle's.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Optional, Sequence

import numpy as np
import torch

from oracle import (
    SCALE, _round_rational, _signed, bits_to_float, exact_sum_bits, fmt_of, round_bits,
    row_mean_bits, row_quotient_bits, row_sum, row_sum_bits,
)

F32 = torch.float32


# ---------------------------------------------------------------- the primitives: carbon's float32 EXP and LOG


def _carbon_op(name: str):
    """torch.ops.carbon.<name> when it exists and works on float32, else None."""
    try:
        if not hasattr(torch.ops.carbon, name):
            return None
        op = getattr(torch.ops.carbon, name)
        out = op(torch.zeros(1, dtype=torch.float32))
        return op if out.dtype == torch.float32 else None
    except Exception:  # noqa: BLE001 (not built / not usable: the stand-in)
        return None


_EXP_OP = _carbon_op("exp")
_LOG_OP = _carbon_op("log")
PRIMITIVES = "torch.ops.carbon.exp/log" if _EXP_OP is not None else "libm exp/log in double, rounded to float32"


def _libm_exp(v: float) -> float:
    if v != v:
        return math.nan
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _libm_log(v: float) -> float:
    if v != v or v < 0:
        return math.nan
    if v == 0:
        return -math.inf
    return math.log(v)


def _apply(op, fallback, values) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32)
    if op is not None:
        return op(torch.from_numpy(values.copy())).numpy()
    flat = [np.float32(fallback(float(v))) for v in values.reshape(-1)]  # one rounding of the double
    return np.array(flat, dtype=np.float32).reshape(values.shape)


def exp32(values) -> np.ndarray:
    """carbon's float32 exp of each float32 value."""
    return _apply(_EXP_OP, _libm_exp, values)


def log32(values) -> np.ndarray:
    """carbon's float32 log of each float32 value."""
    return _apply(_LOG_OP, _libm_log, values)


# ---------------------------------------------------------------- rows


def rows_of(x: torch.Tensor, dim: int):
    """x's values as float64 rows along `dim` (exact), and the moved shape."""
    if x.dim() == 0:
        return x.detach().double().reshape(1, 1).numpy(), ()
    dim = dim % x.dim()
    moved = x.detach().cpu().double().movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]).numpy(), tuple(moved.shape)


def back_to_shape(flat_bits: List[List[int]], x: torch.Tensor, dim: int, dtype: torch.dtype, moved_shape) -> torch.Tensor:
    f = fmt_of(dtype)
    t = torch.tensor([[_signed(b, f) for b in r] for r in flat_bits], dtype=f.bits_dtype)
    if x.dim() == 0:
        return t.reshape(())
    dim = dim % x.dim()
    return t.reshape(moved_shape).movedim(-1, dim).contiguous()


def _row_case(row: np.ndarray) -> str:
    if row.size and (np.isnan(row).any() or (row == math.inf).any()):
        return "nan"
    if row.size and (row == -math.inf).all():
        return "masked"
    return "normal"


class RowInfo:
    """The intermediate values of one row (for tests that look inside)."""

    def __init__(self, row: Sequence[float]):
        x = np.asarray(row, dtype=np.float64).astype(np.float32)  # exact: the values are float32 values
        self.case = _row_case(x)
        self.m = self.d = self.e = self.S = self.L = None
        if self.case != "normal":
            return
        self.m = np.float32(x.max())
        with np.errstate(over="ignore", invalid="ignore"):
            self.d = (x - self.m).astype(np.float32)  # RN32 of each difference (IEEE float32)
        self.e = exp32(self.d)
        self.S = bits_to_float(row_sum_bits([float(v) for v in self.e], F32), F32)  # RN32(exact sum)
        self.exact_sum = Fraction(row_sum([float(v) for v in self.e]).total, 1 << SCALE)
        self.L = float(log32(np.array([self.S], dtype=np.float32))[0])


def softmax_row_bits(row: Sequence[float], dtype: torch.dtype, log: bool) -> List[int]:
    f = fmt_of(dtype)
    info = RowInfo(row)
    n = len(row)
    if info.case == "nan":
        return [f.nan_bits] * n
    if info.case == "masked":
        return [(f.sign_bit | f.inf_bits) if log else 0] * n
    out, cache = [], {}
    if log:
        for dj in info.d:
            key = float(dj)
            if key not in cache:
                cache[key] = round_bits(key - info.L, dtype)  # fp64 subtraction, then one rounding
            out.append(cache[key])
        return out
    sn, sd = Fraction(info.S).as_integer_ratio()
    for ej in info.e:
        key = float(ej)
        if key not in cache:
            en, ed = Fraction(key).as_integer_ratio()
            cache[key] = _round_rational(en * sd, ed * sn, False, f)  # RN_out(e_j / S), exact quotient
        out.append(cache[key])
    return out


def _forward_bits(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
    out_dtype = x.dtype if dtype is None else dtype
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=fmt_of(out_dtype).bits_dtype)
    rows, moved = rows_of(x, dim)
    bits = [softmax_row_bits(r, out_dtype, log) for r in rows]
    return back_to_shape(bits, x, dim, out_dtype, moved)


def softmax_bits(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of carbon.softmax(x, dim, dtype=dtype)."""
    return _forward_bits(x, dim, dtype, False)


def log_softmax_bits(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of carbon.log_softmax(x, dim, dtype=dtype)."""
    return _forward_bits(x, dim, dtype, True)


# ---------------------------------------------------------------- gradients of softmax / log_softmax


def softmax_backward_row_bits(g: Sequence[float], y: Sequence[float], dtype: torch.dtype) -> List[int]:
    """dx_j = RN_out(y_j (*) (g_j (-) D)), D = RN32(exact sum g_k y_k)."""
    D = bits_to_float(exact_sum_bits([(gk, yk) for gk, yk in zip(g, y)], F32), F32)
    return [round_bits(yj * (gj - D), dtype) for gj, yj in zip(g, y)]


def log_softmax_backward_row_bits(g: Sequence[float], y: Sequence[float], dtype: torch.dtype) -> List[int]:
    """dx_j = RN_out(g_j (-) (p_j (*) G)), G = RN32(exact sum g_k), p_j = EXP(y_j)."""
    G = bits_to_float(row_sum_bits(list(g), F32), F32)
    p = exp32(np.asarray(y, dtype=np.float64).astype(np.float32))
    return [round_bits(gj - float(pj) * G, dtype) for gj, pj in zip(g, p)]


def _backward_bits(grad: torch.Tensor, y: torch.Tensor, dim: int, x_dtype: torch.dtype, log: bool) -> torch.Tensor:
    assert grad.shape == y.shape and grad.dtype == y.dtype
    if y.numel() == 0:
        return torch.empty(y.shape, dtype=fmt_of(x_dtype).bits_dtype)
    g_rows, moved = rows_of(grad, dim)
    y_rows, _ = rows_of(y, dim)
    fn = log_softmax_backward_row_bits if log else softmax_backward_row_bits
    bits = [fn([float(v) for v in gr], [float(v) for v in yr], x_dtype) for gr, yr in zip(g_rows, y_rows)]
    return back_to_shape(bits, y, dim, x_dtype, moved)


def softmax_backward_bits(grad: torch.Tensor, y: torch.Tensor, dim: int, x_dtype: torch.dtype) -> torch.Tensor:
    """Expected bits of carbon.softmax_backward(grad, y, dim, x_dtype)."""
    return _backward_bits(grad, y, dim, x_dtype, False)


def log_softmax_backward_bits(grad: torch.Tensor, y: torch.Tensor, dim: int, x_dtype: torch.dtype) -> torch.Tensor:
    """Expected bits of carbon.log_softmax_backward(grad, y, dim, x_dtype)."""
    return _backward_bits(grad, y, dim, x_dtype, True)


# ---------------------------------------------------------------- cross-entropy


def _as_rows(input: torch.Tensor, target: torch.Tensor):
    """[N, C] float64 rows and the flat targets of F.cross_entropy's layouts."""
    if input.dim() == 1:
        return input.detach().double().reshape(1, -1).numpy(), target.reshape(-1).tolist()
    rows = input.detach().double()
    if input.dim() > 2:
        rows = rows.movedim(1, -1).reshape(-1, input.shape[1])
    return rows.numpy(), target.reshape(-1).tolist()


def _log_probs(rows: np.ndarray) -> List[List[float]]:
    return [[bits_to_float(b, F32) for b in softmax_row_bits(r, F32, True)] for r in rows]


def row_losses(input: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
               label_smoothing: float = 0.0) -> List[float]:
    """Each row's float32 loss (ignored rows +0)."""
    rows, targets = _as_rows(input, target)
    eps = float(label_smoothing)
    C = rows.shape[1]
    losses = []
    for lsm, t in zip(_log_probs(rows), targets):
        if t == ignore_index:
            losses.append(0.0)
            continue
        assert 0 <= t < C, f"reference: target {t} out of range"
        nll = 0.0 - lsm[t]  # contract: 0 (-) lsm, so +0 (not -0) when lsm = +0
        if eps == 0:
            losses.append(nll)
            continue
        sm = -bits_to_float(row_mean_bits(lsm, F32), F32)  # -RN32(exact sum / C)
        losses.append(bits_to_float(round_bits((1.0 - eps) * nll + eps * sm, F32), F32))
    return losses




def cross_entropy_bits(input: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                       ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """Expected bits of carbon.cross_entropy(...) (output dtype = input dtype)."""
    dtype = input.dtype
    f = fmt_of(dtype)
    losses = row_losses(input, target, ignore_index, label_smoothing)
    if reduction == "none":
        shape = () if input.dim() == 1 else tuple(target.shape)
        return torch.tensor([_signed(round_bits(v, dtype), f) for v in losses], dtype=f.bits_dtype).reshape(shape)
    if reduction == "sum":
        return torch.tensor(_signed(row_sum_bits(losses, dtype), f), dtype=f.bits_dtype)
    count = sum(1 for t in target.reshape(-1).tolist() if t != ignore_index)
    return torch.tensor(_signed(row_quotient_bits(losses, count, dtype), f), dtype=f.bits_dtype)


def cross_entropy_grad_bits(input: torch.Tensor, target: torch.Tensor, grad: torch.Tensor, reduction: str = "mean",
                            ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """Expected bits of input.grad after carbon.cross_entropy(...).backward(grad)."""
    dtype = input.dtype
    f = fmt_of(dtype)
    rows, targets = _as_rows(input, target)
    N, C = rows.shape
    eps = float(label_smoothing)
    g = [float(v) for v in grad.detach().double().reshape(-1).tolist()]
    count = sum(1 for t in targets if t != ignore_index)
    if reduction == "none":
        coef = g
    elif reduction == "sum" or count == 0:
        coef = [g[0]] * N
    else:
        v = g[0]
        c = round_bits(Fraction(v) / count, F32) if (math.isfinite(v) and v != 0) else round_bits(v, F32)
        coef = [bits_to_float(c, F32)] * N
    out = []
    for i, (lsm, t) in enumerate(zip(_log_probs(rows), targets)):
        if t == ignore_index:
            out.append([0] * C)
            continue
        p = exp32(np.asarray(lsm, dtype=np.float64).astype(np.float32))
        base = eps / C
        out.append([round_bits(coef[i] * (float(p[j]) - (((1.0 - eps) if j == t else 0.0) + base)), dtype)
                    for j in range(C)])
    bits = torch.tensor([[_signed(b, f) for b in r] for r in out], dtype=f.bits_dtype)
    if input.dim() == 1:
        return bits.reshape(C)
    if input.dim() == 2:
        return bits
    moved = (input.shape[0],) + tuple(input.shape[2:]) + (C,)
    return bits.reshape(moved).movedim(-1, 1).contiguous()
