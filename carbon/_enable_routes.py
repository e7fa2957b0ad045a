"""The aten ops carbon.enable() reroutes, and how (docs/enable.md).

Each entry of :data:`ROUTES` maps an aten op name (the overload packet's
name, in-place ``_`` stripped) to a handler ``handler(args: dict) -> result``
that computes the *out-of-place* result from the op's bound arguments;
:mod:`carbon._enable` copies it into ``self`` for in-place variants and into
``out`` for out variants.

Handlers run inside the dispatch mode's ``__torch_dispatch__``, where the
mode is off: the aten and carbon ops they call run as they are. Everything a
handler does is either a carbon op (correctly rounded, the same bits on every
device) or a fixed sequence of single IEEE basic operations (+, -, *, /, sqrt,
comparisons, copies), each of which torch computes as one correctly rounded
operation on the CPU and on CUDA. That is why, for example, ``add`` with
``alpha != 1`` becomes ``x + (alpha * y)`` here: torch fuses it into an fma on
CUDA and on AVX2 CPUs, but not in the CPU's scalar tail.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor
from torch import _prims_common

import carbon.random
from carbon import _enable_allow
from carbon._autograd import _norm_backward
from carbon._conv import _columns as conv_columns
from carbon._conv import (conv_backward, conv_forward, conv_transpose_backward, conv_transpose_forward,
                          conv_transpose_size)

__all__ = ["COMPLEX_ROUTES", "FOREIGN_ROUTES", "ROUTES", "PASS", "NotCovered", "WithArguments"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

_CARBON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

PASS = object()
"""A handler's answer for arguments the op is already exact for (integer
tensors, say): run torch's own op."""


class WithArguments:
    """A handler's answer that runs torch's own op (the same overload: in place, out= and all) with some
    arguments replaced, e.g. scatter with deduplicated values; nothing is copied back afterwards."""

    def __init__(self, **updates: Any) -> None:
        self.updates = updates


class NotCovered(Exception):
    """A routed op was called with arguments carbon has no exact version of
    (e.g. float64, an unsupported reduction); the message says which."""


def _draw() -> Tensor:
    """The state tensor [seed, offset] of the next draw of
    carbon.default_generator, the generator every routed random op uses
    (carbon.enable seeds it); for the ops' .state overloads."""
    return carbon.random.default_generator.next_state()


def _floating(t: Any) -> bool:
    return isinstance(t, Tensor) and t.is_floating_point()


def _need_carbon_dtype(op: str, *tensors: Optional[Tensor]) -> None:
    for t in tensors:
        if t is not None and t.is_floating_point() and t.dtype not in _CARBON_DTYPES:
            raise NotCovered(f"{op} in {t.dtype}: carbon computes float32, bfloat16 and float16 exactly, not {t.dtype}")


def _opmath(t: Any) -> torch.dtype:
    """torch's compute type for a tensor or dtype: float32 for bfloat16 / float16."""
    dtype = t.dtype if isinstance(t, Tensor) else t
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def sqrt_rn(x: Tensor) -> Tensor:
    """The correctly rounded square root in x's dtype (float32, bfloat16, float16 or float64), on every device:
    carbon.sqrt, IEEE's binary64 square root rounded once to the dtype. torch's own is not that on the CPU (on
    this AVX-512 build about 17% of float32 results and some float64 ones are one ulp off; CUDA's is exact)."""
    if x.dtype not in _CARBON_DTYPES and x.dtype != torch.float64:
        raise NotCovered(f"sqrt in {x.dtype}: carbon rounds float32, bfloat16, float16 and float64 square roots")
    return carbon_ops.sqrt(x)


# ---- index tensors that depend only on shapes -------------------------------------------------------------------

_SHAPE_CONSTANTS: "OrderedDict[tuple, Tensor]" = OrderedDict()
_SHAPE_CONSTANTS_MAX = 512


def _shape_constant(key: tuple, device: torch.device, build: Callable[[], Tensor]) -> Tensor:
    """A tensor computed on the host from shapes and arguments alone (pooling windows, interpolation weights,
    fold positions), kept per (key, device): the first call builds it and copies it to the device; later
    calls with the same shapes reuse the device copy, so they neither copy from the host (which would make
    the host wait, and which a CUDA graph cannot capture: warm up once before capturing, as CUDA graphs
    require anyway) nor redo the host's loops. The tensors are only read. Least recently used entries beyond
    512 are dropped."""
    full = (key, str(torch.device(device)))
    hit = _SHAPE_CONSTANTS.get(full)
    if hit is not None:
        _SHAPE_CONSTANTS.move_to_end(full)
        return hit
    value = build().to(device)
    _SHAPE_CONSTANTS[full] = value
    if len(_SHAPE_CONSTANTS) > _SHAPE_CONSTANTS_MAX:
        _SHAPE_CONSTANTS.popitem(last=False)
    return value


# ---- exact compositions of single IEEE operations ----------------------------------------------------------------

def _scalar_like(x: Tensor, value: Any) -> Tensor:
    """``value`` as a 0-dim tensor on x's device in x's compute dtype. Dividing
    by it runs torch's tensor-by-tensor kernel: on CUDA, a Python or CPU scalar
    divisor is replaced by a multiplication with its reciprocal, which is not
    the correctly rounded quotient."""
    if isinstance(value, Tensor):
        return value.to(device=x.device, dtype=_opmath(x))
    return torch.full((), value, dtype=_opmath(x), device=x.device)


def true_divide(x: Any, y: Any) -> Tensor:
    """RN(x / y) in the compute precision of the result (float32 for
    bfloat16/float16, rounded once more to their dtype, as torch computes
    them): the same on every device. Integer operands are converted to the
    result's dtype first (exact below 2^24 in float32), as torch does."""
    out_dtype = torch.result_type(x, y)
    if not out_dtype.is_floating_point:  # true division of integers: torch's default float dtype
        out_dtype = torch.get_default_dtype()
    if not isinstance(x, Tensor):
        x = torch.full((), x, dtype=out_dtype, device=y.device)
    if not x.is_floating_point():
        x = x.to(out_dtype)
    scalar_divisor = not isinstance(y, Tensor) or (y.dim() == 0 and (y.device != x.device or y.device.type == "cpu"))
    if not scalar_divisor:
        if not y.is_floating_point():
            y = y.to(out_dtype)
        return aten.div.Tensor(x, y)
    xs = x.to(_opmath(x)) if x.dtype != _opmath(x) else x
    q = aten.div.Tensor(xs, _scalar_like(xs, y))
    return q if q.dtype == out_dtype else q.to(out_dtype)


def _any_float(*values: Any) -> bool:
    return any(isinstance(v, float) or _floating(v) for v in values)


def _scaled(y: Any, alpha: Any) -> Any:
    if alpha == 1:
        return y
    return y * alpha if not isinstance(y, Tensor) else aten.mul(y, alpha)


_HALF = (torch.bfloat16, torch.float16)


def _in_opmath(fn: Callable, *operands: Any) -> Any:
    """fn's composition of single operations in torch's compute precision: when the result is bfloat16 or
    float16, the operands are widened to float32, every operation rounds to float32, and the result is rounded
    once to its dtype at the end (torch's own kernels also compute these in float32; rounding each step to
    16 bits would lose accuracy). float32 results: fn as it is."""
    dtype = _prims_common.elementwise_dtypes(
        *operands, type_promotion_kind=_prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]  # torch's rule
    if dtype not in _HALF:
        return fn(*operands)
    wide = [v.to(torch.float32) if isinstance(v, Tensor) and v.dtype in _HALF else v for v in operands]
    return fn(*wide).to(dtype)


def _add(a: dict) -> Any:
    x, y, alpha = a["self"], a["other"], a.get("alpha", 1)
    if not _any_float(x, y):
        return PASS  # integer arithmetic is exact
    if alpha == 1:
        return aten.add(x, y)
    return _in_opmath(lambda p, q: aten.add(p, _scaled(q, alpha)), x, y)


def _sub(a: dict) -> Any:
    x, y, alpha = a["self"], a["other"], a.get("alpha", 1)
    if not _any_float(x, y):
        return PASS
    if alpha == 1:
        return aten.sub(x, y)
    return _in_opmath(lambda p, q: aten.sub(p, _scaled(q, alpha)), x, y)


def _rsub(a: dict) -> Any:
    x, y, alpha = a["self"], a["other"], a.get("alpha", 1)
    if not _any_float(x, y):
        return PASS
    if alpha == 1:
        return aten.sub(y, x)
    return _in_opmath(lambda p, q: aten.sub(q, _scaled(p, alpha)), x, y)


def _div(a: dict) -> Tensor:
    mode = a.get("rounding_mode")
    if mode is not None:
        return _rounded_divide(a["self"], a["other"], mode)
    return true_divide(a["self"], a["other"])


def _rounded_divide(x: Any, y: Any, mode: str) -> Tensor:
    """div with rounding_mode 'trunc' / 'floor': the divisor of floating operands as a 0-dim tensor on x's
    device in the compute dtype (as true_divide), so that torch runs its tensor-by-tensor kernel everywhere.
    With a Python or CPU scalar divisor, CUDA computes trunc(x·RN(1/y)) ('trunc') and (x − fmod(x, y))·RN(1/y)
    ('floor') instead of the quotient, so e.g. trunc(x / y) could be one lower than on the CPU."""
    if not isinstance(x, Tensor) or not _any_float(x, y):
        return aten.div(x, y, rounding_mode=mode)
    if isinstance(y, Tensor) and not (y.dim() == 0 and (y.device != x.device or y.device.type == "cpu")):
        return aten.div(x, y, rounding_mode=mode)
    out_dtype = torch.result_type(x, y)
    xs = x.to(_opmath(out_dtype))
    q = aten.div(xs, _scalar_like(xs, y), rounding_mode=mode)
    return q if q.dtype == out_dtype else q.to(out_dtype)


def _floor_divide(a: dict) -> Tensor:
    """x // y: torch's floor_divide is div(rounding_mode='floor') (CTRL's sinusoidal table, i // 2)."""
    return _rounded_divide(a["self"], a["other"], "floor")


def _addcmul(a: dict) -> Tensor:
    # self + value * (t1 * t2), three roundings in this order (float32 ones for 16-bit results: _in_opmath)
    value = a.get("value", 1)
    return _in_opmath(lambda x, p, q: aten.add(x, _scaled(aten.mul(p, q), value)),
                      a["self"], a["tensor1"], a["tensor2"])


def _addcdiv(a: dict) -> Tensor:
    value = a.get("value", 1)
    return _in_opmath(lambda x, p, q: aten.add(x, _scaled(true_divide(p, q), value)),
                      a["self"], a["tensor1"], a["tensor2"])


def _lerp_steps(start: Tensor, end: Tensor, w: Any) -> Tensor:
    # torch's two-sided formula, each step one rounding:
    # w < 0.5: start + w * (end - start); else end - (end - start) * (1 - w)
    diff = aten.sub(end, start)
    if isinstance(w, Tensor):
        low = aten.add(start, aten.mul(w, diff))
        high = aten.sub(end, aten.mul(diff, aten.rsub(w, 1)))
        return torch.where(aten.lt(aten.abs(w), 0.5), low, high)
    w = float(w)
    if abs(w) < 0.5:
        return aten.add(start, aten.mul(diff, w))
    return aten.sub(end, aten.mul(diff, 1.0 - w))


def _lerp(a: dict) -> Tensor:
    start, end, w = a["self"], a["end"], a["weight"]
    if isinstance(w, Tensor):
        return _in_opmath(_lerp_steps, start, end, w)
    return _in_opmath(lambda s0, e0: _lerp_steps(s0, e0, w), start, end)


def _pow(a: dict) -> Any:
    """Integer exponents as products in a fixed order (binary exponentiation
    from the lowest bit, each product rounded: carbon.optim.power's order);
    0.5 as sqrt; a negative exponent as 1 / x^|n|. Other number exponents,
    and a number base with a tensor exponent (e.g. rotary embeddings'
    base ** (arange / dim)), and two tensors: carbon's pow, RN(exp(p log x)) from binary64 cores."""
    x, e = a["self"], a["exponent"]
    if isinstance(x, Tensor) and not x.is_floating_point() and not _floating(e):
        return PASS
    if isinstance(e, Tensor) and not isinstance(x, Tensor):
        if not e.is_floating_point():
            raise NotCovered("pow of a number to an integer tensor exponent")
        _need_carbon_dtype_or_float64("pow", e)
        return carbon_ops.pow_scalar_tensor(float(x), e)
    if isinstance(e, Tensor) and isinstance(x, Tensor) and x.dim() == 0 and x.device.type == "cpu" and x.is_floating_point():
        # a 0-dim CPU base (BLOOM's ALiBi slopes, base ** arange): a number base, read without a device sync
        _need_carbon_dtype_or_float64("pow", x)
        exponent = e if e.is_floating_point() else aten._to_copy(e, dtype=x.dtype)
        return carbon_ops.pow_scalar_tensor(x.item(), exponent).to(torch.result_type(x, e))
    if isinstance(e, Tensor) and e.dim() == 0 and e.device.type == "cpu":
        return _pow({"self": x, "exponent": e.item()})  # a 0-dim CPU exponent: a number exponent
    if isinstance(e, Tensor):
        # two tensors (Weibull's and Kumaraswamy's samplers): carbon's pow of each pair, after torch's
        # broadcasting and promotion (integers to the default dtype), one rounding of pow_core
        u, v, _ = _promoted_pair(x, e)
        shape = list(torch.broadcast_shapes(u.shape, v.shape))
        u, v = u.expand(shape), v.expand(shape)
        _need_carbon_dtype("pow", u, v)
        return carbon_ops.pow_tensor_tensor(u, v)
    if not x.is_floating_point():  # an integer tensor to a float power: torch's result dtype, converted first
        x = aten._to_copy(x, dtype=torch.get_default_dtype())
    if e == 0.5:
        return sqrt_rn(x)
    if float(e).is_integer() and abs(e) <= 64:
        n = abs(int(e))
        result, base = None, x
        while n:
            if n & 1:
                result = base if result is None else aten.mul(result, base)
            n >>= 1
            if n:
                base = aten.mul(base, base)
        result = aten.ones_like(x) if result is None else aten.clone(result)
        return true_divide(aten.ones_like(x), result) if e < 0 else result
    _need_carbon_dtype_or_float64("pow", x)
    return carbon_ops.pow_tensor_scalar(x, float(e))


def _reduce_loss(loss: Tensor, reduction: int) -> Tensor:
    if reduction == 0:
        return loss
    return carbon_ops.sum(loss, None, False, None) if reduction == 2 else carbon_ops.mean(loss, None, False, None)


def _soft_margin_loss(a: dict) -> Tensor:
    """RN(SOFTPLUS(−RN(x·y))) (carbon's softplus: log(1 + e^z) without overflow), then mean / sum exact."""
    x, y = a["self"], a["target"]
    _need_carbon_dtype("soft_margin_loss", x, y)
    return _reduce_loss(carbon_ops.softplus(aten.neg(aten.mul(x, y))), a.get("reduction", 1))


def _soft_margin_loss_backward(a: dict) -> Tensor:
    """RN(RN(−y·SIGMOID(−RN(x·y)))·g'), g' = RN(g / numel) for mean, else g."""
    g, x, y, reduction = a["grad_output"], a["self"], a["target"], a["reduction"]
    if reduction == 1:
        g = true_divide(g, float(x.numel()))
    return aten.mul(aten.neg(aten.mul(y, carbon_ops.sigmoid(aten.neg(aten.mul(x, y))))), g)


def _linalg_cross(a: dict) -> Tensor:
    """The cross product, each component RN(RN(a·b) − RN(c·d)) (torch's CUDA kernel may fuse it into an fma)."""
    x, y, dim = a["self"], a["other"], a.get("dim", -1)
    _need_carbon_dtype("linalg_cross", x, y)
    shape = torch.broadcast_shapes(x.shape, y.shape)
    x, y = x.expand(shape), y.expand(shape)
    if shape[dim] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {shape[dim]}")
    xs, ys = [x.select(dim, k) for k in range(3)], [y.select(dim, k) for k in range(3)]
    parts = [aten.sub(aten.mul(xs[(k + 1) % 3], ys[(k + 2) % 3]), aten.mul(xs[(k + 2) % 3], ys[(k + 1) % 3]))
             for k in range(3)]
    return aten.stack(parts, dim)


def _sinc(a: dict) -> Tensor:
    """sin(πx)/(πx): t = RN(RN32(π)·x), RN(SIN(t) / t), 1 at x = 0 (torch's formula, with carbon's sin)."""
    x = a["self"]
    if not x.is_floating_point():  # torch computes integer and boolean inputs in the default dtype
        x = aten._to_copy(x, dtype=torch.get_default_dtype())
    _need_carbon_dtype("sinc", x)

    def steps(v: Tensor) -> Tensor:  # float32 steps for 16-bit x (_in_opmath), one rounding to x's dtype last
        t = aten.mul(v, float(torch.tensor(math.pi, dtype=torch.float32)))
        return aten.where(aten.eq(v, 0), 1.0, true_divide(carbon_ops.sin(t), t)).to(v.dtype)
    return _in_opmath(steps, x)


def _softshrink(a: dict) -> Tensor:
    """x − λ where x > λ, x + λ where x < −λ, +0 between, NaN kept (λ rounded to x's dtype first, each
    result one rounding in x's dtype, as torch's CUDA kernel; its CPU kernel returns −0 or +0 in the band
    depending on whether an element falls in the vector body or the scalar tail)."""
    x = a["self"]
    lam = torch.full((), float(a.get("lambd", 0.5)), dtype=x.dtype, device=x.device)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    inner = aten.where(aten.gt(x, lam), aten.sub(x, lam), aten.where(aten.lt(x, aten.neg(lam)), aten.add(x, lam), zero))
    return aten.where(aten.isnan(x), x, inner)


def _frexp(a: dict) -> Any:
    """frexp: torch's mantissa and exponent (exact: x's own bits), with the C library's convention pinned down
    where CUDA leaves it open: ±∞ and NaN give themselves as the mantissa and exponent 0, as on the CPU."""
    x = a["self"]
    if not x.is_floating_point():
        return PASS
    mantissa, exponent = aten.frexp(x)
    finite = aten.isfinite(x)
    mantissa = aten.where(finite, mantissa, x)
    exponent = aten.where(finite, exponent, aten.zeros((), dtype=exponent.dtype, device=exponent.device))
    return _into_outs(a, mantissa, exponent, names=("mantissa", "exponent"))


def _lse(*terms: Tensor) -> Tensor:
    """log Σ e^v over a few tensors: m = max, RN(LOG(RN32(exact Σ EXP(RN(v − m)))) + m), −∞ when every term is −∞
    (m read as 0 there)."""
    m = terms[0]
    for t in terms[1:]:
        m = aten.maximum(m, t)
    m0 = aten.where(aten.eq(m, -math.inf), 0.0, m)
    e = aten.stack([carbon_ops.exp(aten.sub(t, m0)) for t in terms], -1)
    return aten.add(carbon_ops.log(carbon_ops.sum(e, [-1], False, None)), m0)


def _shift(x: Tensor, k: int) -> Tensor:
    """x moved k positions along the last dimension (right for k > 0, left for k < 0), −∞ filling."""
    fill = aten.full(list(x.shape[:-1]) + [abs(k)], -math.inf, dtype=x.dtype, device=x.device)
    return aten.cat([fill, x[..., :-k]], -1) if k > 0 else aten.cat([x[..., -k:], fill], -1)


class _CtcLattice:
    """The CTC alignment lattice of a batch: extended labels l' = (blank, l₁, blank, …, l_S, blank) per sequence,
    the log-probabilities of l' at every step, and where a step may skip a blank."""

    def __init__(self, log_probs: Tensor, targets: Tensor, input_lengths: Any, target_lengths: Any, blank: int) -> None:
        if log_probs.dtype != torch.float32:
            raise NotCovered(f"ctc_loss in {log_probs.dtype}: carbon computes it in float32")
        lengths = [int(v) for v in (input_lengths.tolist() if isinstance(input_lengths, Tensor) else input_lengths)]
        tl = [int(v) for v in (target_lengths.tolist() if isinstance(target_lengths, Tensor) else target_lengths)]
        t_max, n, _ = log_probs.shape
        s_max = max(tl + [0])
        dev = log_probs.device
        if targets.dim() == 1:  # concatenated targets
            offsets = [sum(tl[:i]) for i in range(n)]
            idx = [[offsets[i] + min(j, max(tl[i] - 1, 0)) for j in range(s_max)] for i in range(n)]
            padded = aten.index_select(targets, 0, torch.tensor(idx, dtype=torch.int64).reshape(-1).to(targets.device))
            padded = padded.reshape([n, s_max])
        else:
            padded = targets[:, :s_max]
        width = 2 * s_max + 1
        ext = aten.full([n, width], blank, dtype=torch.int64, device=dev)
        if s_max:
            ext[:, 1::2] = padded.to(device=dev, dtype=torch.int64)
        pos = torch.arange(width, device=dev)
        self.valid = aten.lt(pos.unsqueeze(0), torch.tensor([2 * v + 1 for v in tl], device=dev).unsqueeze(1))
        self.skip = aten.logical_and(aten.logical_and(aten.ge(pos, 2).unsqueeze(0), aten.ne(ext, blank)),
                                     aten.ne(ext, aten.cat([aten.full([n, 2], -1, dtype=torch.int64, device=dev),
                                                            ext[:, :-2]], 1)))
        self.ext, self.lengths, self.target_lengths, self.t_max = ext, lengths, tl, t_max
        self.lp = aten.gather(log_probs, 2, ext.unsqueeze(0).expand([t_max, n, width]))  # [T, N, S']
        self.minus_inf = aten.full([n, width], -math.inf, dtype=torch.float32, device=dev)

    def last_two(self) -> tuple:
        """Positions 2S and 2S − 1 (the latter −∞ for an empty target) as masks over the lattice."""
        dev = self.ext.device
        pos = torch.arange(self.ext.shape[1], device=dev).unsqueeze(0)
        end = torch.tensor([2 * v for v in self.target_lengths], device=dev).unsqueeze(1)
        return aten.eq(pos, end), aten.logical_and(aten.eq(pos, end - 1), aten.gt(end, 0))

    def step_is(self, t: int) -> Tensor:
        """Sequences whose last step is t."""
        return torch.tensor([t == v - 1 for v in self.lengths], device=self.ext.device).unsqueeze(1)


def _ctc_loss(a: dict) -> tuple:
    """nn.CTCLoss's forward: log α by the usual recursion in log space, every log-sum-exp RN(LOG(RN32(exact Σ
    EXP(RN(v − m)))) + m) (_lse) and every sum with a log-probability rounded; loss = −LSE(α[T−1, 2S],
    α[T−1, 2S − 1]) at each sequence's own length. Returns (loss, log α
    as [N, T, 2S + 1]) like torch; the routed backward reads log α."""
    lp = a["log_probs"]
    lat = _CtcLattice(lp, a["targets"], a["input_lengths"], a["target_lengths"], a.get("blank", 0))
    first = aten.logical_or(aten.eq(torch.arange(lat.ext.shape[1], device=lp.device), 0).unsqueeze(0),
                            aten.logical_and(aten.eq(torch.arange(lat.ext.shape[1], device=lp.device), 1).unsqueeze(0),
                                             aten.gt(torch.tensor(lat.target_lengths, device=lp.device), 0).unsqueeze(1)))
    alpha = aten.where(aten.logical_and(first, lat.valid), lat.lp[0], lat.minus_inf)
    alphas, final = [alpha], aten.where(lat.step_is(0), alpha, lat.minus_inf)
    for t in range(1, lat.t_max):
        prev = alphas[-1]
        skip = aten.where(lat.skip, _shift(prev, 2), -math.inf)
        alpha = aten.where(lat.valid, aten.add(_lse(prev, _shift(prev, 1), skip), lat.lp[t]), -math.inf)
        alphas.append(alpha)
        final = aten.where(lat.step_is(t), alpha, final)
    end, before = lat.last_two()
    loss = aten.neg(_lse(aten.amax(aten.where(end, final, -math.inf), [1]),
                         aten.amax(aten.where(before, final, -math.inf), [1])))
    return loss, aten.stack(alphas, 1)  # zero_infinity: F.ctc_loss zeroes an infinite loss itself


def _ctc_loss_backward(a: dict) -> Tensor:
    """The gradient torch's kernels compute, on the same log-space quantities: log β by the mirrored recursion,
    v = RN(log α + log β), per step and class c lcab = LSE of v over the positions labelled c (grouped maximum,
    then carbon.scatter_add of the EXPs: exact), grad = RN(RN(EXP(lp) − EXP(RN(RN(lcab + loss) − lp)))·g),
    0 beyond each sequence's length (and where the loss is infinite with zero_infinity)."""
    g, lp, loss, log_alpha = a["grad"], a["log_probs"], a["neg_log_likelihood"], a["log_alpha"]
    lat = _CtcLattice(lp, a["targets"], a["input_lengths"], a["target_lengths"], a.get("blank", 0))
    end, before = lat.last_two()
    betas = [None] * lat.t_max
    beta = lat.minus_inf
    for t in reversed(range(lat.t_max)):
        start = aten.where(aten.logical_or(end, before), lat.lp[t], -math.inf)
        skip = aten.where(_shift(lat.skip.double(), -2).bool(), _shift(beta, -2), -math.inf)
        rec = aten.add(_lse(beta, _shift(beta, -1), skip), lat.lp[t])
        beta = aten.where(lat.step_is(t), start, rec)  # each sequence starts at its own last step
        beta = aten.where(lat.valid, beta, -math.inf)
        beta = aten.where(_beyond(lat, t), -math.inf, beta)
        betas[t] = beta
    v = aten.add(aten.movedim(log_alpha, 1, 0), aten.stack(betas, 0))  # [T, N, S']
    t_max, n, c = lp.shape
    index = lat.ext.unsqueeze(0).expand([t_max, n, lat.ext.shape[1]])
    m = aten.scatter_reduce(aten.full([t_max, n, c], -math.inf, dtype=torch.float32, device=lp.device), 2, index, v,
                            "amax", include_self=True)
    m0 = aten.where(aten.eq(m, -math.inf), 0.0, m)
    e = carbon_ops.exp(aten.sub(v, aten.gather(m0, 2, index)))
    sums = carbon_ops.scatter_add(aten.zeros([t_max, n, c], dtype=torch.float32, device=lp.device), 2, index.contiguous(), e.contiguous())
    lcab = aten.add(carbon_ops.log(sums), m0)
    res = aten.sub(carbon_ops.exp(lp), carbon_ops.exp(aten.sub(aten.add(lcab, loss.reshape([1, n, 1])), lp)))
    grad = aten.mul(res, g.reshape([1, n, 1]))
    live = torch.tensor([[t < v for v in lat.lengths] for t in range(t_max)], device=lp.device).unsqueeze(-1)
    if a.get("zero_infinity", False):
        live = aten.logical_and(live, aten.logical_not(aten.isinf(loss)).reshape([1, n, 1]))
    return aten.where(live, grad, 0.0)


def _no_library_ctc_loss(a: dict) -> bool:
    """_use_cudnn_ctc_loss / _use_miopen_ctc_loss: False. torch's ctc_loss asks them whenever the
    log-probabilities are on a GPU (a query op with a float tensor argument, which strict mode would
    refuse), and cuDNN's CTC is not routed; with False torch runs _ctc_loss, which is."""
    return False


def _beyond(lat: "_CtcLattice", t: int) -> Tensor:
    """Sequences that end before step t: no β there."""
    return torch.tensor([t > v - 1 for v in lat.lengths], device=lat.ext.device).unsqueeze(1)


def _bce_with_logits(a: dict) -> Tensor:
    """loss = RN(RN(RN(1 − y)·x) + RN(lw·SOFTPLUS(−x))) with lw = RN(RN(RN(pw − 1)·y) + 1) (lw = 1 without
    pos_weight, and no product), times RN(w·loss) with a weight; mean / sum exact with one rounding. Its
    gradient is autograd's formula (sigmoid, products) on routed ops."""
    x, y, w, pw = a["self"], a["target"], a.get("weight"), a.get("pos_weight")
    _need_carbon_dtype("binary_cross_entropy_with_logits", x, y, w, pw)
    soft = carbon_ops.softplus(aten.neg(x))
    if pw is not None:
        soft = aten.mul(aten.add(aten.mul(aten.sub(pw, 1), y), 1), soft)
    loss = aten.add(aten.mul(aten.rsub(y, 1), x), soft)
    if w is not None:
        loss = aten.mul(w, loss)
    return _reduce_loss(loss, a.get("reduction", 1))


def _bce(a: dict) -> Tensor:
    """loss = RN(RN(RN(y − 1)·max(LOG1P(−x), −100)) − RN(y·max(LOG(x), −100))) (torch's clamp at −100),
    times RN(w·loss) with a weight; mean / sum exact with one rounding."""
    x, y, w = a["self"], a["target"], a.get("weight")
    _need_carbon_dtype("binary_cross_entropy", x, y, w)
    log_x = aten.clamp_min(carbon_ops.log(x), -100)
    log_1mx = aten.clamp_min(carbon_ops.log1p(aten.neg(x)), -100)
    loss = aten.sub(aten.mul(aten.sub(y, 1), log_1mx), aten.mul(y, log_x))
    if w is not None:
        loss = aten.mul(w, loss)
    return _reduce_loss(loss, a.get("reduction", 1))


def _bce_backward(a: dict) -> Tensor:
    """RN(RN(g·RN(x − y)) / max(RN(RN(1 − x)·x), 10⁻¹²)), times RN(·w) with a weight, and for mean
    RN(· / numel) (torch's order)."""
    g, x, y, w, reduction = a["grad_output"], a["self"], a["target"], a.get("weight"), a.get("reduction", 1)
    denominator = aten.clamp_min(aten.mul(aten.rsub(x, 1), x), 1e-12)
    d = aten.div.Tensor(aten.mul(g, aten.sub(x, y)), denominator)
    if w is not None:
        d = aten.mul(d, w)
    if reduction == 1:
        d = true_divide(d, float(x.numel()))
    return d.to(x.dtype)


def _logsumexp(a: dict) -> Tensor:
    """Like log_softmax's row sum (§8): m = max, S = RN32(exact Σ EXP(RN32(x − m))), result
    RN(LOG(S) + m) (m taken as 0 when it is ±∞, so that an all −∞ row gives −∞ and +∞ gives +∞). Its
    gradient is autograd's g·EXP(x − result) on routed ops."""
    x, dims, keepdim = a["self"], list(a["dim"]), a.get("keepdim", False)
    _need_carbon_dtype("logsumexp", x)
    if x.dim() == 0 or not dims:
        dims = list(range(x.dim()))
    m = aten.amax(x, dims, True)
    m = aten.where(aten.isfinite(m), m, 0.0).to(x.dtype)
    e = carbon_ops.exp(aten.sub(x, m).to(torch.float32))
    total = carbon_ops.sum(e, dims, True, torch.float32)
    r = aten.add(carbon_ops.log(total), m.to(torch.float32)).to(x.dtype)
    return r if keepdim else aten.squeeze(r, dims)


def _promoted_pair(x: Any, y: Any) -> tuple:
    """(x, y, dtype) for a binary elementwise op with torch's type promotion: numbers become 0-dim tensors,
    both operands take the result dtype (the default dtype when that is an integer type), and a 0-dim operand
    on another device (a CPU scalar beside a CUDA tensor) moves to the other's device."""
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x_t = x if isinstance(x, Tensor) else torch.full((), float(x), device=y.device)
    y_t = y if isinstance(y, Tensor) else torch.full((), float(y), device=x_t.device)
    if x_t.device != y_t.device:
        if x_t.dim() == 0:
            x_t = x_t.to(y_t.device)
        elif y_t.dim() == 0:
            y_t = y_t.to(x_t.device)
    return x_t.to(dtype), y_t.to(dtype), dtype


def _x_times_log(name: str, log_fn: Callable) -> Callable[[dict], Tensor]:
    """xlogy and special_xlog1py: RN(x·LOG(y)) / RN(x·LOG1P(y)) (carbon's log, log1p), 0 where x = 0 and y is
    not NaN (torch's rule); numbers and integer tensors promoted as torch does."""
    def handler(a: dict) -> Tensor:
        x_t, y_t, dtype = _promoted_pair(a["self"], a["other"])
        _need_carbon_dtype(name, x_t, y_t)
        product = aten.mul(x_t, log_fn(y_t))
        return aten.where(aten.logical_and(aten.eq(x_t, 0), aten.logical_not(aten.isnan(y_t))), 0.0, product).to(dtype)
    return handler


def _two_argument(name: str) -> Callable[[dict], Tensor]:
    """atan2(y, x) and hypot(x, y): carbon's correctly rounded binary64 cores (contract §6), after torch's
    broadcasting and type promotion (integers to the default dtype); bfloat16 / float16 are computed in their
    own format (one rounding of the exact binary64 value)."""
    def handler(a: dict) -> Tensor:
        u, v, _ = _promoted_pair(a["self"], a["other"])
        shape = list(torch.broadcast_shapes(u.shape, v.shape))
        u, v = u.expand(shape), v.expand(shape)
        _need_carbon_dtype(name, u, v)
        return getattr(carbon_ops, name)(u, v)
    return handler


def _entr(a: dict) -> Tensor:
    """−x·log(x) as RN(−x·LOG(x)) for x > 0 (carbon's log), 0 at 0, −∞ below, NaN for NaN (torch's rule)."""
    x = a["self"]
    if not x.is_floating_point():
        x = aten._to_copy(x, dtype=torch.get_default_dtype())
    _need_carbon_dtype("special_entr", x)
    r = aten.mul(aten.neg(x), carbon_ops.log(aten.where(aten.gt(x, 0), x, 1.0)))
    r = aten.where(aten.eq(x, 0), 0.0, aten.where(aten.lt(x, 0), float("-inf"), r))
    return aten.where(aten.isnan(x), x, r)


def _angle(a: dict) -> Any:
    """angle of a real tensor: π (RN in its dtype) where x < 0, else 0; NaN stays NaN. No arithmetic."""
    x = a["self"]
    if x.is_complex():
        raise NotCovered("angle of a complex tensor (atan2)")
    if not x.is_floating_point():
        x = aten._to_copy(x, dtype=torch.get_default_dtype())
    r = aten.where(aten.lt(x, 0), float(torch.tensor(math.pi, dtype=x.dtype)), 0.0).to(x.dtype)
    return aten.where(aten.isnan(x), x, r)


def _smooth_l1(huber: bool) -> Callable[[dict], Tensor]:
    """d = RN(x − y); |d| < β: RN(RN(RN(d·d)·0.5) / β) (smooth L1) or RN(RN(d·d)·0.5) (Huber, δ = β);
    else RN(|d| − RN(0.5·β)), times δ for Huber: RN(δ·RN(|d| − RN(0.5·δ))); mean / sum exact."""
    name = "huber_loss" if huber else "smooth_l1_loss"

    def handler(a: dict) -> Tensor:
        x, y, reduction = a["self"], a["target"], a.get("reduction", 1)
        beta = float(a.get("delta", 1.0) if huber else a.get("beta", 1.0))
        _need_carbon_dtype(name, x, y)
        d = aten.sub(x, y)
        ad = aten.abs(d)
        square = aten.mul(aten.mul(d, d), 0.5)
        if huber:
            small, large = square, aten.mul(aten.sub(ad, 0.5 * beta), beta)
        else:
            if beta == 0.0:
                return _reduce_loss(ad, reduction)
            small, large = true_divide(square, beta), aten.sub(ad, 0.5 * beta)
        return _reduce_loss(aten.where(aten.lt(ad, beta), small, large).to(x.dtype), reduction)
    return handler


def _smooth_l1_backward(huber: bool) -> Callable[[dict], Tensor]:
    """g·RN(d / β) where |d| < β else g·sign(d) (smooth L1); g·d, else g·RN(δ·sign(d)) (Huber); mean:
    g first divided by numel, RN(g / n) (torch's order)."""
    def handler(a: dict) -> Tensor:
        g, x, y, reduction = a["grad_output"], a["self"], a["target"], a.get("reduction", 1)
        beta = float(a.get("delta", 1.0) if huber else a.get("beta", 1.0))
        if reduction == 1:
            g = true_divide(g, float(x.numel()))
        d = aten.sub(x, y)
        ad = aten.abs(d)
        if huber:
            inner, outer = d, aten.mul(aten.sign(d), beta)
        else:
            inner = true_divide(d, beta) if beta != 0.0 else aten.sign(d)
            outer = aten.sign(d)
        return aten.mul(aten.where(aten.lt(ad, beta), inner, outer).to(x.dtype), g.expand(x.shape) if reduction else g)
    return handler


def _logit_bounds(x: Tensor, eps: float) -> tuple:
    """torch's kernel bounds: lo = eps in x's dtype, hi = RN(1 − lo) in x's dtype (0-dim tensors on x's device)."""
    lo = torch.full((), eps, dtype=x.dtype, device=x.device)
    return lo, aten.rsub(lo, 1)


def _logit(a: dict) -> Tensor:
    """RN(LOG(RN(z / RN(1 − z)))) with z = lo where x < lo, else hi where x > hi, else x, when eps ≥ 0 is given
    (torch's kernel rule, which also holds for eps > 0.5, where clamp would differ; carbon's log). torch reads
    a negative eps as none."""
    x, eps = a["self"], a.get("eps")
    _need_carbon_dtype("logit", x)
    z = x
    if eps is not None and eps >= 0:
        lo, hi = _logit_bounds(x, eps)
        z = aten.where(aten.lt(x, lo), lo, aten.where(aten.gt(x, hi), hi, x))
    return carbon_ops.log(aten.div.Tensor(z, aten.rsub(z, 1)))


def _logit_backward(a: dict) -> Tensor:
    """RN(g / RN(x·RN(1 − x))) inside [lo, hi], 0 outside, when eps ≥ 0 is given; without eps (or a negative
    one) torch's rule: NaN outside [0, 1], RN(g·∞) at x = ±0 and 1."""
    g, x, eps = a["grad_output"], a["self"], a.get("eps")
    d = aten.div.Tensor(g, aten.mul(x, aten.rsub(x, 1)))
    if eps is None or eps < 0:
        edge = aten.logical_or(aten.eq(x, 0), aten.eq(x, 1))
        outside = aten.logical_or(aten.lt(x, 0), aten.gt(x, 1))
        at_edge = aten.mul(g, math.inf)
        return aten.where(outside, math.nan, aten.where(edge, at_edge, d)).to(d.dtype)
    lo, hi = _logit_bounds(x, eps)
    outside = aten.logical_or(aten.lt(x, lo), aten.gt(x, hi))
    return aten.where(outside, 0.0, d).to(d.dtype)


def _nansum(a: dict) -> Tensor:
    """The exact sum of the non-NaN values (NaN read as +0), one rounding (carbon.sum)."""
    x = a["self"]
    _need_carbon_dtype("nansum", x)
    clean = aten.where(aten.isnan(x), 0.0, x).to(x.dtype)
    dims = a.get("dim")
    return carbon_ops.sum(clean, list(dims) if dims else None, a.get("keepdim", False), a.get("dtype"))


def _trace(a: dict) -> Tensor:
    x = a["self"]
    if not x.is_floating_point():
        return PASS
    _need_carbon_dtype("trace", x)
    return carbon_ops.sum(aten.diagonal(x).contiguous(), None, False, None)


def _addmv(a: dict) -> Any:
    """bias + M·v, the bias inside the single rounding (carbon.addmm) when beta = alpha = 1."""
    bias, m, v = a["self"], a["mat"], a["vec"]
    if not _float_mm("addmv", m, v):
        return PASS
    _need_carbon_dtype("addmv", bias)
    col = v.unsqueeze(1)
    return _add_product(bias, lambda out_dtype: carbon_ops.mm(m, col, out_dtype).squeeze(1),
                        lambda: carbon_ops.addmm(bias.unsqueeze(-1) if bias.dim() == 1 else bias, m, col).squeeze(1),
                        a["beta"], a["alpha"], m.dtype)


def _pad_backward(mode: str, spatial: int) -> Callable[[dict], Tensor]:
    """Reflection / replication padding's backward: each input position receives the exact sum of the
    gradients of the output positions copied from it, rounded once (carbon.index_add). The map from output
    to input positions is torch's own forward applied to the positions' numbers."""
    def handler(a: dict) -> Tensor:
        g, x, padding = a["grad_output"], a["self"], list(a["padding"])
        _need_carbon_dtype(f"{mode}_pad{spatial}d_backward", g)
        plane = list(x.shape[-spatial:])
        positions = torch.arange(math.prod(plane), dtype=torch.float64, device=g.device).reshape([1, 1] + plane)
        op = getattr(aten, f"{mode}_pad{spatial}d")
        source = op(positions, padding).reshape(-1).to(torch.int64)
        planes = math.prod(x.shape[:-spatial])
        zeros = aten.zeros([math.prod(plane), planes], dtype=g.dtype, device=g.device)
        contrib = aten.t(g.reshape([planes, math.prod(g.shape[-spatial:])])).contiguous()  # (no -1: empty g)
        return aten.t(carbon_ops.index_add(zeros, 0, source, contrib)).reshape(x.shape).contiguous()
    return handler


def _unfold_backward(a: dict) -> Tensor:
    """Tensor.unfold's gradient (and torch.istft's overlap-add): each input position receives the exact sum of
    the window entries that read it, rounded once (carbon.index_add into zeros). grad_in has input_sizes' shape
    with dim replaced by the window count, plus a trailing window axis of length size."""
    g, sizes, size, step = a["grad_in"], list(a["input_sizes"]), int(a["size"]), int(a["step"])
    if not g.is_floating_point() or not sizes or g.dim() != len(sizes) + 1 or size < 1 or step < 1:
        return PASS  # integers are exact; otherwise torch's own checks
    _need_carbon_dtype("unfold_backward", g)
    d = a["dim"] % len(sizes)
    windows = g.shape[d]
    positions = _shape_constant(("unfold_backward", windows, size, step), g.device, lambda: (
        torch.arange(windows, dtype=torch.int64).unsqueeze(1) * step + torch.arange(size, dtype=torch.int64)
    ).reshape(-1))
    src = aten.movedim(g, -1, d + 1).reshape(sizes[:d] + [windows * size] + sizes[d + 1:]).contiguous()
    return carbon_ops.index_add(aten.zeros(sizes, dtype=g.dtype, device=g.device), d, positions, src)


def _mse_loss(a: dict) -> Tensor:
    x, y, reduction = a["self"], a["target"], a["reduction"]
    _need_carbon_dtype("mse_loss", x, y)
    d = aten.sub(x, y)
    return _reduce_loss(aten.mul(d, d), reduction)


def _mse_loss_backward(a: dict) -> Tensor:
    # RN(RN(RN(x - y) * RN(2 / n)) * g), n = 1 unless reduction='mean'
    x, y, g, reduction = a["self"], a["target"], a["grad_output"], a["reduction"]
    n = x.numel() if reduction == 1 else 1
    return aten.mul(aten.mul(aten.sub(x, y), 2.0 / n), g)


def _sqrt(a: dict) -> Any:
    x = a["self"]
    if not x.is_floating_point():
        x = aten._to_copy(x, dtype=torch.get_default_dtype())  # torch's result dtype for integer input
    return sqrt_rn(x)


def _rsqrt(a: dict) -> Tensor:
    x = a["self"]
    return true_divide(aten.ones_like(x), sqrt_rn(x))


def _reciprocal(a: dict) -> Tensor:
    x = a["self"]
    return true_divide(aten.ones_like(x), x)


def _tanh_backward(a: dict) -> Tensor:
    y = a["output"]
    return aten.mul(a["grad_output"], aten.rsub(aten.mul(y, y), 1))


def _sigmoid_backward(a: dict) -> Tensor:
    y = a["output"]
    return aten.mul(a["grad_output"], aten.mul(y, aten.rsub(y, 1)))


# ---- matmul -------------------------------------------------------------------------------------------------------

def _float_mm(op: str, a: Tensor, b: Tensor) -> bool:
    if not (_floating(a) or _floating(b)):
        return False
    _need_carbon_dtype(op, a, b)
    return True


def _mm(a: dict) -> Tensor:
    x, y = a["self"], a["mat2"]
    return carbon_ops.mm(x, y, a.get("out_dtype")) if _float_mm("mm", x, y) else PASS  # (mm.dtype: out_dtype)


def _bmm(a: dict) -> Tensor:
    x, y = a["self"], a["mat2"]
    return carbon_ops.bmm(x, y, a.get("out_dtype")) if _float_mm("bmm", x, y) else PASS


def _grouped_mm(a: dict) -> Any:
    """torch._grouped_mm / F.grouped_mm (mixture-of-experts layers, and their gradients): each group's product
    by carbon.mm, so every output is its correctly rounded exact dot product and the grouping plays no role.
    offs holds the groups' cumulative ends along the grouped dimension (rows of a 2-d self with a 3-d mat2;
    the shared inner dimension of two 2-d operands; columns of a 2-d mat2 with a 3-d self); rows or columns past
    the last end are +0. The offsets are read on the host: one synchronization per call on a GPU, as
    transformers' own loop over the groups does."""
    x, w, offs, out_dtype = a["self"], a["mat2"], a.get("offs"), a.get("out_dtype")
    if a.get("bias") is not None:
        raise NotCovered("_grouped_mm with a bias")
    if not _float_mm("_grouped_mm", x, w):
        return PASS
    if x.dim() == 3 and w.dim() == 3 and offs is None:
        return carbon_ops.bmm(x, w, out_dtype=out_dtype)
    if offs is None or x.dim() not in (2, 3) or w.dim() not in (2, 3) or x.dim() + w.dim() == 6:
        return PASS  # torch's own error
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise RuntimeError("_grouped_mm: offsets have to be a 1-d int32 tensor (torch's rule)")
    groups = {(2, 3): w.shape[0], (3, 2): x.shape[0]}.get((x.dim(), w.dim()), offs.shape[0])
    if offs.shape[0] != groups:
        raise RuntimeError(f"_grouped_mm: matrix batch sizes have to match ({offs.shape[0]} offsets, {groups} groups)")
    ends = [int(v) for v in offs.tolist()]
    grouped = {(2, 3): x.shape[0], (2, 2): x.shape[1], (3, 2): w.shape[1]}[(x.dim(), w.dim())]
    starts = [0] + ends[:-1]
    if any(e < s for s, e in zip(starts, ends)) or (ends and ends[-1] > grouped):
        raise ValueError(f"carbon.enable: _grouped_mm offsets must be non-decreasing and at most {grouped}, "
                         f"got {ends}")
    dtype = out_dtype or x.dtype

    def product(p: Tensor, q: Tensor) -> Tensor:
        return carbon_ops.mm(p, q, out_dtype=out_dtype)
    if x.dim() == 2 and w.dim() == 2:  # (M, ΣK) @ (ΣK, N) -> (G, M, N)
        return aten.stack([product(x[:, s:e], w[s:e]) for s, e in zip(starts, ends)]) if ends else \
            aten.zeros([0, x.shape[0], w.shape[1]], dtype=dtype, device=x.device)
    if x.dim() == 2:  # (ΣM, K) @ (G, K, N) -> (ΣM, N)
        parts = [product(x[s:e], w[g]) for g, (s, e) in enumerate(zip(starts, ends)) if e > s]
        tail = aten.zeros([grouped - (ends[-1] if ends else 0), w.shape[-1]], dtype=dtype, device=x.device)
        return aten.cat(parts + [tail], 0)
    # (G, M, K) @ (K, ΣN) -> (M, ΣN)
    parts = [product(x[g], w[:, s:e]) for g, (s, e) in enumerate(zip(starts, ends)) if e > s]
    tail = aten.zeros([x.shape[1], grouped - (ends[-1] if ends else 0)], dtype=dtype, device=x.device)
    return aten.cat(parts + [tail], 1)


def _add_product(bias: Tensor, product: Callable[[Optional[torch.dtype]], Tensor], fused: Callable[[], Tensor],
                 beta: Any, alpha: Any, dtype: torch.dtype) -> Tensor:
    """bias + product with the bias inside the single rounding (fused) when beta = alpha = 1; otherwise
    RN(RN(β·bias) + RN(α·P)), P the correctly rounded product (product(out_dtype)). For a 16-bit result dtype
    these run in float32 (P rounded to float32) and the sum is rounded once to dtype, as torch's opmath."""
    if beta == 1 and alpha == 1:
        return fused()
    wide = dtype in _HALF
    p = _scaled(product(torch.float32 if wide else None), alpha)
    if beta == 0:  # torch ignores bias (even NaN) when beta == 0
        p = p.to(dtype) if wide else p
        return aten.clone(p) if p.shape == torch.Size([]) else p.contiguous()
    total = aten.add(_scaled(bias.to(torch.float32) if wide else bias, beta), p)
    return total.to(dtype) if wide else total


def _biased_product(name: str, first: str, second: str, product: Callable, fused: Callable) -> Callable[[dict], Any]:
    """addmm / baddbmm: bias + x @ y with carbon's single rounding when beta = alpha = 1."""
    def handler(a: dict) -> Any:
        bias, x, y = a["self"], a[first], a[second]
        if not _float_mm(name, x, y):
            return PASS
        _need_carbon_dtype(name, bias)
        out_dtype = a.get("out_dtype")  # the .dtype overloads (bfloat16 operands, float32 result)
        return _add_product(bias, lambda dtype: product(x, y, dtype or out_dtype), lambda: fused(bias, x, y, out_dtype),
                            a["beta"], a["alpha"], out_dtype or x.dtype)
    return handler


_addmm = _biased_product("addmm", "mat1", "mat2", carbon_ops.mm, carbon_ops.addmm)
_baddbmm = _biased_product("baddbmm", "batch1", "batch2", carbon_ops.bmm, carbon_ops.baddbmm)


def _batch_as_depth(x: Tensor, y: Tensor) -> tuple:
    """Σ_b x_b @ y_b as one product: x [B, N, K] → [N, B·K], y [B, K, M] → [B·K, M]."""
    depth = x.shape[0] * x.shape[2]  # explicit sizes: a -1 is ambiguous for empty tensors
    return aten.movedim(x, 0, 1).reshape([x.shape[1], depth]), y.reshape([depth, y.shape[2]])


_addbmm = _biased_product("addbmm", "batch1", "batch2",
                          lambda x, y, out_dtype: carbon_ops.mm(*_batch_as_depth(x, y), out_dtype),
                          lambda bias, x, y, out_dtype: carbon_ops.addmm(
                              bias.expand([x.shape[1], y.shape[2]]).contiguous(), *_batch_as_depth(x, y), out_dtype))


def _mv(a: dict) -> Tensor:
    m, v = a["self"], a["vec"]
    if not _float_mm("mv", m, v):
        return PASS
    return carbon_ops.mm(m, v.unsqueeze(1)).squeeze(1)


def _dot(a: dict) -> Tensor:
    x, y = a["self"], a["tensor"]
    if not _float_mm("dot", x, y):
        return PASS
    return carbon_ops.mm(x.unsqueeze(0), y.unsqueeze(1)).reshape(())


def _vdot(a: dict) -> Tensor:
    """vdot of real tensors is dot (spectral-norm parametrization's power iteration)."""
    return _dot({"self": a["self"], "tensor": a["other"]})


def _spread(values: Any, spatial: int) -> List[int]:
    """A one-element stride / padding / dilation list stands for every spatial dimension (torch expands it:
    F.conv3d(..., padding="valid") passes [0])."""
    values = list(values)
    return values * spatial if len(values) == 1 else values


def _conv_args(name: str, a: dict, *tensors: Optional[Tensor]) -> tuple:
    _need_carbon_dtype(name, *tensors)
    spatial = a["weight"].dim() - 2
    return (_spread(a["stride"], spatial), _spread(a["padding"], spatial), _spread(a["dilation"], spatial),
            a["groups"])


def _convolution(a: dict) -> Tensor:
    x, w, b = a["input"], a["weight"], a["bias"]
    stride, padding, dilation, groups = _conv_args("convolution", a, x, w, b)
    if a["transposed"]:
        return conv_transpose_forward(x, w, b, stride, padding, _spread(a["output_padding"], w.dim() - 2), dilation,
                                      groups)
    return conv_forward(x, w, b, stride, padding, dilation, groups)


def _convolution_backward(a: dict) -> tuple:
    g, x, w = a["grad_output"], a["input"], a["weight"]
    stride, padding, dilation, groups = _conv_args("convolution_backward", a, g, x, w)
    mask = [bool(m) for m in a["output_mask"]]
    backward = conv_transpose_backward if a["transposed"] else conv_backward
    return backward(g, x, w, stride, padding, dilation, groups, mask)


# ---- reductions ---------------------------------------------------------------------------------------------------

def _reduce(name: str, op: Callable) -> Callable[[dict], Any]:
    def handler(a: dict) -> Any:
        x, dim, keepdim, dtype = a["self"], a.get("dim"), a.get("keepdim", False), a.get("dtype")
        if not x.is_floating_point() and (dtype is None or not dtype.is_floating_point):
            return PASS  # integer sums are exact
        if dtype is not None and dtype not in _CARBON_DTYPES:
            raise NotCovered(f"{name} to {dtype}")
        _need_carbon_dtype(name, x)
        if not x.is_floating_point():
            x = x.to(dtype)
        dims = None if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else list(dim)
        return op(x, dims, keepdim, dtype)
    return handler


_sum = _reduce("sum", carbon_ops.sum)
_mean = _reduce("mean", carbon_ops.mean)


def _cumsum(a: dict) -> Any:
    """Every prefix sum exact and rounded once (cumsum_rows over ``dim``)."""
    x, dim, dtype = a["self"], a["dim"], a.get("dtype")
    if (dtype is None and not x.is_floating_point()) or (dtype is not None and not dtype.is_floating_point):
        return PASS  # integer prefix sums are exact (with an integer dtype torch converts x first, as MoE routers do)
    if dtype is not None and dtype not in _CARBON_DTYPES:
        raise NotCovered(f"cumsum to {dtype}")
    _need_carbon_dtype("cumsum", x)
    if not x.is_floating_point():
        x = aten._to_copy(x, dtype=dtype)
    out_dtype = dtype or x.dtype
    if x.dim() == 0 or x.numel() == 0:
        return carbon_ops.cumsum_rows(x.reshape([1, x.numel()]), out_dtype).reshape(x.shape)
    moved = aten.movedim(x, dim % x.dim(), -1)
    out = carbon_ops.cumsum_rows(moved.reshape([-1, moved.shape[-1]]), out_dtype)
    return aten.movedim(out.reshape(moved.shape), -1, dim % x.dim())


def _product_chain(x: Tensor, dim: int, dtype: Optional[torch.dtype]) -> Tensor:
    """The partial products along ``dim`` in index order, each rounded once:
    p_0 = x_0, p_k = RN(p_(k-1) · x_k) -- in float32 for bfloat16/float16 (as
    torch computes them), rounded to the output dtype at the end. One IEEE
    multiplication per step on every device (a Python loop over ``dim``: meant
    for short dimensions such as diffusion schedules)."""
    out_dtype = dtype or x.dtype
    work = _opmath(out_dtype)
    moved = aten.movedim(x.to(work), dim, 0)
    out = aten.empty_like(moved)
    if moved.shape[0] > 0:
        acc = aten.clone(moved[0])
        out[0] = acc
        for k in range(1, moved.shape[0]):
            acc = aten.mul(acc, moved[k])
            out[k] = acc
    return aten.movedim(out, 0, dim).to(out_dtype)


def _product_args(name: str, x: Tensor, dtype: Optional[torch.dtype]) -> bool:
    """False: an integer product, exact (wrapping) as torch computes it."""
    if not x.is_floating_point() and (dtype is None or not dtype.is_floating_point):
        return False
    if dtype is not None and dtype not in _CARBON_DTYPES:
        raise NotCovered(f"{name} to {dtype}")
    _need_carbon_dtype(name, x)
    return True


def _cumprod(a: dict) -> Any:
    x, dim, dtype = a["self"], a["dim"], a.get("dtype")
    if not _product_args("cumprod", x, dtype):
        return PASS
    if x.dim() == 0:
        return _product_chain(x.reshape([1]), 0, dtype).reshape(())
    return _product_chain(x, dim % x.dim(), dtype)


def _prod(a: dict) -> Any:
    """The last partial product of _product_chain (all elements: row-major order)."""
    x, dim, keepdim, dtype = a["self"], a.get("dim"), a.get("keepdim", False), a.get("dtype")
    if not _product_args("prod", x, dtype):
        return PASS
    if dim is None:
        flat = x.reshape([-1])
        if flat.numel() == 0:
            return aten.ones((), dtype=dtype or x.dtype, device=x.device)
        return _product_chain(flat, 0, dtype)[-1].clone()
    d = dim % max(x.dim(), 1)
    xs = x.reshape([1]) if x.dim() == 0 else x
    if xs.shape[d] == 0:
        shape = list(xs.shape)
        shape[d] = 1
        r = aten.ones(shape, dtype=dtype or x.dtype, device=x.device)
    else:
        r = aten.narrow(_product_chain(xs, d, dtype), d, xs.shape[d] - 1, 1).contiguous()
    if x.dim() == 0:
        return r.reshape(())
    return r if keepdim else r.squeeze(d)


def _vector_norm(a: dict) -> Tensor:
    x, ord_, dim, keepdim, dtype = a["self"], a["ord"], a["dim"], a["keepdim"], a.get("dtype")
    _need_carbon_dtype("linalg_vector_norm", x)
    if dtype is not None and dtype != x.dtype:
        if dtype != torch.float32 or x.dtype not in (torch.bfloat16, torch.float16):
            raise NotCovered(f"linalg_vector_norm of {x.dtype} with dtype={dtype}")
        x = x.to(torch.float32)  # the norm of the exact widened values (renorm's backward asks for this)
    if ord_ == math.inf:
        r = aten.amax(aten.abs(x), dim if dim is not None else [], keepdim)
        return r
    if ord_ == -math.inf:
        return aten.amin(aten.abs(x), dim if dim is not None else [], keepdim)
    if ord_ == 1:  # RN(exact Σ|x|)
        dims = None if dim is None or len(dim) == 0 else list(dim)
        return carbon_ops.sum(aten.abs(x).contiguous(), dims, keepdim, None)
    if ord_ == 0:  # the number of nonzero entries (exact below 2²⁴)
        dims = list(range(x.dim())) if dim is None or len(dim) == 0 else list(dim)
        return aten.sum(aten.ne(x, 0), dims, keepdim).to(x.dtype)
    if ord_ != 2:
        return _p_norm(x, float(ord_), dim, keepdim)
    if dim is not None and len(dim) > 0 and x.dim() > 0:
        return _norm_over_dims(x, list(dim), keepdim)
    if x.numel() == 0:
        return aten.zeros((), dtype=x.dtype, device=x.device)
    r = carbon_ops.sum_squares([x], True).to(x.dtype)
    if keepdim:
        r = r.reshape([1] * x.dim())
    return r


def _p_norm(x: Tensor, p: float, dim: Any, keepdim: bool) -> Tensor:
    """‖x‖_p for another p > 0 (torch.dist(x, y, 3), p-norm losses): RN(POW(RN(exact Σ POW(|x|, p)), 1/p)) with
    torch.pow's routes (an integer p as products in a fixed order, others carbon's pow); bfloat16 / float16 in
    float32, rounded to their dtype at the end."""
    if not p > 0 or math.isinf(p) or math.isnan(p):
        raise NotCovered(f"linalg_vector_norm with ord={p}: carbon computes ord > 0 and ±inf")
    wide = _opmath(x)
    powers = _pow({"self": aten.abs(x).to(wide), "exponent": p})
    dims = None if dim is None or len(dim) == 0 else list(dim)
    total = carbon_ops.sum(powers.contiguous(), dims, keepdim, None) if x.dim() > 0 else powers
    return _pow({"self": total, "exponent": 1.0 / p}).to(x.dtype)


def _addr(a: dict) -> Any:
    """β·M + α·(u ⊗ v): carbon.addmm of M with the rank-one product (each entry RN(M + u_i·v_j), one rounding)
    when β = α = 1, else RN(RN(β·M) + RN(α·RN(u_i·v_j))) (torch's CPU and CUDA kernels fuse differently)."""
    m, u, v = a["self"], a["vec1"], a["vec2"]
    if not _float_mm("addr", u.unsqueeze(1), v.unsqueeze(0)):
        return PASS
    _need_carbon_dtype("addr", m)
    col, row = u.unsqueeze(1), v.unsqueeze(0)
    shape = [u.shape[0], v.shape[0]]
    return _add_product(m, lambda dtype: carbon_ops.mm(col, row, dtype),
                        lambda: carbon_ops.addmm(m.expand(shape).contiguous(), col, row, None),
                        a.get("beta", 1), a.get("alpha", 1), torch.result_type(m, u))


def exact_product_parts(a: Tensor, b: Tensor) -> tuple:
    """The exact products a·b of float32 (or narrower) tensors as float32 (hi, lo), hi = RN32(a·b) and
    lo = a·b − hi: the product is exact in binary64 (at most 2 × 24 significant bits) and so is the
    difference; lo fits float32 exactly while |a·b| ≥ 2⁻¹⁰¹ (its lowest bit is then ≥ 2⁻¹⁴⁹) and hi is finite
    while |a·b| < 2¹²⁸. carbon.sum / index_add of all the hi and lo terms is then the exact sum of products."""
    p = aten.mul(a.double(), b.double())
    hi = p.to(torch.float32)
    return hi, aten.sub(p, hi.double()).to(torch.float32)


def _norm_over_dims(x: Tensor, dims: List[int], keepdim: bool) -> Tensor:
    """RN(sqrt(RN(sum of x^2))) over ``dims``, the sum exact: x^2 is split into
    float32 hi + lo (exact_product_parts: exact while |x| ≥ 2^-50.5; below, lo
    loses bits) and carbon.sum adds all the hi and lo terms exactly."""
    dims = [d % x.dim() for d in dims]
    stacked = aten.stack(exact_product_parts(x, x))
    total = carbon_ops.sum(stacked, [0] + [d + 1 for d in dims], False, x.dtype)
    r = sqrt_rn(total)
    if keepdim:
        for d in sorted(dims):
            r = r.unsqueeze(d)
    return r


def _norm(a: dict) -> Tensor:
    """aten.norm (torch.norm, weight_norm's norm_except_dim): the vector-norm route."""
    p = a.get("p")
    dim = a.get("dim")
    return _vector_norm({"self": a["self"], "ord": 2 if p is None else p, "dim": list(dim) if dim is not None else None,
                         "keepdim": a.get("keepdim", False), "dtype": a.get("dtype")})


def _cdist_pairs(x1: Tensor, x2: Tensor) -> tuple:
    """x1 [..., N, K], x2 [..., M, K] with broadcast batch dimensions, flattened to [B, N, K], [B, M, K]."""
    batch = list(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    count = math.prod(batch)  # explicit: a -1 is ambiguous for empty tensors
    a = x1.expand(batch + list(x1.shape[-2:])).reshape([count] + list(x1.shape[-2:]))
    b = x2.expand(batch + list(x2.shape[-2:])).reshape([count] + list(x2.shape[-2:]))
    return a, b, batch


def _euclidean_distances(x1: Tensor, x2: Tensor) -> Tensor:
    """d[i, j] = RN(√RN(exact Σₖ (x1ᵢₖ − x2ⱼₖ)²)) with the differences exact, from ONE carbon.bmm per batch:
    (x1 − x2)² = x1² − 2·x1·x2 + x2², so the rows [−2·x1 | hi(x1²) | lo(x1²) | 1 | 1] times the columns
    [x2 | 1 | 1 | hi(x2²) | lo(x2²)] give the exact sum inside one correctly rounded product (see
    exact_product_parts for the range: |x| ≥ 2⁻⁵⁰·⁵ or 0, and |x| < 2⁶⁴)."""
    _need_carbon_dtype("cdist", x1, x2)
    out_dtype = torch.result_type(x1, x2)
    a, b, batch = _cdist_pairs(x1.to(torch.float32), x2.to(torch.float32))
    a_hi, a_lo = exact_product_parts(a, a)
    b_hi, b_lo = exact_product_parts(b, b)
    ones_a, ones_b = aten.ones_like(a), aten.ones_like(b)
    left = aten.cat([aten.mul(a, -2.0), a_hi, a_lo, ones_a, ones_a], -1)
    right = aten.cat([b, ones_b, ones_b, b_hi, b_lo], -1)
    total = carbon_ops.bmm(left.contiguous(), aten.transpose(right, 1, 2).contiguous(), out_dtype)
    return sqrt_rn(total).reshape(batch + [x1.shape[-2], x2.shape[-2]])


def _euclidean_dist(a: dict) -> Tensor:
    return _euclidean_distances(a["x1"], a["x2"])


def _cdist_forward(a: dict) -> Tensor:
    """torch.cdist. p = 2: the exact Euclidean distance above; p = 1: RN(exact Σₖ |x1ᵢₖ − x2ⱼₖ|) (each
    difference split exactly into RN(x1 − x2) + its rounding error); p = ∞: max |RN(x1 − x2)| (= RN of the
    exact maximum); p = 0: the number of differing coordinates. Other p raise."""
    x1, x2, p = a["x1"], a["x2"], float(a["p"])
    if p == 2.0:
        return _euclidean_distances(x1, x2)
    _need_carbon_dtype("cdist", x1, x2)
    out_dtype = torch.result_type(x1, x2)
    a1, b1, batch = _cdist_pairs(x1, x2)
    diff_hi = aten.sub(a1.unsqueeze(2).to(torch.float32), b1.unsqueeze(1).to(torch.float32))  # [B, N, M, K]
    if p == math.inf:
        r = aten.amax(aten.abs(diff_hi), [-1]) if diff_hi.shape[-1] else aten.zeros(diff_hi.shape[:-1], device=x1.device)
    elif p == 0.0:
        r = aten.sum(aten.ne(diff_hi, 0), [-1]).to(torch.float32)
    elif p == 1.0:
        exact = aten.sub(a1.unsqueeze(2).double(), b1.unsqueeze(1).double())  # exact: two float32 values
        lo = aten.sub(exact, diff_hi.double()).to(torch.float32)  # exact: the rounding error of one subtraction
        sign = aten.sign(diff_hi)  # the exact difference's sign (|lo| ≤ ½ ulp(hi); hi = 0 only if lo = 0)
        terms = aten.cat([aten.mul(diff_hi, sign), aten.mul(lo, sign)], -1)
        r = carbon_ops.sum(terms.contiguous(), [-1], False, torch.float32)
    else:
        raise NotCovered(f"cdist with p = {p}: carbon computes p = 0, 1, 2 and ∞ exactly")
    return r.to(out_dtype).reshape(batch + [x1.shape[-2], x2.shape[-2]])


def _grad_output(a: dict) -> Tensor:
    """The incoming gradient of a backward op: torch 2.11's _cdist_backward / _pdist_backward name it
    `grad`, later releases `grad_output`."""
    return a["grad_output"] if "grad_output" in a else a["grad"]


def _cdist_backward(a: dict) -> Tensor:
    """The gradient for x1. p = 2: torch's _euclidean_dist_backward on routed ops, r = RN(g / d) (0 where
    d = 0), RN(RN(x1·RN(Σⱼ r)) − RN(Σⱼ r·x2)) (both sums exact); p = 1: RN(exact Σⱼ g·sign(x1 − x2));
    p = ∞: RN(exact Σⱼ of g·sign(x1 − x2) at the coordinates where |x1 − x2| = d); p = 0: zeros."""
    g, x1, x2, p, d = _grad_output(a), a["x1"], a["x2"], float(a["p"]), a["cdist"]
    _need_carbon_dtype("cdist backward", g, x1, x2)
    if p == 0.0:
        return aten.zeros_like(x1)
    if p == 2.0:
        ratio = aten.masked_fill(true_divide(g, d), aten.eq(d, 0), 0.0)
        sums = carbon_ops.sum(ratio.contiguous(), [-1], True, None)
        a1, b1, batch = _cdist_pairs(x1, x2)
        mixed = carbon_ops.bmm(ratio.reshape([-1] + list(ratio.shape[-2:])).contiguous(), b1.contiguous(), None)
        return aten.sub(aten.mul(x1, sums), mixed.reshape(x1.shape))
    if p not in (1.0, math.inf):
        raise NotCovered(f"cdist backward with p = {p}")
    a1, b1, batch = _cdist_pairs(x1, x2)
    diff = aten.sub(a1.unsqueeze(2).to(torch.float32), b1.unsqueeze(1).to(torch.float32))  # [B, N, M, K]
    gs = g.reshape([-1] + list(g.shape[-2:])).unsqueeze(-1).to(torch.float32)
    terms = aten.mul(gs, aten.sign(diff))
    if p == math.inf:
        at_max = aten.eq(aten.abs(diff), d.reshape([-1] + list(d.shape[-2:])).unsqueeze(-1).to(torch.float32))
        terms = aten.where(at_max, terms, 0.0)
    r = carbon_ops.sum(aten.transpose(terms, 2, 3).contiguous(), [-1], False, x1.dtype)  # over j
    return r.reshape(x1.shape)


def _pdist_forward(a: dict) -> Tensor:
    """torch.pdist: the cdist route's distances of the pairs i < j, row-major."""
    x, p = a["self"], a.get("p", 2.0)
    n = x.shape[0]
    full = _cdist_forward({"x1": x, "x2": x, "p": p})
    i, j = torch.triu_indices(n, n, 1, device=x.device)
    return full[i, j]


def _pdist_backward(a: dict) -> Tensor:
    """The cdist route's gradient with the pair gradients placed symmetrically: g at (i, j) and (j, i)."""
    g, x, p, d = _grad_output(a), a["self"], a["p"], a["pdist"]
    n = x.shape[0]
    i, j = torch.triu_indices(n, n, 1, device=x.device)
    grads = aten.zeros([n, n], dtype=g.dtype, device=g.device).index_put_((i, j), g).index_put_((j, i), g)
    dists = aten.zeros([n, n], dtype=d.dtype, device=d.device).index_put_((i, j), d).index_put_((j, i), d)
    return _cdist_backward({"grad_output": grads, "x1": x, "x2": x, "p": p, "cdist": dists})


def _weight_norm_slices(t: Tensor, dim: int) -> Tensor:
    """Rows [S, K]: one per index of ``dim`` (every element in one row when dim = −1, torch's 'whole tensor')."""
    if dim == -1:
        return t.reshape([1, -1])
    return aten.movedim(t, dim, 0).reshape([t.shape[dim], -1])


def _slice_shape(v: Tensor, dim: int) -> List[int]:
    return [1] * v.dim() if dim == -1 else [v.shape[d] if d == dim else 1 for d in range(v.dim())]


def _weight_norm(a: dict) -> tuple:
    """weight_norm: norms = RN(√RN(exact Σ v² over each slice)) (the vector-norm route), w = RN(v·RN(g / norms))."""
    v, g, dim = a["v"], a["g"], a.get("dim", 0)
    _need_carbon_dtype("_weight_norm_interface", v, g)
    rows = _weight_norm_slices(v, dim)
    norms = _norm_over_dims(rows, [1], False).reshape(_slice_shape(v, dim))
    return aten.mul(v, aten.div.Tensor(g, norms)), norms


def _weight_norm_backward(a: dict) -> tuple:
    """torch's formula with exact slice sums: grad_g = RN(RN(exact Σ grad_w·v) / norms),
    grad_v = RN(RN(g / norms)·RN(grad_w − RN(v·RN(grad_g / norms))))."""
    gw, v, g, norms, dim = a["grad_w"], a["saved_v"], a["saved_g"], a["saved_norms"], a.get("dim", 0)
    shape = _slice_shape(v, dim)
    gw_rows, v_rows = _weight_norm_slices(gw, dim), _weight_norm_slices(v, dim)
    dots = carbon_ops.bmm(gw_rows.unsqueeze(1).contiguous(), v_rows.unsqueeze(2).contiguous(), None)  # exact dots
    grad_g = aten.div.Tensor(dots.reshape(shape), norms)
    grad_v = aten.mul(aten.div.Tensor(g, norms), aten.sub(gw, aten.mul(v, aten.div.Tensor(grad_g, norms))))
    return grad_v, grad_g.to(g.dtype)


def _foreach_norm(a: dict) -> List[Tensor]:
    return [_vector_norm({"self": t, "ord": a["ord"], "dim": None, "keepdim": False, "dtype": a.get("dtype")})
            for t in a["self"]]


def _var_mean32(a: dict):
    """(var, mean) over ``dim`` in float32 as carbon.var_mean_rows defines them:
    mean = RN32(exact mean), var = RN32(exact sum (x - mean)^2 / (n - c))."""
    x = a["self"]
    _need_carbon_dtype("var", x)
    correction = a.get("correction")
    if correction is None:
        correction = 1 if a.get("unbiased", True) else 0
    if not float(correction).is_integer():
        raise NotCovered(f"var / std with correction={correction}: carbon supports integer corrections")
    dim, keepdim = a.get("dim"), a.get("keepdim", False)
    ndim = max(x.dim(), 1)
    dims = list(range(ndim)) if dim is None or len(dim) == 0 else sorted({d % ndim for d in dim})
    xs = x.reshape([1]) if x.dim() == 0 else x
    kept = [d for d in range(ndim) if d not in dims]
    rows = aten.permute(xs, kept + dims).reshape([math.prod(xs.shape[d] for d in kept), math.prod(xs.shape[d] for d in dims)])
    var, mean = carbon_ops.var_mean_rows(rows, int(correction))
    if keepdim:
        shape = [1 if d in dims else xs.shape[d] for d in range(ndim)] if x.dim() > 0 else []
    else:
        shape = [xs.shape[d] for d in kept] if x.dim() > 0 else []
    return var.reshape(shape), mean.reshape(shape)


# bfloat16 / float16 statistics: the float32 results above, rounded once more
# to x's dtype (torch too computes them in float32 and rounds at the end).

def _var_mean(a: dict):
    var, mean = _var_mean32(a)
    return var.to(a["self"].dtype), mean.to(a["self"].dtype)


def _var(a: dict) -> Tensor:
    return _var_mean32(a)[0].to(a["self"].dtype)


def _std(a: dict) -> Tensor:
    return sqrt_rn(_var_mean32(a)[0]).to(a["self"].dtype)


def _std_mean(a: dict):
    var, mean = _var_mean32(a)
    return sqrt_rn(var).to(a["self"].dtype), mean.to(a["self"].dtype)


# ---- normalization, softmax, losses ------------------------------------------------------------------------------

def _row_statistics(x: Tensor, normalized_shape: list, *stats: Optional[Tensor], torch_shape: bool) -> list:
    """Per-row statistics in torch's shape (x's leading dimensions, then a 1 per normalized dimension) or in
    carbon's (the leading dimensions only)."""
    lead = list(x.shape[:x.dim() - len(normalized_shape)])
    shape = lead + [1] * len(normalized_shape) if torch_shape else lead
    return [None if t is None else t.reshape(shape) for t in stats]


def _layer_norm(a: dict):
    x, w, b, ns = a["input"], a["weight"], a["bias"], list(a["normalized_shape"])
    _need_carbon_dtype("native_layer_norm", x, w, b)
    if a["eps"] < 0:
        raise NotCovered(f"layer_norm with eps = {a['eps']} < 0")
    out, mean, rstd = carbon_ops.layer_norm(x, ns, w, b, a["eps"])
    return (out, *_row_statistics(x, ns, mean, rstd, torch_shape=True))


def _stats_from_carbon(op: str, *stats: Optional[Tensor]) -> None:
    """carbon's forward leaves float32 statistics; others (torch's own forward, where carbon's was not
    covered: a negative eps) cannot feed carbon's exact backward."""
    if any(t is not None and t.dtype != torch.float32 for t in stats):
        raise NotCovered(f"{op} of statistics that carbon's forward did not compute")


def _layer_norm_backward(a: dict):
    mask = [bool(m) for m in a["output_mask"]]
    x, ns = a["input"], list(a["normalized_shape"])
    _stats_from_carbon("native_layer_norm_backward", a["mean"], a["rstd"])
    mean, rstd = _row_statistics(x, ns, a["mean"], a["rstd"], torch_shape=False)
    return _norm_backward(a["grad_out"], x, ns, mean, rstd, a["weight"], *mask)  # one pass over x and grad_out


def _rms_norm(a: dict):
    x, w, ns, eps = a["input"], a["weight"], list(a["normalized_shape"]), a["eps"]
    _need_carbon_dtype("_fused_rms_norm", x, w)
    if eps is not None and eps < 0:
        raise NotCovered(f"rms_norm with eps = {eps} < 0")
    out, rstd = carbon_ops.rms_norm(x, ns, w, eps)
    return out, _row_statistics(x, ns, rstd, torch_shape=True)[0]


def _rms_norm_backward(a: dict):
    mask = a["output_mask"]
    x, ns = a["input"], list(a["normalized_shape"])
    _stats_from_carbon("_fused_rms_norm_backward", a["rstd"])
    rstd, = _row_statistics(x, ns, a["rstd"], torch_shape=False)
    dx, dw, _ = _norm_backward(a["grad_out"], x, ns, None, rstd, a["weight"], bool(mask[0]), bool(mask[1]), False)
    return dx, dw


def _softmax_like(name: str, op: Callable, masked_rows_nan: bool) -> Callable[[dict], Tensor]:
    """carbon.softmax / log_softmax. carbon defines a row that is all −∞ as 0 (log: −∞), as torch's
    _safe_softmax does; torch's _softmax and _log_softmax give NaN there, and so do these routes
    (masked_rows_nan), so that enable changes bits but not what a fully masked row means."""
    def handler(a: dict) -> Tensor:
        x = a["self"]
        _need_carbon_dtype(name, x)
        dtype = a.get("dtype")
        if a.get("half_to_float"):
            dtype = torch.float32
        return op(x, a["dim"], dtype, masked_rows_nan)  # the kernel writes the NaN rows
    return handler


def _softmax_backward(op: Callable) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        _need_carbon_dtype("softmax_backward", a["grad_output"], a["output"])  # float64 (softmax(dtype=...))
        return op(a["grad_output"], a["output"], a["dim"], a["input_dtype"])
    return handler


def _nll_rows(a: dict):
    """(rows [N, C], targets [N], kept [N]) of nll_loss's arguments; a 1-D input is one row."""
    lsm, target = a["self"], a["target"]
    rows = lsm.unsqueeze(0) if lsm.dim() == 1 else lsm
    t = target.reshape(-1) if lsm.dim() == 1 else target
    return rows, t, aten.ne(t, a["ignore_index"])


def _nll_loss_forward(a: dict):
    lsm, weight, reduction = a["self"], a["weight"], a["reduction"]
    _need_carbon_dtype("nll_loss_forward", lsm, weight)
    rows, t, keep = _nll_rows(a)
    safe_t = aten.where(keep, t, 0)
    picked = aten.gather(rows, 1, safe_t.unsqueeze(1)).squeeze(1)
    losses = aten.where(keep, aten.neg(picked), 0.0).to(lsm.dtype)
    if weight is not None:  # RN(w[t] · (−x[t])): one rounding; ignored rows weigh +0
        wt = aten.where(keep, aten.index_select(weight, 0, safe_t), 0.0).to(lsm.dtype)
        losses = aten.mul(wt, losses)
        total_weight = carbon_ops.sum(wt, None, False, None)  # exact sum, one rounding
    else:
        count = aten.sum(keep)  # an int64 tensor on the device: exact, no host sync
        total_weight = count.to(lsm.dtype)
    if reduction == 0:
        return (losses.reshape(()) if lsm.dim() == 1 else losses), aten.zeros((), dtype=lsm.dtype, device=lsm.device)
    if reduction == 2:
        return carbon_ops.sum(losses, None, False, None), total_weight
    if weight is not None:  # RN(RN(exact Σ losses) / RN(exact Σ w[t])): torch's quotient of the two sums
        return true_divide(carbon_ops.sum(losses, None, False, None), total_weight), total_weight
    return carbon_ops.sum_divided(losses, count), total_weight  # RN(exact sum / count), one rounding


def _nll_loss_backward(a: dict) -> Tensor:
    g, lsm, weight, reduction = a["grad_output"], a["self"], a["weight"], a["reduction"]
    rows, t, keep = _nll_rows(a)
    safe_t = aten.where(keep, t, 0)
    gl = g.reshape(-1) if reduction == 0 else g.expand(t.shape)
    if reduction == 1:  # RN(g / total_weight): one IEEE division (a count is exact in float32 below 2^24)
        gl = true_divide(gl, a["total_weight"])
    vals = aten.neg(gl)
    if weight is not None:  # torch's order: RN(w[t] · −(g / total_weight))
        vals = aten.mul(aten.index_select(weight, 0, safe_t), vals)
    vals = aten.where(keep, vals, 0.0).to(lsm.dtype)
    out = aten.zeros_like(rows).scatter(1, safe_t.unsqueeze(1), vals.unsqueeze(1))
    return out.reshape(lsm.shape)


def _nll_loss2d(handler: Callable[[dict], Any]) -> Callable[[dict], Any]:
    """nll_loss2d (input [N, C, H, W], target [N, H, W]) as nll_loss over the N·H·W rows."""
    def route(a: dict) -> Any:
        b = dict(a)
        lsm = a["self"]
        b["self"] = aten.movedim(lsm, 1, -1).reshape([-1, lsm.shape[1]])
        b["target"] = a["target"].reshape(-1)
        if "grad_output" in a and a["reduction"] == 0:
            b["grad_output"] = a["grad_output"].reshape(-1)
        out = handler(b)
        if "grad_output" in a:  # the input gradient, back to [N, C, H, W]
            n, c, h, w = lsm.shape
            return aten.movedim(out.reshape([n, h, w, c]), -1, 1).contiguous()
        loss, total = out
        return (loss.reshape(a["target"].shape) if a["reduction"] == 0 else loss), total
    return route


# ---- elementwise functions --------------------------------------------------------------------------------------

# float64 too for these (double-double cores, csrc/elementwise/binary64_math.h): diffusion transformers build
# their sin-cos position tables and rotary frequencies in float64.
_BINARY64_UNARY = ("exp", "log", "sin", "cos")


def _need_carbon_dtype_or_float64(op: str, *tensors: Optional[Tensor]) -> None:
    _need_carbon_dtype(op, *(t for t in tensors if t is None or t.dtype != torch.float64))


def _unary(name: str, op: Callable) -> Callable[[dict], Any]:
    need = _need_carbon_dtype_or_float64 if name in _BINARY64_UNARY else _need_carbon_dtype

    def handler(a: dict) -> Any:
        x = a["self"]
        if not x.is_floating_point():
            if name == "silu" or x.is_complex():
                raise NotCovered(f"{name} of a {x.dtype} tensor")
            # torch computes these of integer and boolean tensors in the default dtype (torch.log(arange(1, n)) in
            # Mamba-style initializations): the conversion is one correct rounding on every device
            x = aten._to_copy(x, dtype=torch.get_default_dtype())
        need(name, x)
        return op(x)
    return handler


def _polygamma(a: dict) -> Any:
    """polygamma(n, x) for n = 0 (digamma) and n = 1 (trigamma): carbon's functions. Higher orders (the
    backward of polygamma(1, x), i.e. a second derivative of digamma) are not covered."""
    n = a["n"]
    if n not in (0, 1):
        raise NotCovered(f"polygamma of order {n} (carbon covers n = 0 and n = 1)")
    return _unary("polygamma", carbon_ops.digamma if n == 0 else carbon_ops.trigamma)(a)


def _mvlgamma(a: dict) -> Any:
    """torch's formula with carbon's lgamma: RN(x + c_j) for c_j = −(p−1)/2 … 0 in steps of ½ (x's dtype), the
    exact sum over j of LGAMMA of them rounded once, then + RN32(p(p−1)/4·log π) in float32 (torch's opmath) and
    rounded to x's dtype."""
    x, p = a["self"], a["p"]
    if p < 1:
        return PASS  # torch's own error
    if not x.is_floating_point():
        x = aten._to_copy(x, dtype=torch.get_default_dtype())
    _need_carbon_dtype("mvlgamma", x)
    offsets = aten.arange(-p * 0.5 + 0.5, 0.5, 0.5, dtype=x.dtype, device=x.device)
    terms = carbon_ops.lgamma(aten.add(offsets, x.unsqueeze(-1)))
    total = carbon_ops.sum(terms, [-1], False, None).to(torch.float32)
    constant = float(torch.tensor(p * (p - 1) * math.log(math.pi) * 0.25, dtype=torch.float32))
    out = aten.add(total, torch.full((), constant, dtype=torch.float32, device=x.device))
    return out if x.dtype == torch.float32 else carbon_ops.round_to(out, x.dtype, 1)


def _gelu(a: dict) -> Tensor:
    _need_carbon_dtype("gelu", a["self"])
    return carbon_ops.gelu(a["self"], a.get("approximate", "none"))


def _gelu_backward(a: dict) -> Tensor:
    fn = "gelu_tanh" if a.get("approximate", "none") == "tanh" else "gelu"
    return carbon_ops.elementwise_backward(a["grad_output"], a["self"], fn)


def _softplus_scaled(x: Tensor, beta: Any) -> Tensor:
    """y = RN32(x·RN32(β)) in float32 (torch's opmath: β becomes a float32 first)."""
    return aten.mul(x.to(torch.float32), float(torch.tensor(float(beta), dtype=torch.float32)))


def _softplus(a: dict) -> Tensor:
    """beta = 1: x where x > threshold (torch's rule), else carbon's softplus. Other β, as torch's formula
    in float32: y = RN32(x·β); x where y > threshold, else RN32(SOFTPLUS(y) / β), then the input's dtype."""
    x, beta, threshold = a["self"], a.get("beta", 1), a.get("threshold", 20)
    if not x.is_floating_point():
        return PASS  # torch's own error for integer tensors
    _need_carbon_dtype("softplus", x)
    if beta == 1:
        return aten.where(aten.gt(x, threshold), x, carbon_ops.softplus(x))
    y = _softplus_scaled(x, beta)
    soft = true_divide(carbon_ops.softplus(y), float(torch.tensor(float(beta), dtype=torch.float32)))
    return aten.where(aten.gt(y, threshold), x, soft.to(x.dtype))


def _softplus_backward(a: dict) -> Tensor:
    """beta = 1: g where x > threshold, else carbon's softplus derivative RN(g·σ(x)); other β: the same of
    y = RN32(x·β) (d/dx softplus(βx)/β = σ(βx)), in float32, then the gradient's dtype."""
    g, x, beta, threshold = a["grad_output"], a["self"], a.get("beta", 1), a.get("threshold", 20)
    if beta == 1:
        return aten.where(aten.gt(x, threshold), g, carbon_ops.elementwise_backward(g, x, "softplus"))
    y = _softplus_scaled(x, beta)
    inner = carbon_ops.elementwise_backward(g.to(torch.float32), y, "softplus").to(g.dtype)
    return aten.where(aten.gt(y, threshold), g, inner)


def _log_sigmoid_forward(a: dict):
    x = a["self"]
    _need_carbon_dtype("log_sigmoid", x)
    return carbon_ops.log_sigmoid(x), aten.empty([0], dtype=x.dtype, device=x.device)


def _log_sigmoid_backward(a: dict) -> Tensor:
    return carbon_ops.elementwise_backward(a["grad_output"], a["self"], "log_sigmoid")


def _silu_backward(a: dict) -> Tensor:
    return carbon_ops.elementwise_backward(a["grad_output"], a["self"], "silu")


# Piecewise activations. torch's kernels differ by device (CUDA multiplies by RN(1/6) where the CPU
# divides by 6, and may contract into fma), so each is spelled out as single rounded operations in the
# input's dtype (bfloat16 / float16: each computed in float32 and rounded to the dtype).

def _elu(a: dict) -> Tensor:
    """ELU / SELU (torch's elu with alpha, scale, input_scale), in float32 and rounded once more to a 16-bit
    dtype: x > 0: RN(x·RN32(scale)); x ≤ 0: RN(c·EXPM1(RN(x·RN32(input_scale)))) with c = RN32(alpha·scale)."""
    x = a["self"]
    _need_carbon_dtype("elu", x)
    alpha, scale, input_scale = float(a.get("alpha", 1.0)), float(a.get("scale", 1.0)), float(a.get("input_scale", 1.0))
    x32 = x.to(torch.float32)
    positive = aten.mul(x32, _scalar_like(x, scale))
    negative = aten.mul(_scalar_like(x, alpha * scale), carbon_ops.expm1(aten.mul(x32, _scalar_like(x, input_scale))))
    return aten.where(aten.gt(x32, 0), positive, negative).to(x.dtype)


def _elu_backward(a: dict) -> Tensor:
    """x ≤ 0: RN(RN(RN(g·RN32(input_scale))·c)·EXP(RN(x·RN32(input_scale)))), or from the result y (in-place
    ELU) RN(RN(g·RN32(input_scale))·RN(y + c)); x > 0: RN(g·RN32(scale)) (torch's order, in float32)."""
    g, y = a["grad_output"], a["self_or_result"]
    alpha, scale, input_scale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])
    g32, y32 = g.to(torch.float32), y.to(torch.float32)
    c, iscale = _scalar_like(g, alpha * scale), _scalar_like(g, input_scale)
    if a["is_result"]:
        negative = aten.mul(aten.mul(g32, iscale), aten.add(y32, c))
    else:
        negative = aten.mul(aten.mul(aten.mul(g32, iscale), c), carbon_ops.exp(aten.mul(y32, iscale)))
    positive = aten.mul(g32, _scalar_like(g, scale))
    return aten.where(aten.gt(y32, 0), positive, negative).to(g.dtype)


def _celu(a: dict) -> Tensor:
    """CELU(x, α) = elu(x, α, scale 1, input_scale 1/α), torch's definition."""
    alpha = float(a.get("alpha", 1.0))
    return _elu({"self": a["self"], "alpha": alpha, "scale": 1.0, "input_scale": 1.0 / alpha})


def _hardsigmoid(a: dict) -> Tensor:
    """RN(clamp(RN(x + 3), 0, 6) / 6)."""
    x = a["self"]
    _need_carbon_dtype("hardsigmoid", x)
    return true_divide(aten.clamp(aten.add(x, 3), 0, 6), 6.0)


def _hardsigmoid_backward(a: dict) -> Tensor:
    """RN(g / 6) where −3 < x < 3, else 0."""
    g, x = a["grad_output"], a["self"]
    inside = aten.logical_and(aten.gt(x, -3), aten.lt(x, 3))
    return aten.where(inside, true_divide(g, 6.0), 0.0).to(g.dtype)


def _hardswish(a: dict) -> Tensor:
    """RN(RN(x · clamp(RN(x + 3), 0, 6)) / 6)."""
    x = a["self"]
    _need_carbon_dtype("hardswish", x)
    return true_divide(aten.mul(x, aten.clamp(aten.add(x, 3), 0, 6)), 6.0)


def _hardswish_backward(a: dict) -> Tensor:
    """0 where x < −3; RN(g · RN(RN(x / 3) + 0.5)) where x ≤ 3; g above (torch's branches)."""
    g, x = a["grad_output"], a["self"]
    middle = aten.mul(g, aten.add(true_divide(x, 3.0), 0.5))
    return aten.where(aten.lt(x, -3), 0.0, aten.where(aten.le(x, 3), middle, g)).to(g.dtype)


def _mish(a: dict) -> Tensor:
    """RN(x · TANH(SOFTPLUS(x))) with carbon's tanh and softplus (§6)."""
    x = a["self"]
    _need_carbon_dtype("mish", x)
    return aten.mul(x, carbon_ops.tanh(carbon_ops.softplus(x)))


def _mish_backward(a: dict) -> Tensor:
    """t = TANH(SOFTPLUS(x)), s = SIGMOID(x): RN(g · RN(RN(RN(s · x) · RN(1 − RN(t · t))) + t))."""
    g, x = a["grad_output"], a["self"]
    t = carbon_ops.tanh(carbon_ops.softplus(x))
    s = carbon_ops.sigmoid(x)
    return aten.mul(g, aten.add(aten.mul(aten.mul(s, x), aten.rsub(aten.mul(t, t), 1)), t))


def _glu(a: dict) -> Tensor:
    """First half a, second half b along dim: RN(a · SIGMOID(b))."""
    x = a["self"]
    _need_carbon_dtype("glu", x)
    first, second = aten.chunk(x, 2, a.get("dim", -1))
    return aten.mul(first, carbon_ops.sigmoid(second))


def _glu_backward(a: dict) -> Tensor:
    """d first = RN(g · s); d second = RN(RN(RN(RN(1 − s) · s) · first) · g), s = SIGMOID(second)."""
    g, x, dim = a["grad_output"], a["self"], a.get("dim", -1)
    first, second = aten.chunk(x, 2, dim)
    s = carbon_ops.sigmoid(second)
    return aten.cat([aten.mul(g, s), aten.mul(aten.mul(aten.mul(aten.rsub(s, 1), s), first), g)], dim)


# ---- pooling and upsampling -----------------------------------------------------------------------------------------

def _pool_pair(v: Any, default: Optional[List[int]] = None, d: int = 2) -> List[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        return list(default or [])
    return v * d if len(v) == 1 else v


def _avg_pool_args(a: dict, d: int) -> tuple:
    kernel = _pool_pair(a["kernel_size"], d=d)
    stride = _pool_pair(a.get("stride", []), kernel, d=d)
    padding = _pool_pair(a.get("padding", 0), d=d)
    if a.get("divisor_override") is not None:
        raise NotCovered(f"avg_pool{d}d with divisor_override")
    return kernel, stride, padding


def _uniform_windows(a: dict, d: int) -> bool:
    """Every window divides by the full window size (no ceil_mode, and padding counted or absent): the
    fast path of columns and one carbon.mean."""
    return not a.get("ceil_mode", False) and (a.get("count_include_pad", True) or not any(_avg_pool_args(a, d)[2]))


def _pool_windows(in_sizes: List[int], kernel: List[int], stride: List[int], padding: List[int], ceil_mode: bool,
                  count_pad: bool) -> tuple:
    """torch's average-pooling windows along each dimension: (output size, per output index the valid input
    range [lo, hi) and the count it contributes to the divisor)."""
    per_dim = []
    for size, k, s, p in zip(in_sizes, kernel, stride, padding):
        span = size + 2 * p - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        windows = []
        for o in range(out):
            start = o * s - p
            end = min(start + k, size + p)
            counted = end - start  # padding inside [−p, size + p) counts with count_include_pad
            lo, hi = max(start, 0), min(end, size)
            windows.append((lo, hi, counted if count_pad else hi - lo))
        per_dim.append(windows)
    return [len(w) for w in per_dim], per_dim


def _window_classes(in_sizes: List[int], per_dim: List[list]) -> Dict[int, list]:
    """Windows grouped by divisor: {divisor: [(output position, flat input indices of the window)]}."""
    classes: Dict[int, list] = {}
    cells: List[tuple] = [((), [0], 1)]  # (output index, flat offsets so far, divisor so far)
    for dim, windows in enumerate(per_dim):
        stride_flat = math.prod(in_sizes[dim + 1:])
        cells = [(at + (o,), [f + i * stride_flat for f in flats for i in range(lo, hi)], div * count)
                 for at, flats, div in cells for o, (lo, hi, count) in enumerate(windows)]
    outs = [len(w) for w in per_dim]
    for at, flats, div in cells:
        pos = 0
        for i, o in zip(at, outs):
            pos = pos * o + i
        classes.setdefault(div, []).append((pos, flats))
    return classes


def _avg_pool_by_class(x: Tensor, d: int, a: dict) -> Tensor:
    """ceil_mode / count_include_pad=False: each output RN(exact Σ of its valid window / torch's divisor),
    as carbon.mean over rows of `divisor` entries (the window's values, then +0 for the counted padding),
    one call per divisor (they differ only at the borders)."""
    kernel, stride, padding = _avg_pool_args(a, d)
    lead, in_sizes = list(x.shape[:-d]), list(x.shape[-d:])
    outs, per_dim = _pool_windows(in_sizes, kernel, stride, padding, a.get("ceil_mode", False),
                                  a.get("count_include_pad", True))
    plane = math.prod(in_sizes)
    flat = aten.cat([x.reshape([math.prod(lead), plane]),
                     aten.zeros([math.prod(lead), 1], dtype=x.dtype, device=x.device)], 1)
    result = aten.zeros([math.prod(lead), math.prod(outs)], dtype=x.dtype, device=x.device)
    key = ("avg_pool", tuple(in_sizes), tuple(kernel), tuple(stride), tuple(padding), a.get("ceil_mode", False),
           a.get("count_include_pad", True))
    classes = _window_classes(in_sizes, per_dim)
    for div, members in classes.items():
        # `plane`: the +0 column, for counted padding
        idx = _shape_constant(key + ("rows", div), x.device, lambda: torch.tensor(
            [flats + [plane] * (div - len(flats)) for _, flats in members], dtype=torch.int64).reshape(-1))
        means = carbon_ops.mean(aten.index_select(flat, 1, idx).reshape([flat.shape[0], len(members), div]), [2],
                                False, None)
        pos = _shape_constant(key + ("positions", div), x.device,
                              lambda: torch.tensor([p for p, _ in members], dtype=torch.int64))
        result = aten.index_copy(result, 1, pos, means)
    return result.reshape(lead + outs)


def _avg_pool_backward_by_class(g: Tensor, x: Tensor, d: int, a: dict) -> Tensor:
    """Each input position RN(exact Σ over the windows containing it of RN(g / divisor)) (carbon.index_add)."""
    kernel, stride, padding = _avg_pool_args(a, d)
    lead, in_sizes = list(x.shape[:-d]), list(x.shape[-d:])
    _, per_dim = _pool_windows(in_sizes, kernel, stride, padding, a.get("ceil_mode", False),
                               a.get("count_include_pad", True))
    gflat = g.reshape([math.prod(lead), math.prod(g.shape[len(lead):])])
    plane = math.prod(in_sizes)

    def lists() -> tuple:
        dest, src_pos, divisors = [], [], []
        for div, members in _window_classes(in_sizes, per_dim).items():
            for pos, flats in members:
                dest += flats
                src_pos += [pos] * len(flats)
                divisors += [div] * len(flats)
        return dest, src_pos, divisors
    key = ("avg_pool_backward", tuple(in_sizes), tuple(kernel), tuple(stride), tuple(padding),
           a.get("ceil_mode", False), a.get("count_include_pad", True))
    built: List[tuple] = []

    def part(i: int, dtype: torch.dtype) -> Callable[[], Tensor]:
        def make() -> Tensor:
            if not built:
                built.append(lists())
            return torch.tensor(built[0][i], dtype=dtype)
        return make
    src_pos = _shape_constant(key + ("sources",), g.device, part(1, torch.int64))
    divisors = _shape_constant(key + ("divisors",), g.device, part(2, torch.float64)).to(g.dtype)
    dest = _shape_constant(key + ("destinations",), g.device, part(0, torch.int64))
    shares = true_divide(aten.index_select(gflat, 1, src_pos), divisors)
    out = carbon_ops.index_add(aten.zeros([plane, gflat.shape[0]], dtype=g.dtype, device=g.device), 0,
                               dest, aten.t(shares).contiguous())
    return aten.t(out).reshape(x.shape).contiguous()


def _avg_pool(d: int) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        """Each output RN(exact Σ window / window size), padding counted as +0 (count_include_pad):
        carbon.mean over each window, copied into columns as for a convolution."""
        x = a["self"]
        _need_carbon_dtype(f"avg_pool{d}d", x)
        if not _uniform_windows(a, d):
            return _avg_pool_by_class(x, d, a)
        kernel, stride, padding = _avg_pool_args(a, d)
        batched = x if x.dim() == d + 2 else x.unsqueeze(0)
        n, c = batched.shape[:2]
        cols, out = conv_columns(batched, kernel, stride, [1] * d, padding, 1)  # [1, C*K, N*P]
        means = carbon_ops.mean(cols.reshape([c, math.prod(kernel), n] + out), [1], False, None)  # [C, N, P...]
        y = aten.movedim(means, 0, 1).contiguous()
        return y if x.dim() == d + 2 else y.squeeze(0)
    return handler


def _avg_pool_backward(d: int) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        """RN(exact Σ over the windows containing the position of RN(g / window size)): each window's share
        (one IEEE division), then one exact sum per input position (a transposed convolution with unit
        weights)."""
        g, x = a["grad_output"], a["self"]
        if not _uniform_windows(a, d):
            return _avg_pool_backward_by_class(g, x, d, a)
        kernel, stride, padding = _avg_pool_args(a, d)
        gb, xb = (g, x) if x.dim() == d + 2 else (g.unsqueeze(0), x.unsqueeze(0))
        c = xb.shape[1]
        share = true_divide(gb, float(math.prod(kernel)))
        ones = aten.ones([c, 1] + kernel, dtype=gb.dtype, device=gb.device)
        natural = conv_transpose_size(share, ones, stride, padding, [0] * d, [1] * d)
        out = conv_transpose_forward(share, ones, None, stride, padding,
                                     [xb.shape[2 + i] - natural[i] for i in range(d)], [1] * d, c)
        return out if x.dim() == d + 2 else out.squeeze(0)
    return handler


def _interpolation_matrix(size_in: int, size_out: int, align_corners: bool, scale: Optional[float],
                          device: torch.device, cubic: bool = False, antialias: bool = False) -> Tensor:
    """[size_out, size_in] float32 weights of linear (or cubic) interpolation along one dimension, torch's
    rule in binary64: scale = (in − 1)/(out − 1) with align_corners, else 1/scale_factor if given, else
    in/out; src = scale·dst (align_corners) or scale·(dst + 0.5) − 0.5, clamped at 0 for linear. Linear:
    i0 = ⌊src⌋, i1 = min(i0 + 1, in − 1), λ1 = src − i0, λ0 = 1 − λ1. Cubic (torch's A = −0.75 kernel):
    t = src − ⌊src⌋, weights c₁(t + 1), c₀(t), c₀(1 − t), c₁(2 − t) at ⌊src⌋ − 1 … ⌊src⌋ + 2, indices clamped
    to [0, in − 1], with c₀(x) = ((A + 2)x − (A + 3))x² + 1 and c₁(x) = ((Ax − 5A)x + 8A)x − 4A. Weights
    landing on one index are added in binary64; each entry is then rounded once to float32. antialias: the
    weights of _antialias_rows."""
    if align_corners:
        step = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else size_in / size_out
    key = ("interpolation", size_in, size_out, align_corners, scale, cubic, antialias)
    if antialias:
        return _shape_constant(key, device, lambda: _antialias_rows(size_in, size_out, step, cubic))
    return _shape_constant(key, device, lambda: _interpolation_rows(size_in, size_out, align_corners, step, cubic))


def _interpolation_rows(size_in: int, size_out: int, align_corners: bool, step: float, cubic: bool) -> Tensor:
    """The host-side weights of _interpolation_matrix, as a float32 CPU tensor."""
    rows = [[0.0] * size_in for _ in range(size_out)]
    for dst in range(size_out):
        src = step * dst if align_corners else step * (dst + 0.5) - 0.5
        if cubic:
            base = int(math.floor(src))
            t = src - base
            for k, w in enumerate(_cubic_weights(t)):
                rows[dst][min(max(base - 1 + k, 0), size_in - 1)] += w
            continue
        src = max(src, 0.0)
        i0 = min(int(math.floor(src)), size_in - 1)
        i1 = min(i0 + 1, size_in - 1)
        lam1 = src - i0
        rows[dst][i0] += 1.0 - lam1
        rows[dst][i1] += lam1
    return torch.tensor(rows, dtype=torch.float64).to(torch.float32)


def _antialias_rows(size_in: int, size_out: int, step: float, cubic: bool) -> Tensor:
    """torch's antialiased weights (F.interpolate(antialias=True), PIL's resampling), in binary64: the filter
    (triangle, or Keys' cubic with A = −0.5) stretched by the scale when downsampling, support
    s = (2 or 4)/2 · max(scale, 1); output i reads inputs xmin … xmin + xsize − 1 with c = scale·(i + 0.5),
    xmin = max(trunc(c − s + 0.5), 0), xmax = min(trunc(c + s + 0.5), in), weight_j = filter((j − c + 0.5)/
    max(scale, 1)) divided by their sum (when nonzero); each entry then rounded once to float32."""
    support = (2.0 if cubic else 1.0) * (step if step >= 1.0 else 1.0)
    invscale = 1.0 / step if step >= 1.0 else 1.0
    rows = [[0.0] * size_in for _ in range(size_out)]
    for dst in range(size_out):
        center = step * (dst + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), size_in)
        weights = [_antialias_filter((j - center + 0.5) * invscale, cubic) for j in range(xmin, xmax)]
        total = 0.0
        for w in weights:
            total += w
        for j, w in zip(range(xmin, xmax), weights):
            rows[dst][j] = w / total if total != 0.0 else w
    return torch.tensor(rows, dtype=torch.float64).to(torch.float32)


def _antialias_filter(x: float, cubic: bool) -> float:
    x = abs(x)
    if not cubic:
        return 1.0 - x if x < 1.0 else 0.0
    near, far = _cubic_kernel(-0.5)
    return near(x) if x < 1.0 else (far(x) if x < 2.0 else 0.0)


def _cubic_kernel(A: float) -> tuple:
    """Keys' cubic convolution kernel: its pieces on |x| < 1 and 1 ≤ |x| < 2 (torch's cubic_convolution1/2)."""
    def near(x: float) -> float:
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x: float) -> float:
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return near, far


def _cubic_weights(t: float, A: float = -0.75) -> List[float]:
    """torch's get_cubic_upsample_coefficients (Keys' kernel, A = −0.75), in binary64."""
    near, far = _cubic_kernel(A)
    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def _linear_upsample_args(a: dict, spatial: int, in_sizes: List[int]) -> tuple:
    out_sizes = a.get("output_size")
    factors = a.get("scale_factors")
    if factors is None:
        keys = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}[spatial]
        factors = [a.get(k) for k in keys]
    if not out_sizes:
        out_sizes = [int(math.floor(i * f)) for i, f in zip(in_sizes, factors)]
    return list(out_sizes), list(factors), bool(a["align_corners"])


def _along(t: Tensor, dim: int, matrix: Tensor, out_dtype: torch.dtype) -> Tensor:
    """RN(exact Σ_k matrix[j, k] · t[..., k, ...]) along ``dim``: one carbon.mm."""
    moved = aten.movedim(t, dim, -1)
    lead = list(moved.shape[:-1])
    rows = moved.reshape([-1, moved.shape[-1]])
    out = carbon_ops.mm(rows, aten.t(matrix), out_dtype)
    return aten.movedim(out.reshape(lead + [matrix.shape[0]]), -1, dim)


def _upsample_linear(spatial: int, cubic: bool = False, antialias: bool = False) -> Callable[[dict], Tensor]:
    """linear / bilinear / trilinear (and bicubic) upsampling as separable exact products: along each
    spatial dimension from the last, RN(exact Σ of interpolation weight · value) (two or four terms;
    carbon.mm with the float32 interpolation matrix); float32 between the passes, the input's dtype after
    the last."""
    def handler(a: dict) -> Tensor:
        x = a["input"] if "input" in a else a["self"]
        _need_carbon_dtype("upsample", x)
        in_sizes = list(x.shape[-spatial:])
        out_sizes, factors, align = _linear_upsample_args(a, spatial, in_sizes)
        t = x
        for k in reversed(range(spatial)):
            dim = x.dim() - spatial + k
            matrix = _interpolation_matrix(in_sizes[k], out_sizes[k], align, factors[k], x.device, cubic, antialias)
            t = _along(t, dim, matrix, x.dtype if k == 0 else torch.float32)
        return t.contiguous()
    return handler


def _upsample_linear_backward(spatial: int, cubic: bool = False, antialias: bool = False) -> Callable[[dict], Tensor]:
    """The transposed products: along each spatial dimension from the last, RN(exact Σ_j weight[j, k] · g_j)."""
    def handler(a: dict) -> Tensor:
        g = a["grad_output"]
        in_sizes = list(a["input_size"])[-spatial:]
        out_sizes, factors, align = _linear_upsample_args(a, spatial, in_sizes)
        t = g
        for k in reversed(range(spatial)):
            dim = g.dim() - spatial + k
            matrix = _interpolation_matrix(in_sizes[k], out_sizes[k], align, factors[k], g.device, cubic, antialias)
            t = _along(t, dim, aten.t(matrix), g.dtype if k == 0 else torch.float32)
        return t.contiguous()
    return handler


def _upsample_nearest_backward(a: dict) -> Tensor:
    """Integer scale factors: each input's gradient is the exact sum of its block of outputs, rounded
    once (carbon.sum). Other factors raise."""
    g = a["grad_output"]
    _need_carbon_dtype("upsample_nearest_backward", g)
    out_size, in_size = list(a["output_size"]), list(a["input_size"])
    d = len(out_size)
    if any(o % i for o, i in zip(out_size, in_size[2:])):
        raise NotCovered("upsample_nearest backward with a non-integer scale factor")
    shape = list(g.shape[:2])
    for o, i in zip(out_size, in_size[2:]):
        shape += [i, o // i]
    return carbon_ops.sum(g.reshape(shape), [3 + 2 * k for k in range(d)], False, None)


def _linspace(a: dict) -> Any:
    """torch's two-sided formula in binary64, rounded once to the dtype: step = (end − start) / (steps − 1),
    v_i = start + step·i for i < steps / 2, else end − step·(steps − 1 − i). (torch computes it in float32,
    and CUDA may contract it into an fma.)"""
    start, end, steps = a["start"], a["end"], a["steps"]
    dtype = a.get("dtype") or torch.get_default_dtype()
    if isinstance(start, Tensor) or isinstance(end, Tensor):
        raise NotCovered("linspace with tensor bounds")
    if not dtype.is_floating_point:
        return PASS
    if dtype not in _CARBON_DTYPES:
        raise NotCovered(f"linspace in {dtype}")
    device = a.get("device") or torch.device("cpu")
    if steps <= 1:
        return torch.full([steps], float(start), dtype=dtype, device=device)
    step = (float(end) - float(start)) / (steps - 1)
    i = aten.arange(steps, dtype=torch.float64, device=device)
    low = aten.add(aten.mul(i, step), float(start))
    high = aten.rsub(aten.mul(aten.rsub(i, steps - 1), step), float(end))
    return aten.where(aten.lt(i, steps // 2), low, high).to(dtype)


# ---- indexed accumulation ---------------------------------------------------------------------------------------

def _zero_dim_as_vector(handler: Callable[[dict], Any], tensors: tuple) -> Callable[[dict], Any]:
    """torch accepts a 0-dim self (with 0-dim or one-element index and source) in index_add / scatter_add /
    scatter_reduce; carbon's ops want one dimension: run those as length-1 vectors and reshape back."""
    def route(a: dict) -> Any:
        if a["self"].dim() != 0:
            return handler(a)
        b = dict(a, dim=0)
        for key in tensors:
            if isinstance(b.get(key), Tensor) and b[key].dim() == 0:
                b[key] = b[key].reshape([1])
        result = handler(b)
        return result if result is PASS else result.reshape([])
    return route


def _index_add_vectors(a: dict) -> Tensor:
    x, src = a["self"], a["source"]
    if not x.is_floating_point():
        return PASS
    return carbon_ops.index_add(x, a["dim"], a["index"], _scaled(src, a.get("alpha", 1)))


def _int64_index(index: Tensor) -> Tensor:
    """torch lets gather (and so its backward's scatter_add) take other integer index dtypes; carbon's ops read
    int64 or int32."""
    return index if index.dtype in (torch.int64, torch.int32) else index.to(torch.int64)


def _scatter_add_vectors(a: dict) -> Tensor:
    x = a["self"]
    if not x.is_floating_point():
        return PASS
    return carbon_ops.scatter_add(x, a["dim"], _int64_index(a["index"]), a["src"])


_index_add = _zero_dim_as_vector(_index_add_vectors, ("self", "index", "source"))
_scatter_add = _zero_dim_as_vector(_scatter_add_vectors, ("self", "index", "src"))


def _max_pool_backward(spatial: int) -> Callable[[dict], Tensor]:
    """Each window's gradient to the position of its maximum; a position shared by overlapping windows
    receives the exact sum of their gradients, rounded once (carbon.scatter_add into zeros)."""
    def handler(a: dict) -> Tensor:
        g, x, idx = a["grad_output"], a["self"], a["indices"]
        _need_carbon_dtype("max_pool_backward", g)
        planes = math.prod(x.shape[:-spatial])  # indices are flat within each (sample, channel) plane
        zeros = aten.zeros([planes, math.prod(x.shape[-spatial:])], dtype=g.dtype, device=g.device)
        src = g.reshape([planes, -1]).contiguous()
        return carbon_ops.scatter_add(zeros, 1, idx.reshape([planes, -1]), src).reshape(x.shape)
    return handler


def _pool_regions(size: int, out: int) -> List[tuple]:
    """torch's adaptive pooling regions along one dimension: [floor(i*size/out), ceil((i+1)*size/out))."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _adaptive_avg_pool(d: int) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        """Each output the exact mean of its region, rounded once (carbon.mean)."""
        x = a["self"]
        _need_carbon_dtype(f"_adaptive_avg_pool{d}d", x)
        outs, sizes = list(a["output_size"]), list(x.shape[-d:])
        lead = list(x.shape[:-d])
        if all(s % o == 0 for s, o in zip(sizes, outs)):  # a regular tiling: one call
            tiles = x.reshape(lead + [v for s, o in zip(sizes, outs) for v in (o, s // o)])
            return carbon_ops.mean(tiles, [-1 - 2 * i for i in range(d)], False, None)
        cells = []
        for region in _product_of_regions(sizes, outs):
            window = x[(Ellipsis,) + tuple(slice(lo, hi) for lo, hi in region)].contiguous()
            cells.append(carbon_ops.mean(window, list(range(-d, 0)), False, None))
        return aten.stack(cells, -1).reshape(lead + outs)
    return handler


def _product_of_regions(sizes: List[int], outs: List[int]) -> List[tuple]:
    """Every output cell's region (one (lo, hi) per dimension), row-major."""
    cells: List[tuple] = [()]
    for s, o in zip(sizes, outs):
        cells = [c + (r,) for c in cells for r in _pool_regions(s, o)]
    return cells


def _adaptive_avg_pool_backward(d: int) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        """RN(g / |region|) to every position of the region (one IEEE division); where regions overlap
        (sizes not divisible), the shares are added region by region in row-major order, each addition
        rounded."""
        g, x = a["grad_output"], a["self"]
        outs, sizes = list(g.shape[-d:]), list(x.shape[-d:])
        lead = list(g.shape[:-d])
        if all(s % o == 0 for s, o in zip(sizes, outs)):
            share = true_divide(g, float(math.prod(s // o for s, o in zip(sizes, outs))))
            spread = share.reshape(lead + [v for o in outs for v in (o, 1)])
            return spread.expand(lead + [v for s, o in zip(sizes, outs) for v in (o, s // o)]).reshape(x.shape).contiguous()
        out = aten.zeros_like(x, memory_format=torch.contiguous_format)
        for cell, region in enumerate(_product_of_regions(sizes, outs)):
            at = []
            for o in reversed(outs):  # the cell's index along each dimension
                at.append(cell % o)
                cell //= o
            at.reverse()
            where = (Ellipsis,) + tuple(slice(lo, hi) for lo, hi in region)
            size = math.prod(hi - lo for lo, hi in region)
            share = true_divide(g[(Ellipsis,) + tuple(slice(i, i + 1) for i in at)], float(size))
            out[where] = aten.add(out[where], share)
        return out
    return handler


def _index_put(a: dict) -> Any:
    """x[indices] += values with accumulate=True (the backward of advanced indexing): every destination
    element gets RN(x + exact Σ of its values), duplicates included (carbon.index_add over the indexed
    dimensions flattened into one). Integer index tensors, broadcast together, on adjacent dimensions
    (torch's rule for where the broadcast dimensions go then keeps them in place); boolean masks are
    first turned into integer indices as torch does. accumulate=False: see _index_put_last_wins."""
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    if not a.get("accumulate", False):
        return _index_put_last_wins(a)
    if not x.is_floating_point():
        return PASS
    expanded: List[Optional[Tensor]] = []
    for i in indices:
        if i is not None and i.dtype == torch.bool:  # a mask over len(i.shape) dims: its nonzero coordinates
            expanded.extend(aten.nonzero(i).unbind(1))
        else:
            expanded.append(i)
    expanded += [None] * (x.dim() - len(expanded))
    used = [d for d, i in enumerate(expanded) if i is not None]
    if not used or used != list(range(used[0], used[-1] + 1)):
        raise NotCovered("index_put with accumulate=True on non-adjacent indexed dimensions")
    if any(expanded[d].dtype not in (torch.int64, torch.int32) for d in used):
        raise NotCovered("index_put with accumulate=True and a non-integer index")
    first, k = used[0], len(used)
    sizes = [x.shape[d] for d in used]
    # torch lets a CUDA tensor be indexed by CPU index tensors (x[cpu_idx], x[:, [0, 2]]); the backward's
    # index_put then gets them as they are, and carbon.index_add wants its index on x's device
    idx = aten.broadcast_tensors([expanded[d].to(x.device) for d in used])
    flat = None
    for d, (ix, size) in enumerate(zip(idx, sizes)):
        ix = aten.where(aten.lt(ix, 0), aten.add(ix, size), ix).to(torch.int64)  # torch's negative indices
        flat = ix if flat is None else aten.add(aten.mul(flat, size), ix)
    bshape = list(idx[0].shape)
    rest_before, rest_after = list(x.shape[:first]), list(x.shape[first + k:])
    target = aten.movedim(x, list(range(first, first + k)), list(range(k))).reshape([-1] + rest_before + rest_after)
    vals = values.expand(rest_before + bshape + rest_after)
    vals = aten.movedim(vals, list(range(first, first + len(bshape))), list(range(len(bshape))))
    vals = vals.reshape([-1] + rest_before + rest_after)
    out = carbon_ops.index_add(target.contiguous(), 0, flat.reshape([-1]), vals.contiguous())
    out = out.reshape(sizes + rest_before + rest_after)
    return aten.movedim(out, list(range(k)), list(range(first, first + k))).contiguous()


def _index_put_last_wins(a: dict) -> Any:
    """x[indices] = values (accumulate=False) with a rule for repeated index tuples: the last write wins, the
    last in the row-major order of the broadcast index shape (torch leaves the winner unspecified: its CPU
    kernel writes in parallel chunks, CUDA in any order). Each destination's writer is the largest position
    naming it (scatter_reduce amax, exact); every write to it then carries the writer's values, so torch's
    index_put gives the same result whatever order its writes land in. Boolean masks (no repeats possible)
    and a single value (all writes equal) go to torch unchanged."""
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    given = [i for i in indices if i is not None]
    if values.numel() <= 1 or not given or all(i.dtype == torch.bool for i in given):
        return PASS
    expanded: List[Optional[Tensor]] = []
    for i in indices:
        if i is not None and i.dtype == torch.bool:  # mixed with integer indices: its nonzero coordinates
            expanded.extend(aten.nonzero(i).unbind(1))
        else:
            expanded.append(i)
    if len(expanded) > x.dim():
        return PASS  # too many indices: torch's own error
    expanded += [None] * (x.dim() - len(expanded))
    used = [d for d, i in enumerate(expanded) if i is not None]
    if any(expanded[d].dtype not in (torch.int64, torch.int32) for d in used):
        return PASS  # torch raises its own error for other index dtypes
    idx = aten.broadcast_tensors([expanded[d].to(x.device) for d in used])
    bshape = list(idx[0].shape)
    flat = None
    for ix, size in zip(idx, [x.shape[d] for d in used]):
        ix = aten.where(aten.lt(ix, 0), aten.add(ix, size), ix).to(torch.int64)  # torch's negative indices
        flat = ix if flat is None else aten.add(aten.mul(flat, size), ix)
    flat = flat.reshape([-1])
    if flat.numel() <= 1:
        return PASS
    destinations = math.prod(x.shape[d] for d in used)
    if flat.device.type == "cpu" and not bool(aten.all(aten.logical_and(aten.ge(flat, 0), aten.lt(flat, destinations)))):
        return PASS  # out of range: torch's own error (on a GPU, reading that here would synchronize)
    winner = _last_equal_positions(flat)
    # where the broadcast index dimensions sit in x[indices]: in place of adjacent indexed dimensions, else first
    adjacent = used == list(range(used[0], used[-1] + 1))
    first = used[0] if adjacent else 0
    rest = [x.shape[d] for d in range(x.dim()) if d not in used]
    before, after = (rest[:first], rest[first:]) if adjacent else ([], rest)
    try:
        vals = values.to(x.device).expand(before + bshape + after)
    except RuntimeError:
        return PASS  # values that do not broadcast: torch's own error
    vals = vals.reshape([math.prod(before), flat.numel(), math.prod(after)])
    vals = aten.index_select(vals, 1, winner).reshape(before + bshape + after)
    return WithArguments(values=vals)


def _bag_of_each_index(indices: Tensor, offsets: Tensor, include_last_offset: bool) -> tuple:
    """(bag of every index, number of bags), computed on the device (no host sync): bag b holds the
    indices [offsets[b], offsets[b + 1]), the last one up to the end (or to the last offset with
    include_last_offset)."""
    starts = offsets[:-1] if include_last_offset else offsets
    positions = aten.arange(indices.numel(), device=indices.device, dtype=offsets.dtype)
    bags = aten.sub(aten.searchsorted(starts.contiguous(), positions, right=True), 1)
    return bags.to(torch.int64), starts.numel()


def _quotient_by_count(x: Tensor, counts: Tensor) -> Tensor:
    """RN(x / n), n an integer count broadcast against x (read as 1 where 0; n < 2²⁴): the binary64 quotient
    rounded once more, which is the correctly rounded one (a quotient of two ≤ 24-bit numbers taken to
    53 ≥ 2·24 + 1 bits)."""
    return aten.div(x.double(), aten.clamp_min(counts, 1).double()).to(x.dtype)


def _embedding_bag(a: dict) -> tuple:
    """nn.EmbeddingBag / F.embedding_bag. sum: each bag RN(exact Σ of its rows) (with per_sample_weights,
    float32 only, the exact Σ of the exact products, each split into float32 hi + lo as for the norm route,
    exact unless a product is below 2⁻¹⁰¹ in magnitude); mean: RN(RN(exact Σ) / n) with n the bag's rows
    other than padding_idx; max: the elementwise maximum (torch's kernel: a selection). Empty bags give +0.
    Returns (out, bag of every index, bag sizes, argmax rows), which the routed backward reads."""
    w, idx, offsets, mode = a["weight"], a["indices"], a["offsets"], a.get("mode", 0)
    psw, padding_idx = a.get("per_sample_weights"), a.get("padding_idx", -1)
    last = a.get("include_last_offset", False)
    _need_carbon_dtype("embedding_bag", w, psw)
    if mode == 2:
        out, _, _, max_rows = aten._embedding_bag(w, idx, offsets, False, 2, False, None, last, padding_idx)
    idx = idx.reshape([-1])
    bags, n_bags = _bag_of_each_index(idx, offsets, last)
    keep = aten.ne(idx, padding_idx) if padding_idx is not None and padding_idx >= 0 else aten.ones_like(idx, dtype=torch.bool)
    sizes = aten.zeros([n_bags], dtype=torch.int64, device=w.device).index_add_(0, bags, keep.to(torch.int64))
    if mode == 2:
        return out, bags, sizes, max_rows
    rows = aten.where(keep.unsqueeze(1), aten.index_select(w, 0, idx), 0.0)
    zeros = aten.zeros([n_bags, w.shape[1]], dtype=w.dtype, device=w.device)
    if psw is not None:
        if mode != 0:
            raise NotImplementedError("embedding_bag: per_sample_weights are only supported for mode='sum'")
        if w.dtype != torch.float32:
            raise NotCovered(f"embedding_bag with per_sample_weights in {w.dtype}")
        hi, lo = exact_product_parts(rows, psw.reshape([-1, 1]))
        out = carbon_ops.index_add(zeros, 0, aten.cat([bags, bags]), aten.cat([hi, lo]))
    else:
        out = carbon_ops.index_add(zeros, 0, bags, rows.contiguous())
    if mode == 1:
        out = _quotient_by_count(out, sizes.unsqueeze(1))
    return out, bags, sizes, aten.zeros_like(sizes)


def _embedding_bag_dense_backward(a: dict) -> Tensor:
    """Every weight row RN(exact Σ of its contributions): sum g[bag] (RN(g·psw) with per-sample weights),
    mean RN(g[bag] / n), max g[b, j] to the row that held bag b's maximum in column j; padding_idx gets none."""
    g, idx, bags, sizes = a["grad"], a["indices"].reshape([-1]), a["offset2bag"], a["bag_size"]
    mode, psw, padding_idx, n = a["mode"], a.get("per_sample_weights"), a.get("padding_idx", -1), a["num_weights"]
    _need_carbon_dtype("embedding_bag backward", g)
    if a.get("scale_grad_by_freq", False) or a.get("sparse", False):
        raise NotCovered("embedding_bag with scale_grad_by_freq or sparse gradients")
    if bags.numel() != idx.numel():  # torch's own forward may leave it empty
        if a.get("offsets") is None:
            raise NotCovered("embedding_bag backward without the bag of every index")
        bags, _ = _bag_of_each_index(idx, a["offsets"], a["offsets"].numel() == g.shape[0] + 1)
    zeros = aten.zeros([n, g.shape[1]], dtype=g.dtype, device=g.device)
    if mode == 2:
        rows = a["maximum_indices"]
        used = aten.logical_and(aten.ge(rows, 0), aten.gt(sizes, 0).unsqueeze(1))  # empty bags: no maximum
        return carbon_ops.scatter_add(zeros, 0, aten.where(used, rows, 0).contiguous(),
                                      aten.where(used, g, 0.0).contiguous())
    contrib = aten.index_select(g, 0, bags)
    if mode == 1:
        contrib = _quotient_by_count(contrib, aten.index_select(sizes, 0, bags).unsqueeze(1))
    if psw is not None:
        contrib = aten.mul(contrib, psw.reshape([-1, 1]).to(g.dtype))
    if padding_idx is not None and padding_idx >= 0:
        contrib = aten.where(aten.ne(idx, padding_idx).unsqueeze(1), contrib, 0.0)
    return carbon_ops.index_add(zeros, 0, idx, contrib.contiguous())


def _embedding_bag_per_sample_weights_backward(a: dict) -> Tensor:
    """Each index's RN(exact Σⱼ g[bag, j]·w[index, j]) (`carbon.bmm` of one row by one column); 0 for
    padding_idx."""
    g, w, idx, bags = a["grad"], a["weight"], a["indices"].reshape([-1]), a["offset2bag"]
    if bags.numel() != idx.numel():
        bags, _ = _bag_of_each_index(idx, a["offsets"], a["offsets"].numel() == g.shape[0] + 1)
    rows = aten.index_select(w, 0, idx).unsqueeze(2)  # [M, D, 1]
    grads = aten.index_select(g, 0, bags).unsqueeze(1)  # [M, 1, D]
    out = carbon_ops.bmm(grads.contiguous(), rows.contiguous(), None).reshape([-1])
    padding_idx = a.get("padding_idx", -1)
    if padding_idx is not None and padding_idx >= 0:
        out = aten.where(aten.ne(idx, padding_idx), out, 0.0)
    return out


def _scatter_reduce_vectors(a: dict) -> Any:
    """scatter_reduce (graph networks' sum / mean / max aggregation). sum: every destination RN(exact Σ of its
    sources, plus self with include_self) (carbon.scatter_add), untouched destinations keep self; mean:
    RN(RN(that exact sum) / n), n the number of terms; amax / amin select (torch's own); prod raises (its
    value depends on the order of the products). Integer tensors run as torch's."""
    x, dim, index, src, reduce = a["self"], a["dim"], a["index"], a["src"], a["reduce"]
    include_self = a.get("include_self", True)
    if not x.is_floating_point() or reduce in ("amax", "amin"):
        return PASS
    _need_carbon_dtype("scatter_reduce", x, src)
    if reduce not in ("sum", "mean"):
        raise NotCovered(f"scatter_reduce with reduce={reduce!r} (the product's rounding depends on its order)")
    index = index.contiguous()
    src = src[tuple(slice(0, n) for n in index.shape)].contiguous()  # torch reads src only where index is
    base = x if include_self else aten.zeros_like(x)
    total = carbon_ops.scatter_add(base.contiguous(), dim, index, src)
    counts = aten.scatter_add(aten.zeros_like(x, dtype=torch.int64), dim, index, aten.ones_like(index))
    touched = aten.gt(counts, 0)
    if reduce == "mean":
        n = aten.add(counts, 1) if include_self else counts
        total = _quotient_by_count(total, n)
    return aten.where(touched, total, x)


_scatter_reduce = _zero_dim_as_vector(_scatter_reduce_vectors, ("self", "index", "src"))


def _index_reduce(a: dict) -> Any:
    """index_reduce as scatter_reduce with the index spread along `dim` (mean / amax / amin; prod raises)."""
    x, dim, index, src = a["self"], a["dim"], a["index"], a["source"]
    d = dim % max(x.dim(), 1)
    shape = [src.shape[k] if k == d else 1 for k in range(src.dim())]
    spread = index.reshape(shape).expand(src.shape)
    return _scatter_reduce({"self": x, "dim": d, "index": spread, "src": src, "reduce": a["reduce"],
                            "include_self": a.get("include_self", True)})


def _bincount(a: dict) -> Any:
    """bincount with floating-point weights: every bin RN(exact Σ of its weights) (carbon.index_add into
    zeros); the length max(x) + 1 (at least minlength) is read on the host, as torch does. Without weights
    (integer counts) torch's own."""
    x, w, minlength = a["self"], a.get("weights"), a.get("minlength", 0)
    if w is None or not w.is_floating_point():
        return PASS
    _need_carbon_dtype("bincount", w)
    size = max(int(minlength), int(x.max()) + 1 if x.numel() else 0)
    return carbon_ops.index_add(aten.zeros([size], dtype=w.dtype, device=w.device), 0, x.to(torch.int64), w.contiguous())


def _histc(a: dict) -> Tensor:
    """histc: bin ⌊(x − lo)·bins / (hi − lo)⌋ in binary64 (each operation rounded; x = hi in the last bin),
    values outside [lo, hi] and NaN not counted; lo = hi = 0 takes the data's minimum and maximum (read on
    the host, as torch does). Counts are exact."""
    x, bins = a["self"], int(a.get("bins", 100))
    lo, hi = float(a.get("min", 0)), float(a.get("max", 0))
    _need_carbon_dtype("histc", x)
    if lo == hi == 0 and x.numel():
        finite = x[aten.logical_not(aten.isnan(x))]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 0.0)
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    v = x.reshape([-1]).double()
    inside = aten.logical_and(aten.ge(v, lo), aten.le(v, hi))
    k = aten.floor(true_divide(aten.mul(aten.sub(v, lo), float(bins)), hi - lo))  # a quotient on CUDA too
    k = aten.clamp(aten.where(inside, k, 0.0), 0, bins - 1).to(torch.int64)
    counts = aten.zeros([bins], dtype=torch.int64, device=x.device).index_add_(0, k, inside.to(torch.int64))
    return counts.to(x.dtype)


def _allclose(a: dict) -> bool:
    """all(isclose): |x − y| ≤ atol + rtol·|y| as torch's separate kernels, each operation one rounding."""
    return bool(aten.all(aten.isclose(a["self"], a["other"], a.get("rtol", 1e-5), a.get("atol", 1e-8),
                                      a.get("equal_nan", False))))


def _last_writers(index: Tensor, size: int) -> Tensor:
    """For every destination 0 … size − 1 along index's last dimension, the largest position that names it
    (−1 where none does): scatter_reduce amax, exact and order-free. Copies then let the last write win,
    where torch leaves the winner of repeated indices unspecified (and CUDA's varies)."""
    index = index.to(torch.int64).contiguous()
    positions = aten.arange(index.shape[-1], device=index.device, dtype=torch.int64).expand(index.shape).contiguous()
    empty = aten.full(list(index.shape[:-1]) + [size], -1, dtype=torch.int64, device=index.device)
    return aten.scatter_reduce(empty, index.dim() - 1, index, positions, "amax", include_self=True)


def _last_equal_positions(keys: Tensor) -> Tensor:
    """For each entry of a 1-d key tensor, the largest position holding an equal key: a stable sort groups
    equal keys in position order, and each group's last entry is its winner. Memory and time grow with the
    number of keys only (not with the range they index)."""
    n = keys.numel()
    sorted_keys, order = aten.sort.stable(keys, stable=True)
    positions = aten.arange(n, device=keys.device, dtype=torch.int64)
    is_last = aten.cat([aten.ne(sorted_keys[1:], sorted_keys[:-1]),
                        aten.ones([min(n, 1)], dtype=torch.bool, device=keys.device)])
    # the first group end at or after each sorted position: a running minimum from the right
    ends = aten.flip(aten.cummin(aten.flip(aten.where(is_last, positions, n), [0]), 0)[0], [0])
    winner_sorted = aten.gather(order, 0, ends)
    return aten.scatter(aten.empty_like(order), 0, order, winner_sorted)  # order is a permutation


def _scatter(a: dict) -> Any:
    """scatter(self, dim, index, src) with a rule for repeated indices along dim: the last write wins (the
    largest position along dim; torch's CPU kernel writes in that order, CUDA's winner varies). Every write
    to a destination is given its writer's value (_last_equal_positions over (fiber, index) keys), so torch's
    scatter gives the same result in any order. A scalar value writes the same everywhere: torch's scatter as
    it is."""
    if "reduce" in a:
        raise NotCovered(_enable_allow.SCATTER_REDUCE)
    x, index, src = a["self"], a["index"], a.get("src")
    if not isinstance(src, Tensor) or x.dim() == 0 or index.dim() == 0 or not -x.dim() <= a["dim"] < x.dim():
        return PASS  # nothing to repeat, or torch's own error
    d = a["dim"] % x.dim()
    if index.shape[d] <= 1 or index.numel() == 0 or index.dim() != x.dim() or src.dim() != x.dim():
        return PASS  # no repeats possible (or torch's own shape error)
    if any(index.shape[k] > src.shape[k] or (k != d and index.shape[k] > x.shape[k]) for k in range(x.dim())):
        return PASS  # torch's own shape error
    if index.device.type == "cpu" and not bool(aten.all(aten.logical_and(aten.ge(index, 0), aten.lt(index, x.shape[d])))):
        return PASS  # out of range: torch's own error
    along_last = aten.movedim(index, d, -1).contiguous()
    width = along_last.shape[-1]
    flat = along_last.reshape([-1]).to(torch.int64)
    fiber = aten.div(aten.arange(flat.numel(), device=flat.device, dtype=torch.int64), width, rounding_mode="floor")
    winner = aten.remainder(_last_equal_positions(aten.add(aten.mul(fiber, x.shape[d]), flat)), width)
    values = aten.gather(aten.movedim(src, d, -1), -1, winner.reshape(along_last.shape))
    return WithArguments(src=aten.movedim(values, -1, d))


def _max_unpool(spatial: int) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        """max_unpool: every value copied to its index in a zero plane; where indices repeat (overlapping
        pooling windows) the last write wins, as for index_copy (torch leaves it unspecified)."""
        x, idx, size = a["self"], a["indices"], [int(v) for v in a["output_size"]][-spatial:]
        lead = list(x.shape[:-spatial])
        planes, area = math.prod(lead), math.prod(size)
        writer = _last_writers(idx.reshape([planes, -1]), area)
        values = aten.gather(x.reshape([planes, -1]), 1, aten.clamp_min(writer, 0))
        out = aten.where(aten.ge(writer, 0), values, aten.zeros([], dtype=x.dtype, device=x.device))
        return out.reshape(lead + size)
    return handler


# ---- selections with a rule for equal values ------------------------------------------------------------------
# Which of several equal elements a sort, topk, median or kthvalue returns is torch's device-specific choice
# (unstable sorts, different selection algorithms), and with it the index and, for −0 and +0, the value's bits.
# Under carbon.enable equal elements keep their index order: a stable sort; a median or k-th value is the first
# element along the dimension that equals torch's value (NaN matches NaN), its own value and index.

def _into_outs(a: dict, *results: Tensor, names: tuple = ("values", "indices")) -> tuple:
    """A result of several tensors, written into the out= tensors of the overloads that have them (named `names`:
    values / indices, Q / R, LU / pivots / info, …). (An overload with a single `out` needs nothing here:
    carbon.enable's dispatch copies into it.)"""
    outs = [a.get(n) for n in names]
    if all(isinstance(t, Tensor) for t in outs):
        for out, t in zip(outs, results):
            out.resize_(t.shape).copy_(t)
        return tuple(outs)
    return results


def _stable_sort(x: Tensor, dim: int, descending: bool) -> tuple:
    return aten.sort.stable(x, stable=True, dim=dim, descending=descending)


def _sort(a: dict) -> Any:
    """sort: stable (equal elements in index order; NaN sorts above +∞ as in torch)."""
    return _into_outs(a, *_stable_sort(a["self"], a.get("dim", -1), a.get("descending", False)))


def _argsort(a: dict) -> Tensor:
    return _stable_sort(a["self"], a.get("dim", -1), a.get("descending", False))[1]


def _msort(a: dict) -> Tensor:
    return _stable_sort(a["self"], 0, False)[0]


def _topk(a: dict) -> Any:
    """topk: the first k of the stable sort (largest: descending), always sorted (torch's order is unspecified
    with sorted=False)."""
    x, k, dim = a["self"], a["k"], a.get("dim", -1)
    if x.dim() == 0 or not -x.dim() <= dim < x.dim() or not 0 <= k <= x.shape[dim]:
        return PASS  # torch's own result or error
    values, indices = _stable_sort(x, dim, a.get("largest", True))
    return _into_outs(a, values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous())


def _first_equal(x: Tensor, value: Tensor, dim: int, keepdim: bool) -> tuple:
    """The first element along dim equal to value (kept dim; NaN equals NaN): (its value, its index)."""
    match = aten.logical_or(aten.eq(x, value), aten.logical_and(aten.isnan(x), aten.isnan(value)))
    index = aten.argmax(match.to(torch.uint8), dim, True)  # argmax returns the first maximum on every device
    chosen = aten.gather(x, dim, index)
    return (chosen, index) if keepdim else (chosen.squeeze(dim), index.squeeze(dim))


def _order_statistic(op: str) -> Callable[[dict], Any]:
    def handler(a: dict) -> Any:
        x = a["self"]
        if "dim" not in a:  # median(x) / nanmedian(x): one value over all elements
            if x.numel() == 0:
                return PASS
            flat = x.reshape(-1)
            return _first_equal(flat, getattr(aten, op)(flat, 0, True)[0], 0, False)[0]
        dim = a["dim"]
        if x.dim() == 0 or not -x.dim() <= dim < x.dim() or x.shape[dim] == 0:
            return PASS  # torch's own result or error
        extra = [a["k"]] if op == "kthvalue" else []
        value = getattr(aten, op)(x, *extra, dim, True)[0]
        return _into_outs(a, *_first_equal(x, value, dim, a.get("keepdim", False)))
    return handler


def _mode(a: dict) -> Any:
    """mode: the most frequent value along dim (−0 and +0 one value; NaN ≠ NaN, so each NaN counts once, as in
    torch's kernels), the smallest of equally frequent ones (NaN largest); its index the last position holding
    an element equal to it (NaN matching NaN there), and that element's own bits. From a stable sort: runs of
    equal values, the first position where a run's running count is largest."""
    x, dim, keepdim = a["self"], a.get("dim", -1), a.get("keepdim", False)
    if x.dim() == 0 or not -x.dim() <= dim < x.dim() or x.shape[dim] == 0:
        return PASS  # torch's own result or error
    d = dim % x.dim()
    v = aten.movedim(_stable_sort(x, d, False)[0], d, -1)
    n = v.shape[-1]
    same = aten.eq(v[..., 1:], v[..., :-1])
    starts = aten.cat([aten.ones_like(same[..., :1]), aten.logical_not(same)], -1)
    positions = aten.arange(n, device=x.device, dtype=torch.int64).expand(v.shape)
    run_start = aten.cummax(aten.where(starts, positions, 0), -1)[0]
    best = aten.argmax(aten.sub(positions, run_start), -1, True)  # the first position of the largest count
    value = aten.movedim(aten.gather(v, -1, best), -1, d)
    match = aten.logical_or(aten.eq(x, value), aten.logical_and(aten.isnan(x), aten.isnan(value)))
    shape = [x.shape[k] if k == d else 1 for k in range(x.dim())]
    along = aten.arange(x.shape[d], device=x.device, dtype=torch.int64).reshape(shape)
    index = aten.amax(aten.where(match, along, -1), [d], True)
    chosen = aten.gather(x, d, index)
    if not keepdim:
        chosen, index = chosen.squeeze(d), index.squeeze(d)
    return _into_outs(a, chosen, index)


def _running_extreme(op: str) -> Callable[[dict], Any]:
    """cummax / cummin: torch's running values; each position's index the last one so far holding an element
    equal to its running value (NaN equals NaN) — torch's CPU rule (it updates on >=) — and the value that
    element's own bits (±0)."""
    def handler(a: dict) -> Any:
        x, dim = a["self"], a["dim"]
        if x.dim() == 0 or x.numel() == 0 or not -x.dim() <= dim < x.dim():
            return PASS  # torch's own result or error
        running = getattr(aten, op)(x, dim)[0]
        match = aten.logical_or(aten.eq(x, running), aten.logical_and(aten.isnan(x), aten.isnan(running)))
        shape = [x.shape[d] if d == dim % x.dim() else 1 for d in range(x.dim())]
        positions = aten.arange(x.shape[dim], device=x.device, dtype=torch.int64).reshape(shape)
        index = aten.cummax(aten.where(match, positions, -1), dim)[0]
        return _into_outs(a, aten.gather(x, dim, index), index)
    return handler


def _index_copy(a: dict) -> Tensor:
    """index_copy with a deterministic rule for duplicate indices: the last write wins (torch leaves it
    unspecified, and CUDA's winner varies). Each destination's writer is the largest position naming it
    (scatter_reduce amax, exact); destinations nobody names keep their values. A copy: no rounding."""
    x, dim, index, src = a["self"], a["dim"], a["index"], a["source"]
    if x.dim() == 0:
        return src.clone().reshape(x.shape) if index.numel() else x.clone()
    d = dim % x.dim()
    writer = _last_writers(index.reshape([-1]), x.shape[d])
    rows = aten.index_select(src.reshape(src.shape if src.dim() else [1]), d, aten.clamp_min(writer, 0))
    shape = [x.shape[d] if k == d else 1 for k in range(x.dim())]
    return aten.where(aten.ge(writer, 0).reshape(shape), rows, x)


def _embedding_renorm(a: dict) -> Tensor:
    """nn.Embedding(max_norm=…): every referenced row whose p-norm (p = 2: RN(√RN(exact Σ x²)); 1: RN(exact
    Σ|x|); ∞: max|x|) exceeds max_norm becomes RN(row·RN32(max_norm / (norm + 10⁻⁷))), the quotient and sum in
    binary64 (torch's CPU rule). Rows referenced twice get the same value twice."""
    w, idx, max_norm, p = a["self"], a["indices"].reshape([-1]), float(a["max_norm"]), float(a["norm_type"])
    _need_carbon_dtype("embedding_renorm_", w)
    rows = aten.index_select(w, 0, idx)
    if p == 2.0:
        norms = _norm_over_dims(rows, [1], False)
    elif p == 1.0:
        norms = carbon_ops.sum(aten.abs(rows).contiguous(), [1], False, None)
    elif p == math.inf:
        norms = aten.amax(aten.abs(rows), [1])
    else:
        raise NotCovered(f"embedding max_norm with norm_type {p}")
    scale = aten.div(max_norm, aten.add(norms.double(), 1e-7)).to(w.dtype)
    renormed = aten.where(aten.gt(norms.double(), max_norm).unsqueeze(1), aten.mul(rows, scale.unsqueeze(1)), rows)
    return aten.index_copy(w, 0, idx, renormed)


def _renorm(a: dict) -> Tensor:
    """torch.renorm: each slice along ``dim`` whose p-norm exceeds maxnorm is scaled by maxnorm / (norm + 10⁻⁷),
    torch's steps in float32 (its accumulation type): norm = RN32 of ‖slice‖_p (linalg_vector_norm's route over
    the slice's float32 values), f = RN32(m / RN32(norm + RN32(10⁻⁷))) with m = RN32(maxnorm) where norm > m, else
    1; f rounded to x's dtype; out = RN(x·f)."""
    x, p, dim, maxnorm = a["self"], float(a["p"]), a["dim"], float(a["maxnorm"])
    _need_carbon_dtype("renorm", x)
    aten.renorm(x.to("meta"), p, dim, maxnorm)  # torch's own argument checks and errors
    d = dim % x.dim()
    dims = [k for k in range(x.dim()) if k != d]
    norm = _vector_norm({"self": x.to(torch.float32), "ord": p, "dim": dims, "keepdim": True})
    m = aten.full_like(norm, maxnorm)  # RN32(maxnorm)
    scale = aten.div(m, aten.add(norm, 1e-7))
    factor = aten.where(aten.gt(norm, m), scale, aten.ones_like(norm)).to(x.dtype)
    return aten.mul(x, factor)


def _embedding_backward(a: dict) -> Tensor:
    return carbon_ops.embedding_backward(a["grad_output"], a["indices"], a["num_weights"], a["padding_idx"])


def _col2im(a: dict) -> Tensor:
    """F.fold (and F.unfold's backward): every output position RN(exact Σ of the column entries that land on
    it) (+0 where none does), one carbon.index_add over all positions; entries landing in the padding are
    dropped. The index arithmetic depends only on the shapes, so it is done on the host once per shape
    (_shape_constant keeps the device copy)."""
    cols = a["self"]
    _need_carbon_dtype("col2im", cols)
    h, w = [int(v) for v in a["output_size"]]
    (kh, kw), (dh, dw) = _pool_pair(a["kernel_size"]), _pool_pair(a["dilation"])
    (ph, pw), (sh, sw) = _pool_pair(a["padding"]), _pool_pair(a["stride"])
    batched = cols if cols.dim() == 3 else cols.unsqueeze(0)
    n, ck, length = batched.shape
    if ck % (kh * kw):
        raise RuntimeError(f"col2im: expected size of input's dimension 1 to be divisible by the product of "
                           f"kernel_size, but got input.size(1)={ck} and kernel_size=({kh}, {kw})")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh * ow != length:
        raise RuntimeError(f"col2im: given output_size=({h}, {w}) and the other arguments, expected "
                           f"{oh * ow} blocks in input's dimension 2, but got {length}")
    c = ck // (kh * kw)

    def positions() -> tuple:  # (destination, source) of every column entry that lands inside, on the host
        ki, kj, li, lj = torch.meshgrid(torch.arange(kh), torch.arange(kw), torch.arange(oh), torch.arange(ow),
                                        indexing="ij")
        y, x = li * sh - ph + ki * dh, lj * sw - pw + kj * dw  # [kh, kw, oh, ow]
        inside = ((y >= 0) & (y < h) & (x >= 0) & (x < w)).reshape(-1)
        dest = (torch.arange(c).reshape(c, 1) * (h * w) + (y * w + x).reshape(1, -1))[:, inside].reshape(-1)
        src = (torch.arange(c).reshape(c, 1) * (kh * kw * length) + torch.nonzero(inside).reshape(1, -1)).reshape(-1)
        return dest, src
    key = ("col2im", c, h, w, kh, kw, dh, dw, ph, pw, sh, sw)
    built: List[tuple] = []

    def part(i: int) -> Callable[[], Tensor]:
        def make() -> Tensor:
            if not built:
                built.append(positions())
            return built[0][i]
        return make
    dest = _shape_constant(key + ("destinations",), cols.device, part(0))
    src = _shape_constant(key + ("sources",), cols.device, part(1))
    values = aten.index_select(batched.reshape(n, ck * length), 1, src)  # [N, M]
    out = carbon_ops.index_add(aten.zeros([c * h * w, n], dtype=cols.dtype, device=cols.device), 0,
                               dest, aten.t(values).contiguous())
    out = aten.t(out).reshape(n, c, h, w).contiguous()
    return out if cols.dim() == 3 else out.squeeze(0)


def _remainder(a: dict) -> Any:
    """Python's modulo, torch's formula with each step one exact or correctly rounded operation:
    m = FMOD(x, y) (exact), then m + y where m ≠ 0 and m, y have opposite signs (one rounding), in float32
    for bfloat16 / float16 (torch's compute type; a Python number rounded to it) and rounded once at the end."""
    x, y = a["self"], a["other"]
    if not _any_float(x, y):
        return PASS
    ref = x if isinstance(x, Tensor) else y
    _need_carbon_dtype("remainder", *[v for v in (x, y) if isinstance(v, Tensor)])
    out_dtype = torch.result_type(x, y)
    compute = _opmath(out_dtype)
    xs = x.to(compute) if isinstance(x, Tensor) else torch.full([], x, dtype=compute, device=ref.device)
    ys = y.to(compute) if isinstance(y, Tensor) else torch.full([], y, dtype=compute, device=ref.device)
    m = aten.fmod(xs, ys)
    fix = aten.logical_and(aten.ne(m, 0), aten.ne(aten.lt(m, 0), aten.lt(ys, 0)))
    return aten.where(fix, aten.add(m, ys), m).to(out_dtype)


def _logaddexp(a: dict) -> Tensor:
    """torch's formula, each step one rounding or a carbon function: x where x = y = ±∞, else
    RN(max(x, y) + LOG1P(EXP(−|RN(x − y)|))), in float32 for bfloat16 / float16, rounded once at the end."""
    x, y = a["self"], a["other"]
    _need_carbon_dtype("logaddexp", x, y)
    out_dtype = torch.result_type(x, y)
    compute = _opmath(out_dtype)
    xs, ys = x.to(compute), y.to(compute)
    tail = carbon_ops.log1p(carbon_ops.exp(aten.neg(aten.abs(aten.sub(xs, ys)))))
    r = aten.add(aten.maximum(xs, ys), tail)
    both_inf = aten.logical_and(aten.isinf(xs), aten.eq(xs, ys))
    return aten.where(both_inf, xs, r).to(out_dtype)


def _logaddexp2(a: dict) -> Tensor:
    """torch's formula, each step one rounding or a carbon function: x where x = y = ±∞, else
    RN(max(x, y) + RN(LOG1P(EXP2(−|RN(x − y)|))·RN(1/ln 2))), in float32 for bfloat16 / float16, rounded once
    at the end."""
    x, y = a["self"], a["other"]
    _need_carbon_dtype("logaddexp2", x, y)
    out_dtype = torch.result_type(x, y)
    compute = _opmath(out_dtype)
    xs, ys = x.to(compute), y.to(compute)
    inv_ln2 = float(torch.tensor(1.0 / math.log(2.0), dtype=compute))
    tail = aten.mul(carbon_ops.log1p(carbon_ops.exp2(aten.neg(aten.abs(aten.sub(xs, ys))))), inv_ln2)
    r = aten.add(aten.maximum(xs, ys), tail)
    both_inf = aten.logical_and(aten.isinf(xs), aten.eq(xs, ys))
    return aten.where(both_inf, xs, r).to(out_dtype)


def _dist(a: dict) -> Tensor:
    """torch.dist(x, y, p): the vector-norm route (any p > 0, or ∞) of RN(x − y) (one rounding per element)."""
    p = a.get("p", 2)
    return _vector_norm({"self": aten.sub(a["self"], a["other"]), "ord": 2 if p is None else p, "dim": None,
                         "keepdim": False, "dtype": None})


# spatial transformers (affine_grid, grid_sample): carbon/_enable_grid_sample.py, registered below


# complex numbers: carbon/_enable_complex.py (registered below); scatter's rule for repeated indices is the same
COMPLEX_ROUTES: Dict[str, Callable[[dict], Any]] = {"scatter": _scatter}

def _nms(a: dict) -> Tensor:
    """torchvision.ops.nms with torchvision's CPU rule, every step spelled out in float32 so that no device
    contracts it into fmas: boxes by decreasing score (stable: ties by index), area = RN(RN(x₂ − x₁)·RN(y₂ − y₁)),
    intersection RN(max(RN(min x₂ − max x₁), 0)·max(RN(min y₂ − max y₁), 0)), IoU = RN(inter / RN(RN(areaᵢ +
    areaⱼ) − inter)) compared with the threshold in binary64; greedily, a kept box suppresses every later box
    whose IoU with it exceeds the threshold. The suppression matrix is read on the host (as torchvision's CUDA
    kernel does)."""
    boxes, scores, threshold = a["dets"], a["scores"], float(a["iou_threshold"])
    if boxes.numel() == 0:
        return aten.empty([0], dtype=torch.int64, device=boxes.device)
    b = boxes.to(torch.float32)
    order = aten.sort.stable(scores, stable=True, dim=0, descending=True)[1]
    b = aten.index_select(b, 0, order)
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    area = aten.mul(aten.sub(x2, x1), aten.sub(y2, y1))
    w = aten.clamp_min(aten.sub(aten.minimum(x2.unsqueeze(1), x2.unsqueeze(0)), aten.maximum(x1.unsqueeze(1), x1.unsqueeze(0))), 0)
    h = aten.clamp_min(aten.sub(aten.minimum(y2.unsqueeze(1), y2.unsqueeze(0)), aten.maximum(y1.unsqueeze(1), y1.unsqueeze(0))), 0)
    inter = aten.mul(w, h)
    union = aten.sub(aten.add(area.unsqueeze(1), area.unsqueeze(0)), inter)
    over = aten.gt(aten.div(inter, union).double(), threshold).cpu()
    keep, suppressed = [], torch.zeros(over.shape[0], dtype=torch.bool)
    for i in range(over.shape[0]):
        if not bool(suppressed[i]):
            keep.append(i)
            suppressed[i + 1:] |= over[i, i + 1:]
    return aten.index_select(order, 0, torch.tensor(keep, dtype=torch.int64, device=boxes.device))


class _RoiSamples:
    """torchvision's RoIAlign sampling points, in binary64 (torchvision computes them in the input's type):
    per roi k, bin (ph, pw) and sample (iy, ix): y = start_h + ph·bin_h + (iy + ½)·bin_h / grid_h (x likewise),
    start = box·scale − (½ if aligned), bin = size / pooled with size = end − start (at least 1 unless
    aligned); a sample with y < −1, y > H, x < −1 or x > W reads nothing (weight 0, still counted); otherwise
    y = max(y, 0), y_low = ⌊y⌋, y_high = y_low + 1 (both H − 1 at the last row, where y = H − 1). Weights
    RN32 of the binary64 products of hy = 1 − ly, ly = y − y_low and the same for x."""

    def __init__(self, rois: Tensor, scale: float, pooled: tuple, grid: tuple, aligned: bool, h: int, w: int) -> None:
        r = rois.double()
        self.width = w
        offset = 0.5 if aligned else 0.0
        start = [aten.sub(aten.mul(r[:, 2], scale), offset), aten.sub(aten.mul(r[:, 1], scale), offset)]
        end = [aten.sub(aten.mul(r[:, 4], scale), offset), aten.sub(aten.mul(r[:, 3], scale), offset)]
        self.axes = []
        for d, (size_px, n_bins, n_grid) in enumerate(zip((h, w), pooled, grid)):
            length = aten.sub(end[d], start[d])
            if not aligned:
                length = aten.clamp_min(length, 1.0)
            bin_size = true_divide(length, float(n_bins))  # not CUDA's length·RN(1/n) for a number divisor
            p = torch.arange(n_bins, dtype=torch.float64, device=r.device).reshape(1, n_bins, 1)
            i = torch.arange(n_grid, dtype=torch.float64, device=r.device).reshape(1, 1, n_grid) + 0.5
            b = bin_size.reshape(-1, 1, 1)
            c = aten.add(aten.add(start[d].reshape(-1, 1, 1), aten.mul(p, b)), true_divide(aten.mul(i, b), float(n_grid)))
            outside = aten.logical_or(aten.lt(c, -1.0), aten.gt(c, float(size_px)))
            c = aten.clamp_min(c, 0.0)
            low = aten.floor(c)
            last = aten.ge(low, size_px - 1)
            low = aten.where(last, float(size_px - 1), low)
            c = aten.where(last, low, c)
            high = aten.where(last, low, aten.add(low, 1.0))
            frac = aten.sub(c, low)
            self.axes.append((low.to(torch.int64), high.to(torch.int64), aten.rsub(frac, 1.0), frac, outside))

    def corners(self) -> list:
        """[(flat position [K, PH, GH, PW, GW], float32 weight)] for the four corners, torchvision's order."""
        (yl, yh, hy, ly, yo), (xl, xh, hx, lx, xo) = self.axes
        outside = aten.logical_or(yo.unsqueeze(-1).unsqueeze(-1), xo.unsqueeze(1).unsqueeze(1))
        out = []
        for ya, wy in ((yl, hy), (yh, ly)):
            for xa, wx in ((xl, hx), (xh, lx)):
                pos = aten.add(aten.mul(ya, self.width).unsqueeze(-1).unsqueeze(-1), xa.unsqueeze(1).unsqueeze(1))
                wt = aten.mul(wy.unsqueeze(-1).unsqueeze(-1), wx.unsqueeze(1).unsqueeze(1)).to(torch.float32)
                out.append((pos, aten.where(outside, 0.0, wt)))
        return out


def _roi_groups(a: dict, rois: Tensor, pooled: tuple) -> list:
    """[(rois of the group as an index tensor, or None for all, (grid_h, grid_w))]: one group with a fixed
    sampling_ratio; with adaptive sampling each box's grid is ⌈length / pooled⌉ per dimension (the binary64
    lengths of _RoiSamples), boxes grouped by grid. Adaptive sampling reads the boxes on the host, so it is
    covered for CPU boxes only (on CUDA it would synchronize)."""
    ratio = a["sampling_ratio"]
    if ratio > 0:
        return [(None, (ratio, ratio))]
    if rois.device.type != "cpu":
        raise NotCovered("roi_align with adaptive sampling (sampling_ratio <= 0) on CUDA: the grid depends on "
                         "the boxes, which would have to be read on the host")
    r = rois.double()
    scale, offset = float(a["spatial_scale"]), 0.5 if a["aligned"] else 0.0
    grids = []
    for lo, hi, n in ((2, 4, pooled[0]), (1, 3, pooled[1])):
        length = (r[:, hi] * scale - offset) - (r[:, lo] * scale - offset)
        if not a["aligned"]:
            length = length.clamp_min(1.0)
        grids.append(torch.ceil(length / n).to(torch.int64).tolist())
    groups: Dict[tuple, list] = {}
    for k, grid in enumerate(zip(*grids)):
        groups.setdefault(grid, []).append(k)
    return [(torch.tensor(ks, dtype=torch.int64), grid) for grid, ks in groups.items()]


def _roi_align(a: dict) -> Tensor:
    """torchvision.ops.roi_align: per sample RN(RN(RN(RN(w₁·v₁) + RN(w₂·v₂)) + RN(w₃·v₃)) + RN(w₄·v₄)) in float32
    (_RoiSamples), each bin RN(exact Σ of its samples / their number) (carbon.mean), +0 for a box whose grid
    is empty; rounded to the input's dtype at the end."""
    x, rois = a["input"], a["rois"]
    _need_carbon_dtype("roi_align", x, rois)
    ph, pw = a["pooled_height"], a["pooled_width"]
    n, c, h, w = x.shape
    k = rois.shape[0]
    groups = _roi_groups(a, rois, (ph, pw))
    if k == 0:
        return aten.zeros([0, c, ph, pw], dtype=x.dtype, device=x.device)
    out = aten.zeros([k, c, ph, pw], dtype=torch.float32, device=x.device)
    for members, (gh, gw) in groups:
        if gh * gw == 0:
            continue
        sub = rois if members is None else aten.index_select(rois, 0, members.to(rois.device))
        part = _roi_align_fixed(x, sub, float(a["spatial_scale"]), (ph, pw), (gh, gw), a["aligned"])
        if members is None:
            return part.to(x.dtype)
        out = aten.index_copy(out, 0, members.to(x.device), part)
    return out.to(x.dtype)


def _roi_align_fixed(x: Tensor, rois: Tensor, scale: float, pooled: tuple, grid: tuple, aligned: bool) -> Tensor:
    n, c, h, w = x.shape
    (ph, pw), (gh, gw), k = pooled, grid, rois.shape[0]
    corners = _RoiSamples(rois, scale, pooled, grid, aligned, h, w).corners()
    images = rois[:, 0].to(torch.int64)
    outs = []
    for c0, c1 in _channel_chunks(c, k * ph * gh * pw * gw):  # every output on its own: chunks keep memory small
        planes = aten.index_select(x[:, c0:c1].reshape([n, c1 - c0, h * w]).to(torch.float32), 0, images)
        acc = None
        for pos, wt in corners:
            v = aten.gather(planes, 2, pos.reshape([k, 1, -1]).expand([k, c1 - c0, pos[0].numel()]))
            term = aten.mul(v, wt.reshape([k, 1, -1]))
            acc = term if acc is None else aten.add(acc, term)
        samples = aten.permute(acc.reshape([k, c1 - c0, ph, gh, pw, gw]), [0, 1, 2, 4, 3, 5]).contiguous()
        outs.append(carbon_ops.mean(samples, [4, 5], False, None))
    return aten.cat(outs, 1)


def _channel_chunks(c: int, per_channel: int) -> list:
    step = max(1, (1 << 23) // max(per_channel, 1))
    return [(c0, min(c0 + step, c)) for c0 in range(0, c, step)]


def _roi_align_backward(a: dict) -> Tensor:
    """Every input position RN(exact Σ over the samples reading it of RN(RN(g·w) / count)) (torchvision's order
    of the two operations), over all boxes at once (carbon.index_add)."""
    g, rois = a["grad"], a["rois"]
    ph, pw = a["pooled_height"], a["pooled_width"]
    n, c, h, w = a["batch_size"], a["channels"], a["height"], a["width"]
    k = rois.shape[0]
    groups = [(m, grid) for m, grid in _roi_groups(a, rois, (ph, pw)) if grid[0] * grid[1] > 0]
    if k == 0 or not groups:
        return aten.zeros([n, c, h, w], dtype=g.dtype, device=g.device)
    pieces = []  # (grad rows, grid, corners) per group
    dest = []
    for members, (gh, gw) in groups:
        sub = rois if members is None else aten.index_select(rois, 0, members.to(rois.device))
        gsub = g if members is None else aten.index_select(g, 0, members.to(g.device))
        corners = _RoiSamples(sub, float(a["spatial_scale"]), (ph, pw), (gh, gw), a["aligned"], h, w).corners()
        base = aten.mul(sub[:, 0].to(torch.int64), h * w).reshape([-1, 1, 1, 1, 1])
        dest += [aten.add(pos, base).reshape([-1]) for pos, _ in corners]
        pieces.append((gsub, (gh, gw), corners))
    dest_all = aten.cat(dest)
    parts = []
    for c0, c1 in _channel_chunks(c, dest_all.numel()):  # channels are independent sums
        contrib = []
        for gsub, (gh, gw), corners in pieces:
            kk = gsub.shape[0]
            gb = gsub[:, c0:c1].to(torch.float32).reshape([kk, c1 - c0, ph, 1, pw, 1]).expand(
                [kk, c1 - c0, ph, gh, pw, gw])
            contrib += [aten.movedim(true_divide(aten.mul(gb, wt.unsqueeze(1)), float(gh * gw)), 1, -1)
                        .reshape([-1, c1 - c0]) for _, wt in corners]
        parts.append(carbon_ops.index_add(aten.zeros([n * h * w, c1 - c0], dtype=torch.float32, device=g.device), 0,
                                          dest_all, aten.cat(contrib)))
    total = aten.cat(parts, 1)
    return aten.movedim(total.reshape([n, h * w, c]), 2, 1).reshape([n, c, h, w]).to(g.dtype)


FOREIGN_ROUTES: Dict[str, Callable[[dict], Any]] = {"torchvision.nms": _nms, "torchvision.roi_align": _roi_align,
                                                    "torchvision._roi_align_backward": _roi_align_backward}
"""Ops of other libraries that carbon routes, by "namespace.name"."""


# ---- randomness -------------------------------------------------------------------------------------------------

def _factory(a: dict) -> tuple:
    dtype = a.get("dtype") or torch.get_default_dtype()
    device = a.get("device") or torch.device("cpu")
    return dtype, torch.device(device)


def _uniform_values(size: List[int], low: float, high: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return carbon_ops.uniform.state(list(size), _draw(), float(low), float(high), dtype, device)


def _normal_values(size: List[int], mean: float, std: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return carbon_ops.normal.state(list(size), _draw(), float(mean), float(std), dtype, device)


def _need_random_dtype(op: str, dtype: torch.dtype) -> None:
    if dtype not in _CARBON_DTYPES:
        raise NotCovered(f"{op} in {dtype}: carbon draws float32, bfloat16 and float16")


def _rand(a: dict) -> Tensor:
    dtype, device = _factory(a)
    _need_random_dtype("rand", dtype)
    return _uniform_values(a["size"], 0.0, 1.0, dtype, device)


def _randn(a: dict) -> Tensor:
    dtype, device = _factory(a)
    _need_random_dtype("randn", dtype)
    return _normal_values(a["size"], 0.0, 1.0, dtype, device)


def _integers(size: List[int], low: int, high: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """low + floor(u * (high - low)) with u = k 2^-24 from one uniform draw,
    computed exactly in binary64 (every value is reachable while high - low
    <= 2^24)."""
    n = int(high) - int(low)
    if n <= 0:
        raise ValueError(f"random integers: empty range [{low}, {high})")
    if n > 2 ** 29:
        raise NotCovered(f"random integers over a range of {n} > 2^29 values")
    u = _uniform_values(size, 0.0, 1.0, torch.float32, device).double()
    k = aten.floor(aten.mul(u, float(n)))  # exact: u has 24 bits, n < 2^29
    return aten.add(k.to(torch.int64), int(low)).to(dtype)


def _randint(a: dict) -> Tensor:
    dtype = a.get("dtype") or torch.int64
    device = torch.device(a.get("device") or "cpu")
    return _integers(a["size"], a.get("low", 0), a["high"], dtype, device)


def _randperm(a: dict) -> Tensor:
    n = a["n"]
    device = torch.device(a.get("device") or "cpu")
    keys = carbon_ops.uniform.state([n], _draw(), 0.0, 1.0, torch.float32, device)
    # ties are broken by index (stable sort): the same order on every device
    return aten.sort.stable(keys, stable=True)[1].to(a.get("dtype") or torch.int64)


def _multinomial(a: dict) -> Tensor:
    """Sampling as an exponential race (docs/enable.md): per category i one
    uniform draw u_i (k 2^-24), e_i = -LOG(1 - u_i) (carbon's log; 1 - u_i is
    exact), key_i = RN32(e_i / w_i) (+inf for w_i = 0); the categories in order
    of increasing key, ties by index. Without replacement the first
    num_samples of one race (distributed as sequential sampling without
    replacement); with replacement one race per sample."""
    w, k, replacement = a["self"], a["num_samples"], a.get("replacement", False)
    if a.get("generator") is not None:
        raise NotCovered("multinomial with a torch.Generator: carbon draws from carbon.default_generator "
                         "(seeded by carbon.enable's seed or torch.manual_seed)")
    _need_carbon_dtype("multinomial", w)
    if w.dim() not in (1, 2):
        raise ValueError(f"multinomial: prob_dist must be 1 or 2 dim, got {w.dim()}")
    rows = (w.unsqueeze(0) if w.dim() == 1 else w).to(torch.float32)  # exact widening
    n = rows.shape[1]
    if not replacement and k > n:
        raise RuntimeError("multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if w.device.type == "cpu" and rows.numel() > 0:  # torch's checks; on CUDA they would need a host sync
        if bool(aten.any(aten.logical_or(aten.lt(rows, 0), aten.logical_not(aten.isfinite(rows))))):
            raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` or element < 0")
        if bool(aten.any(aten.eq(aten.amax(rows, [1]), 0))):
            raise RuntimeError("multinomial: invalid multinomial distribution (sum of probabilities <= 0)")
    races = k if replacement else 1
    u = carbon_ops.uniform.state([rows.shape[0], races, n], _draw(), 0.0, 1.0, torch.float32, w.device)
    e = aten.neg(carbon_ops.log(aten.rsub(u, 1.0)))
    weights = rows.unsqueeze(1)
    keys = aten.where(aten.eq(weights, 0), math.inf, aten.div(e, weights))
    if replacement:
        idx = aten.argmin(keys, -1)  # the first of equal minima: ties by index
    else:
        idx = aten.sort.stable(keys, stable=True, dim=-1)[1][:, 0, :k]
    return idx if w.dim() == 2 else idx.squeeze(0)


def _uniform_(a: dict) -> Tensor:
    x = a["self"]
    _need_random_dtype("uniform_", x.dtype)
    return _uniform_values(list(x.shape), a["from"], a["to"], x.dtype, x.device)


def _normal_(a: dict) -> Tensor:
    """normal_ (and every torch.normal overload): one carbon normal draw per element. With a tensor mean or
    std (torch.distributions.Normal(...).sample(), reparameterized policies): RN(RN(n·std) + mean) with n the
    standard draw in the result's dtype, torch's own formula (output.normal_(0, 1).mul_(std).add_(mean)); the
    shape is mean's and std's broadcast, the dtype and device the tensor one's (mean's when both are)."""
    if "self" in a:
        x = a["self"]
        _need_random_dtype("normal_", x.dtype)
        return _normal_values(list(x.shape), a["mean"], a["std"], x.dtype, x.device)
    mean, std = a["mean"], a.get("std", 1.0)
    if "size" in a:  # normal(mean, std, size): a factory
        out = a.get("out")
        dtype, device = (out.dtype, out.device) if isinstance(out, Tensor) else _factory(a)
        _need_random_dtype("normal", dtype)
        return _normal_values(list(a["size"]), mean, std, dtype, device)
    like = mean if isinstance(mean, Tensor) else std  # the result's dtype and device, as torch's
    _need_random_dtype("normal", like.dtype)
    if isinstance(std, Tensor) and std.device.type == "cpu" and std.numel() and bool(aten.lt(std, 0).any()):
        raise RuntimeError("normal expects all elements of std >= 0.0")  # torch's check (on a GPU it would sync)
    if not isinstance(std, Tensor) and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    shape = torch.broadcast_shapes(*[t.shape for t in (mean, std) if isinstance(t, Tensor)])
    n = _normal_values(list(shape), 0.0, 1.0, like.dtype, like.device)
    # torch: output.normal_(0, 1).mul_(std).add_(mean), each in-place step rounded to the output's dtype
    return aten.add(aten.mul(n, std).to(like.dtype), mean).to(like.dtype)


def _exponential_(a: dict) -> Tensor:
    """RN(−LOG(RN(1 − u)) / λ) from one uniform draw u (k·2⁻²⁴) per element, as multinomial's race."""
    x, lambd = a["self"], a.get("lambd", 1.0)
    _need_random_dtype("exponential_", x.dtype)
    u = _uniform_values(list(x.shape), 0.0, 1.0, torch.float32, x.device)
    e = aten.neg(carbon_ops.log(aten.rsub(u, 1.0)))
    return true_divide(e, float(lambd)).to(x.dtype)


def _like(a: dict, values: Callable[[List[int], torch.dtype, torch.device], Tensor],
          default_dtype: Optional[torch.dtype] = None) -> Tensor:
    """A ``*_like`` factory: the draws of the plain factory for self's shape (element i = the i-th element in
    row-major order, whatever self's strides), placed in a tensor laid out as torch's ``*_like`` would be."""
    x = a["self"]
    dtype = a.get("dtype") or default_dtype or x.dtype
    device = torch.device(a.get("device") or x.device)
    out = aten.empty_like(x, dtype=dtype, device=device, memory_format=a.get("memory_format") or torch.preserve_format)
    return out.copy_(values(list(x.shape), dtype, device))


def _rand_like(a: dict) -> Tensor:
    def values(size, dtype, device):
        _need_random_dtype("rand_like", dtype)
        return _uniform_values(size, 0.0, 1.0, dtype, device)
    return _like(a, values)


def _randn_like(a: dict) -> Tensor:
    def values(size, dtype, device):
        _need_random_dtype("randn_like", dtype)
        return _normal_values(size, 0.0, 1.0, dtype, device)
    return _like(a, values)


def _randint_like(a: dict) -> Tensor:
    high = a["high"]
    if isinstance(high, Tensor):
        if high.device.type != "cpu":
            raise NotCovered("randint_like with a device tensor as the bound (reading it would synchronize)")
        high = int(high.item())
    return _like(a, lambda size, dtype, device: _integers(size, a.get("low", 0), high, dtype, device))


def _log_normal_(a: dict) -> Tensor:
    """RN(EXP(n)) with n carbon's normal draw of the given mean and std (float32), one draw per element."""
    x = a["self"]
    _need_random_dtype("log_normal_", x.dtype)
    n = _normal_values(list(x.shape), a.get("mean", 1.0), a.get("std", 2.0), torch.float32, x.device)
    return carbon_ops.exp(n).to(x.dtype)


def _cauchy_(a: dict) -> Tensor:
    """RN(m + RN(σ·TAN(RN(RN32(π)·(u − ½))))) in float32, then x's dtype, from one uniform draw u (k·2⁻²⁴) per
    element: torch's inversion formula median + sigma·tan(π(u − ½)) on carbon's uniforms and tan (u − ½ is
    exact; u = 0 gives −tan(RN32(π)/2) ≈ −2.3e7, finite)."""
    x, median, sigma = a["self"], float(a.get("median", 0.0)), float(a.get("sigma", 1.0))
    _need_random_dtype("cauchy_", x.dtype)
    u = _uniform_values(list(x.shape), 0.0, 1.0, torch.float32, x.device)
    angle = aten.mul(aten.sub(u, 0.5), float(torch.tensor(math.pi, dtype=torch.float32)))
    scaled = aten.mul(carbon_ops.tan(angle), _scalar_like(angle, sigma))
    return aten.add(scaled, _scalar_like(scaled, median)).to(x.dtype)


def _geometric_(a: dict) -> Tensor:
    """max(1, CEIL(RN32(LOG(RN(1 − u)) / LOG1P(RN32(−p))))) from one uniform draw u (k·2⁻²⁴) per element:
    torch's inversion formula on carbon's uniforms, log and log1p (1 − u is exact)."""
    x, p = a["self"], float(a["p"])
    if not 0.0 < p < 1.0:
        raise ValueError(f"geometric_ expects p in (0, 1), got p = {p}")
    u = _uniform_values(list(x.shape), 0.0, 1.0, torch.float32, x.device)
    log_q = carbon_ops.log1p(torch.full([], -p, dtype=torch.float32, device=x.device))
    k = aten.ceil(aten.div(carbon_ops.log(aten.rsub(u, 1.0)), log_q))
    return aten.clamp_min(k, 1.0).to(x.dtype)


def _random_(a: dict) -> Tensor:
    x = a["self"]
    low, high = a.get("from", 0), a.get("to")
    if high is not None:
        return _integers(list(x.shape), low, high, x.dtype, x.device)
    if x.dtype != torch.int64 or a.get("from") not in (None, 0):
        raise NotCovered("random_ without an upper bound on a tensor other than int64")
    # int64 in [0, 2^63): 15 + 24 + 24 bits of three uniform draws (k 2^-24 each, exact)
    parts = [aten.mul(_uniform_values(list(x.shape), 0.0, 1.0, torch.float32, x.device).double(), 2.0 ** 24)
             .to(torch.int64) for _ in range(3)]
    high15 = aten.remainder(parts[0], 2 ** 15)
    return aten.add(aten.add(aten.mul(high15, 2 ** 48), aten.mul(parts[1], 2 ** 24)), parts[2])


def _bernoulli(a: dict) -> Tensor:
    x, p = a["self"], a.get("p")
    state = _draw()
    if isinstance(p, Tensor):
        probs = p.to(torch.float32).expand(x.shape).contiguous()
        return carbon_ops.bernoulli.state(probs, state, None).to(x.dtype)
    probs = x if p is None else aten.empty_like(x, dtype=torch.float32)
    if probs.dtype not in _CARBON_DTYPES:
        probs = probs.to(torch.float32)
    return carbon_ops.bernoulli.state(probs, state, None if p is None else float(p)).to(x.dtype)


def _rrelu(a: dict) -> Any:
    """RReLU. Training: one uniform draw r in [lower, upper) per element (carbon.uniform); x ≤ 0 gives RN(x·r)
    and noise r, else x and noise 1 (noise is written in place, as torch does). Evaluation: leaky ReLU with
    slope RN((lower + upper) / 2)."""
    x, noise, lower, upper = a["self"], a["noise"], float(a.get("lower", 0.125)), float(a.get("upper", 1 / 3))
    _need_random_dtype("rrelu", x.dtype)
    if not a.get("training", False):
        return aten.where(aten.gt(x, 0), x, aten.mul(x, (lower + upper) / 2))
    r = _uniform_values(list(x.shape), lower, upper, x.dtype, x.device)
    negative = aten.le(x, 0)
    noise.copy_(aten.where(negative, r, 1.0))
    return aten.where(negative, aten.mul(x, r), x)


def _rrelu_functional(a: dict) -> tuple:
    noise = aten.clone(a["noise"])
    out = _rrelu({**a, "noise": noise})
    return out, noise


def _rrelu_backward(a: dict) -> Tensor:
    """RN(g·noise) in training (upper − lower > 10⁻⁶), else the leaky-ReLU gradient with the mean slope."""
    g, x, noise = a["grad_output"], a["self"], a["noise"]
    lower, upper = float(a["lower"]), float(a["upper"])
    if a["training"] and upper - lower > 1e-6:
        return aten.mul(g, noise)
    return aten.where(aten.gt(x, 0), g, aten.mul(g, (lower + upper) / 2))


def _native_dropout(a: dict):
    x, p, train = a["input"], a["p"], a["train"]
    if train is False or p == 0:
        return aten.clone(x), aten.ones_like(x, dtype=torch.bool)
    keep = aten.ne(_bernoulli({"self": aten.empty_like(x, dtype=torch.float32), "p": 1.0 - p}), 0)
    return _native_dropout_backward({"grad_output": x, "mask": keep, "scale": 1.0 / (1.0 - p)}), keep


def _native_dropout_backward(a: dict) -> Tensor:
    # (g * mask) * scale: two single roundings
    g = a["grad_output"]
    return aten.mul(aten.mul(g, a["mask"]), a["scale"])


# ---- foreach: the per-tensor ops, one by one ---------------------------------------------------------------------

def _foreach(base: str) -> Callable[[dict], List[Tensor]]:
    """``_foreach_<base>(lists...)`` as the per-tensor ``<base>`` applied to
    each index; list arguments are indexed, other arguments are shared."""
    def handler(a: dict, route: Callable[[str, dict], Any]) -> List[Tensor]:
        n = len(a["self"])
        if isinstance(a.get("scalars"), Tensor):  # a CPU tensor of per-tensor scalars
            a = dict(a, scalars=a["scalars"].tolist())
        if "tensors1" in a:
            a = dict(a)
            a["end" if base == "lerp" else "tensor1"] = a.pop("tensors1")
        out = []
        for i in range(n):
            elem = {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == n and k != "dim" else v)
                    for k, v in a.items()}
            if "scalars" in elem:
                elem["other" if base not in ("addcmul", "addcdiv") else "value"] = elem.pop("scalars")
            if "scalar" in elem:
                elem["other" if base not in ("addcmul", "addcdiv") else "value"] = elem.pop("scalar")
            if "other" in elem and base in ("addcmul", "addcdiv"):
                elem["value"] = elem.pop("other")
            if base == "lerp" and "weights" in elem:
                elem["weight"] = elem.pop("weights")
            if base in ("addcmul", "addcdiv") and "tensor1" not in elem:
                raise NotCovered(f"_foreach_{base} overload")
            out.append(route(base, elem))
        return out
    handler.takes_route = True  # type: ignore[attr-defined]
    return handler


# name -> handler. Keys are aten overload-packet names without a trailing "_".
ROUTES: Dict[str, Callable] = {
    # matmul
    "mm": _mm, "bmm": _bmm, "_grouped_mm": _grouped_mm, "addmm": _addmm, "baddbmm": _baddbmm, "mv": _mv, "dot": _dot, "vdot": _vdot, "addbmm": _addbmm,
    "convolution": _convolution, "convolution_backward": _convolution_backward,
    # reductions
    "sum": _sum, "mean": _mean, "linalg_vector_norm": _vector_norm, "norm": _norm, "_euclidean_dist": _euclidean_dist,
    "_cdist_forward": _cdist_forward, "_cdist_backward": _cdist_backward,
    "_weight_norm_interface": _weight_norm, "_weight_norm_interface_backward": _weight_norm_backward, "_foreach_norm": _foreach_norm,
    # normalization, softmax, losses
    "native_layer_norm": _layer_norm, "native_layer_norm_backward": _layer_norm_backward,
    "_fused_rms_norm": _rms_norm, "_fused_rms_norm_backward": _rms_norm_backward,
    "_softmax": _softmax_like("softmax", carbon_ops.softmax, True),
    "_safe_softmax": _softmax_like("softmax", carbon_ops.softmax, False),
    "_log_softmax": _softmax_like("log_softmax", carbon_ops.log_softmax, True),
    "_softmax_backward_data": _softmax_backward(carbon_ops.softmax_backward),
    "_log_softmax_backward_data": _softmax_backward(carbon_ops.log_softmax_backward),
    "nll_loss_forward": _nll_loss_forward, "nll_loss_backward": _nll_loss_backward,
    "nll_loss2d_forward": _nll_loss2d(_nll_loss_forward), "nll_loss2d_backward": _nll_loss2d(_nll_loss_backward),
    "mse_loss": _mse_loss, "mse_loss_backward": _mse_loss_backward, "logsumexp": _logsumexp,
    "xlogy": _x_times_log("xlogy", carbon_ops.log),
    "special_xlog1py": _x_times_log("special_xlog1py", carbon_ops.log1p), "special_entr": _entr, "angle": _angle,
    "atan2": _two_argument("atan2"), "arctan2": _two_argument("atan2"),
    "hypot": _two_argument("hypot"),
    "smooth_l1_loss": _smooth_l1(False), "smooth_l1_loss_backward": _smooth_l1_backward(False),
    "huber_loss": _smooth_l1(True), "huber_loss_backward": _smooth_l1_backward(True), "nansum": _nansum,
    "trace": _trace, "addmv": _addmv, "logit": _logit, "logit_backward": _logit_backward,
    **{f"{m}_pad{d}d_backward": _pad_backward(m, d) for m in ("reflection", "replication") for d in (1, 2, 3)},
    "binary_cross_entropy_with_logits": _bce_with_logits, "binary_cross_entropy": _bce,
    "binary_cross_entropy_backward": _bce_backward,
    "cumsum": _cumsum, "cumprod": _cumprod, "prod": _prod, "var": _var, "std": _std, "var_mean": _var_mean, "std_mean": _std_mean,
    # elementwise
    "exp": _unary("exp", carbon_ops.exp), "log": _unary("log", carbon_ops.log),
    "tanh": _unary("tanh", carbon_ops.tanh), "sigmoid": _unary("sigmoid", carbon_ops.sigmoid),
    "erf": _unary("erf", carbon_ops.erf), "silu": _unary("silu", carbon_ops.silu),
    "sin": _unary("sin", carbon_ops.sin), "cos": _unary("cos", carbon_ops.cos),
    "log1p": _unary("log1p", carbon_ops.log1p), "expm1": _unary("expm1", carbon_ops.expm1),
    # log2 ... atanh: carbon's functions (§6); their backward is autograd's formula (e.g. g / (x·RN(ln 2)),
    # g·cosh x, g·rsqrt(1 − x²), (√π/2)·exp(erfinv(x)²)·g) from these routes and the routed single operations,
    # as for sin and cos. erfinv_ is torch.nn.init.trunc_normal_'s step in torch 2.11
    **{name: _unary(name, getattr(carbon_ops, name))
       for name in ("log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh",
                    "acosh", "atanh")},
    # the gamma family (§6): log-densities and entropies of Gamma, Beta, Dirichlet, StudentT, Poisson, Binomial;
    # the backward is autograd's formula, g·digamma(x) and g·polygamma(1, x), of these routes
    "lgamma": _unary("lgamma", carbon_ops.lgamma), "digamma": _unary("digamma", carbon_ops.digamma),
    "polygamma": _polygamma, "mvlgamma": _mvlgamma,
    "elu": _elu, "elu_backward": _elu_backward, "celu": _celu, "softplus": _softplus, "softplus_backward": _softplus_backward,
    "log_sigmoid_forward": _log_sigmoid_forward, "log_sigmoid_backward": _log_sigmoid_backward,
    "gelu": _gelu, "gelu_backward": _gelu_backward, "silu_backward": _silu_backward,
    "tanh_backward": _tanh_backward, "sigmoid_backward": _sigmoid_backward,
    # single IEEE operations, spelled out so that no device fuses them
    "add": _add, "sub": _sub, "rsub": _rsub, "div": _div, "true_divide": _div, "floor_divide": _floor_divide,
    "addcmul": _addcmul,
    "addcdiv": _addcdiv, "lerp": _lerp, "pow": _pow, "sqrt": _sqrt, "rsqrt": _rsqrt, "reciprocal": _reciprocal,
    # indexed accumulation
    "index_add": _index_add, "scatter_add": _scatter_add, "index_put": _index_put, "_index_put_impl": _index_put,
    "embedding_dense_backward": _embedding_backward,
    "index_copy": _index_copy, "scatter": _scatter, "softshrink": _softshrink, "frexp": _frexp, "sort": _sort, "argsort": _argsort, "msort": _msort,
    "topk": _topk, "kthvalue": _order_statistic("kthvalue"), "median": _order_statistic("median"),
    "nanmedian": _order_statistic("nanmedian"), "cummax": _running_extreme("cummax"), "mode": _mode,
    "cummin": _running_extreme("cummin"), "embedding_renorm": _embedding_renorm, "renorm": _renorm, "allclose": _allclose,
    "max_unpool2d": _max_unpool(2), "max_unpool3d": _max_unpool(3), "bincount": _bincount, "histc": _histc, "scatter_reduce": _scatter_reduce,
    "index_reduce": _index_reduce,
    "_embedding_bag": _embedding_bag, "_embedding_bag_forward_only": _embedding_bag,
    "_embedding_bag_backward": _embedding_bag_dense_backward,
    "_embedding_bag_dense_backward": _embedding_bag_dense_backward,
    "_embedding_bag_per_sample_weights_backward": _embedding_bag_per_sample_weights_backward,
    "max_pool2d_with_indices_backward": _max_pool_backward(2),
    "max_pool3d_with_indices_backward": _max_pool_backward(3),
    "adaptive_max_pool2d_backward": _max_pool_backward(2), "adaptive_max_pool3d_backward": _max_pool_backward(3),
    **{f"_adaptive_avg_pool{d}d": _adaptive_avg_pool(d) for d in (2, 3)},
    **{f"_adaptive_avg_pool{d}d_backward": _adaptive_avg_pool_backward(d) for d in (2, 3)},
    **{f"avg_pool{d}d": _avg_pool(d) for d in (2, 3)},
    **{f"avg_pool{d}d_backward": _avg_pool_backward(d) for d in (2, 3)},
    **{f"upsample_nearest{d}d_backward": _upsample_nearest_backward for d in (1, 2, 3)},
    "upsample_linear1d": _upsample_linear(1), "upsample_bilinear2d": _upsample_linear(2),
    "upsample_trilinear3d": _upsample_linear(3), "upsample_linear1d_backward": _upsample_linear_backward(1),
    "upsample_bilinear2d_backward": _upsample_linear_backward(2),
    "upsample_trilinear3d_backward": _upsample_linear_backward(3),
    "upsample_bicubic2d": _upsample_linear(2, cubic=True),
    "upsample_bicubic2d_backward": _upsample_linear_backward(2, cubic=True),
    "_upsample_bilinear2d_aa": _upsample_linear(2, antialias=True),
    "_upsample_bilinear2d_aa_backward": _upsample_linear_backward(2, antialias=True),
    "_upsample_bicubic2d_aa": _upsample_linear(2, cubic=True, antialias=True),
    "_upsample_bicubic2d_aa_backward": _upsample_linear_backward(2, cubic=True, antialias=True),
    # folding, modulo, log-add-exp, distance
    "_ctc_loss": _ctc_loss, "_ctc_loss_backward": _ctc_loss_backward,
    "_use_cudnn_ctc_loss": _no_library_ctc_loss, "_use_miopen_ctc_loss": _no_library_ctc_loss,
    "_pdist_forward": _pdist_forward, "_pdist_backward": _pdist_backward, "linalg_cross": _linalg_cross,
    "soft_margin_loss": _soft_margin_loss, "soft_margin_loss_backward": _soft_margin_loss_backward, "sinc": _sinc,

    "col2im": _col2im, "remainder": _remainder, "logaddexp": _logaddexp, "logaddexp2": _logaddexp2, "dist": _dist,
    # piecewise activations
    "hardsigmoid": _hardsigmoid, "hardsigmoid_backward": _hardsigmoid_backward, "hardswish": _hardswish,
    "hardswish_backward": _hardswish_backward, "mish": _mish, "mish_backward": _mish_backward, "glu": _glu,
    "glu_backward": _glu_backward,
    # randomness (carbon.Generator)
    "linspace": _linspace,
    "rand": _rand, "randn": _randn, "randint": _randint, "randperm": _randperm, "uniform": _uniform_,
    "normal": _normal_, "random": _random_, "exponential": _exponential_, "bernoulli": _bernoulli, "multinomial": _multinomial,
    "rand_like": _rand_like, "randn_like": _randn_like, "randint_like": _randint_like, "log_normal": _log_normal_,
    "geometric": _geometric_, "cauchy": _cauchy_,
    "rrelu_with_noise": _rrelu, "rrelu_with_noise_functional": _rrelu_functional,
    "rrelu_with_noise_backward": _rrelu_backward,
    "native_dropout": _native_dropout, "native_dropout_backward": _native_dropout_backward,
    # foreach (torch.optim's multi-tensor paths, grad scaling)
    **{f"_foreach_{b}": _foreach(b) for b in ("add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "pow",
                                            "reciprocal", "rsqrt", "exp", "log")},
}

# routes kept in their own modules (they use the helpers above)
from carbon import _enable_logcumsumexp  # noqa: E402
from carbon import _enable_bessel  # noqa: E402
from carbon import _enable_complex  # noqa: E402
from carbon import _enable_eigh  # noqa: E402
from carbon import _enable_fft  # noqa: E402
from carbon import _enable_grid_sample  # noqa: E402
from carbon import _enable_lu  # noqa: E402
from carbon import _enable_margin  # noqa: E402
from carbon import _enable_matrix_exp  # noqa: E402
from carbon import _enable_qr  # noqa: E402
from carbon import _enable_svd  # noqa: E402
from carbon import _enable_sampler_grads  # noqa: E402
from carbon._enable_qr import linalg_qr as _linalg_qr  # noqa: E402
from carbon._enable_triangular import linalg_cholesky_ex as _linalg_cholesky_ex  # noqa: E402
from carbon._enable_triangular import linalg_solve_triangular as _linalg_solve_triangular  # noqa: E402
from carbon._enable_trilinear import trilinear as _trilinear  # noqa: E402
from carbon._enable_samplers import sample_dirichlet as _sample_dirichlet  # noqa: E402
from carbon._enable_samplers import binomial as _binomial  # noqa: E402
from carbon._enable_samplers import poisson as _poisson  # noqa: E402
from carbon._enable_samplers import standard_gamma as _standard_gamma  # noqa: E402

ROUTES.update({
    # linear algebra, every step pinned down
    "linalg_qr": _linalg_qr, "geqrf": _enable_qr.geqrf,
    "linalg_householder_product": _enable_qr.linalg_householder_product,
    "linalg_solve_triangular": _linalg_solve_triangular, "linalg_cholesky_ex": _linalg_cholesky_ex,
    "linalg_lu_factor_ex": _enable_lu.linalg_lu_factor_ex, "linalg_lu": _enable_lu.linalg_lu,
    "linalg_lu_solve": _enable_lu.linalg_lu_solve, "_linalg_solve_ex": _enable_lu.linalg_solve_ex,
    "linalg_inv_ex": _enable_lu.linalg_inv_ex, "_linalg_det": _enable_lu.linalg_det,
    "_linalg_slogdet": _enable_lu.linalg_slogdet, "cholesky_solve": _enable_lu.cholesky_solve,
    "cholesky_inverse": _enable_lu.cholesky_inverse, "linalg_matrix_exp": _enable_matrix_exp.linalg_matrix_exp,
    "_linalg_eigh": _enable_eigh.linalg_eigh, "_linalg_svd": _enable_svd.linalg_svd,
    "linalg_pinv": _enable_svd.linalg_pinv, "linalg_lstsq": _enable_svd.linalg_lstsq,
    # samplers and their reparameterized gradients
    "_standard_gamma": _standard_gamma, "_sample_dirichlet": _sample_dirichlet, "poisson": _poisson,
    "binomial": _binomial, "_standard_gamma_grad": _enable_sampler_grads.standard_gamma_grad,
    "_dirichlet_grad": _enable_sampler_grads.dirichlet_grad,
    # others
    "_trilinear": _trilinear, "logcumsumexp": _enable_logcumsumexp.logcumsumexp,
    "_logcumsumexp": _enable_logcumsumexp.logcumsumexp, "multi_margin_loss": _enable_margin.multi_margin_loss,
    "multi_margin_loss_backward": _enable_margin.multi_margin_loss_backward,
    "polar": _enable_complex.polar, "addr": _addr, **_enable_bessel.BESSEL,
    # spatial transformers, images and volumes
    "affine_grid_generator": _enable_grid_sample.affine_grid,
    **{name: _enable_grid_sample.grid_sample for name in ("grid_sampler_2d", "_grid_sampler_2d_cpu_fallback",
                                                          "grid_sampler_3d")},
    **{name: _enable_grid_sample.grid_sample_backward for name in ("grid_sampler_2d_backward",
                                                                   "_grid_sampler_2d_cpu_fallback_backward",
                                                                   "grid_sampler_3d_backward")},
    "cudnn_grid_sampler": _enable_grid_sample.cudnn_grid_sampler,
    "cudnn_grid_sampler_backward": _enable_grid_sample.cudnn_grid_sampler_backward,
    # Fourier transforms of real signals, their windows, and overlap-add (istft, Tensor.unfold's gradient)
    "_fft_r2c": _enable_fft.fft_r2c, **_enable_fft.WINDOWS, "unfold_backward": _unfold_backward,
})
COMPLEX_ROUTES.update({"_fft_c2c": _enable_fft.fft_c2c, "_fft_c2r": _enable_fft.fft_c2r,
                       "_fft_r2c": _enable_fft.fft_r2c,  # its complex out= argument brings it here
                       **_enable_complex.COMPLEX})
