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
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor

import carbon.random
from carbon._autograd import _norm_backward
from carbon._conv import _columns as conv_columns
from carbon._conv import (conv_backward, conv_forward, conv_transpose_backward, conv_transpose_forward,
                          conv_transpose_size)

__all__ = ["ROUTES", "PASS", "NotCovered"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

_CARBON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

PASS = object()
"""A handler's answer for arguments the op is already exact for (integer
tensors, say): run torch's own op."""


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


def _opmath(t: Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def sqrt_rn(x: Tensor) -> Tensor:
    """The correctly rounded square root in x's dtype, on every device. torch's CPU sqrt is not correctly
    rounded (on this AVX-512 build about 17% of float32 results and some float64 ones are one ulp off;
    CUDA's is exact), so it is taken in binary64 and rounded once: a square root with an error below
    4 binary64 ulps still rounds correctly to float32 / bfloat16 / float16, because √x of such a value lies
    at least 2⁻⁵⁰·√x from every rounding boundary of those formats."""
    if x.dtype not in _CARBON_DTYPES:
        raise NotCovered(f"sqrt in {x.dtype}: torch's CPU sqrt is not correctly rounded; carbon rounds float32, "
                         "bfloat16 and float16 square roots exactly")
    return aten.sqrt(x.to(torch.float64)).to(x.dtype)


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


def _add(a: dict) -> Any:
    if not _any_float(a["self"], a["other"]):
        return PASS  # integer arithmetic is exact
    return aten.add(a["self"], _scaled(a["other"], a.get("alpha", 1)))


def _sub(a: dict) -> Any:
    if not _any_float(a["self"], a["other"]):
        return PASS
    return aten.sub(a["self"], _scaled(a["other"], a.get("alpha", 1)))


def _rsub(a: dict) -> Any:
    if not _any_float(a["self"], a["other"]):
        return PASS
    return aten.sub(a["other"], _scaled(a["self"], a.get("alpha", 1)))


def _div(a: dict) -> Tensor:
    mode = a.get("rounding_mode")
    if mode is not None:
        return aten.div(a["self"], a["other"], rounding_mode=mode)
    return true_divide(a["self"], a["other"])


def _addcmul(a: dict) -> Tensor:
    # self + value * (t1 * t2), three roundings in this order
    return aten.add(a["self"], _scaled(aten.mul(a["tensor1"], a["tensor2"]), a.get("value", 1)))


def _addcdiv(a: dict) -> Tensor:
    return aten.add(a["self"], _scaled(true_divide(a["tensor1"], a["tensor2"]), a.get("value", 1)))


def _lerp(a: dict) -> Tensor:
    # torch's two-sided formula, each step one rounding:
    # w < 0.5: start + w * (end - start); else end - (end - start) * (1 - w)
    start, end, w = a["self"], a["end"], a["weight"]
    diff = aten.sub(end, start)
    if isinstance(w, Tensor):
        low = aten.add(start, aten.mul(w, diff))
        high = aten.sub(end, aten.mul(diff, aten.rsub(w, 1)))
        return torch.where(aten.lt(aten.abs(w), 0.5), low, high)
    w = float(w)
    if abs(w) < 0.5:
        return aten.add(start, aten.mul(diff, w))
    return aten.sub(end, aten.mul(diff, 1.0 - w))


def _pow(a: dict) -> Any:
    """Integer exponents as products in a fixed order (binary exponentiation
    from the lowest bit, each product rounded: carbon.optim.power's order);
    0.5 as sqrt; a negative exponent as 1 / x^|n|. Other number exponents,
    and a number base with a tensor exponent (e.g. rotary embeddings'
    base ** (arange / dim)): carbon's pow, RN(exp(p log x)) from binary64 cores."""
    x, e = a["self"], a["exponent"]
    if isinstance(x, Tensor) and not x.is_floating_point() and not _floating(e):
        return PASS
    if isinstance(e, Tensor) and not isinstance(x, Tensor):
        if not e.is_floating_point():
            raise NotCovered("pow of a number to an integer tensor exponent")
        _need_carbon_dtype("pow", e)
        return carbon_ops.pow_scalar_tensor(float(x), e)
    if isinstance(e, Tensor) and isinstance(x, Tensor) and x.dim() == 0 and x.device.type == "cpu" and x.is_floating_point():
        # a 0-dim CPU base (BLOOM's ALiBi slopes, base ** arange): a number base, read without a device sync
        _need_carbon_dtype("pow", x)
        exponent = e if e.is_floating_point() else aten._to_copy(e, dtype=x.dtype)
        return carbon_ops.pow_scalar_tensor(x.item(), exponent).to(torch.result_type(x, e))
    if isinstance(e, Tensor) and e.dim() == 0 and e.device.type == "cpu":
        return _pow({"self": x, "exponent": e.item()})  # a 0-dim CPU exponent: a number exponent
    if isinstance(e, Tensor):
        raise NotCovered("pow with a tensor base and a tensor exponent")
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
    _need_carbon_dtype("pow", x)
    return carbon_ops.pow_tensor_scalar(x, float(e))


def _reduce_loss(loss: Tensor, reduction: int) -> Tensor:
    if reduction == 0:
        return loss
    return carbon_ops.sum(loss, None, False, None) if reduction == 2 else carbon_ops.mean(loss, None, False, None)


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


def _xlogy(a: dict) -> Tensor:
    """x·log(y) as RN(x·LOG(y)) (carbon's log), 0 where x = 0 and y is not NaN (torch's rule)."""
    x, y = a["self"], a["other"]
    x_t = x if isinstance(x, Tensor) else torch.full((), float(x), device=y.device)
    y_t = y if isinstance(y, Tensor) else torch.full((), float(y), device=x_t.device)
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x_t, y_t = x_t.to(dtype), y_t.to(dtype)
    _need_carbon_dtype("xlogy", x_t, y_t)
    product = aten.mul(x_t, carbon_ops.log(y_t))
    return aten.where(aten.logical_and(aten.eq(x_t, 0), aten.logical_not(aten.isnan(y_t))), 0.0, product).to(dtype)


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


def _logit(a: dict) -> Tensor:
    """RN(LOG(RN(z / RN(1 − z)))) with z = clamp(x, eps, 1 − eps) when eps is given (carbon's log)."""
    x, eps = a["self"], a.get("eps")
    _need_carbon_dtype("logit", x)
    z = x if eps is None else aten.clamp(x, eps, 1.0 - eps)
    return carbon_ops.log(aten.div.Tensor(z, aten.rsub(z, 1)))


def _logit_backward(a: dict) -> Tensor:
    """RN(g / RN(x·RN(1 − x))) inside [eps, 1 − eps] (0 outside when eps is given; NaN outside [0, 1])."""
    g, x, eps = a["grad_output"], a["self"], a.get("eps")
    d = aten.div.Tensor(g, aten.mul(x, aten.rsub(x, 1)))
    if eps is None:
        return d
    inside = aten.logical_and(aten.ge(x, eps), aten.le(x, 1.0 - eps))
    return aten.where(inside, d, 0.0).to(d.dtype)


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
    return _add_product(bias, lambda: carbon_ops.mm(m, col).squeeze(1),
                        lambda: carbon_ops.addmm(bias.unsqueeze(-1) if bias.dim() == 1 else bias, m, col).squeeze(1),
                        a["beta"], a["alpha"])


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
        contrib = aten.t(g.reshape([planes, -1])).contiguous()
        return aten.t(carbon_ops.index_add(zeros, 0, source, contrib)).reshape(x.shape).contiguous()
    return handler


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
    return carbon_ops.mm(x, y) if _float_mm("mm", x, y) else PASS


def _bmm(a: dict) -> Tensor:
    x, y = a["self"], a["mat2"]
    return carbon_ops.bmm(x, y) if _float_mm("bmm", x, y) else PASS


def _add_product(bias: Tensor, product: Callable[[], Tensor], fused: Callable[[], Tensor],
                 beta: Any, alpha: Any) -> Tensor:
    if beta == 1 and alpha == 1:
        return fused()
    p = _scaled(product(), alpha)
    if beta == 0:  # torch ignores bias (even NaN) when beta == 0
        return aten.clone(p) if p.shape == torch.Size([]) else p.contiguous()
    return aten.add(_scaled(bias, beta), p)


def _biased_product(name: str, first: str, second: str, product: Callable, fused: Callable) -> Callable[[dict], Any]:
    """addmm / baddbmm: bias + x @ y with carbon's single rounding when beta = alpha = 1."""
    def handler(a: dict) -> Any:
        bias, x, y = a["self"], a[first], a[second]
        if not _float_mm(name, x, y):
            return PASS
        _need_carbon_dtype(name, bias)
        return _add_product(bias, lambda: product(x, y), lambda: fused(bias, x, y), a["beta"], a["alpha"])
    return handler


_addmm = _biased_product("addmm", "mat1", "mat2", carbon_ops.mm, carbon_ops.addmm)
_baddbmm = _biased_product("baddbmm", "batch1", "batch2", carbon_ops.bmm, carbon_ops.baddbmm)


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


def _conv_args(name: str, a: dict, *tensors: Optional[Tensor]) -> tuple:
    _need_carbon_dtype(name, *tensors)
    return list(a["stride"]), list(a["padding"]), list(a["dilation"]), a["groups"]


def _convolution(a: dict) -> Tensor:
    x, w, b = a["input"], a["weight"], a["bias"]
    stride, padding, dilation, groups = _conv_args("convolution", a, x, w, b)
    if a["transposed"]:
        return conv_transpose_forward(x, w, b, stride, padding, list(a["output_padding"]), dilation, groups)
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
    if not x.is_floating_point() and (dtype is None or not dtype.is_floating_point):
        return PASS  # integer prefix sums are exact
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
    work = _opmath(aten._to_copy(x, dtype=out_dtype) if x.dtype != out_dtype else x)
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
        raise NotCovered("linalg_vector_norm with a dtype argument")
    if ord_ == math.inf:
        r = aten.amax(aten.abs(x), dim if dim is not None else [], keepdim)
        return r
    if ord_ != 2:
        raise NotCovered(f"linalg_vector_norm with ord={ord_}: carbon computes the 2-norm and the inf-norm exactly")
    if dim is not None and len(dim) > 0 and x.dim() > 0:
        return _norm_over_dims(x, list(dim), keepdim)
    if x.numel() == 0:
        return aten.zeros((), dtype=x.dtype, device=x.device)
    r = carbon_ops.sum_squares([x], True).to(x.dtype)
    if keepdim:
        r = r.reshape([1] * x.dim())
    return r


def _norm_over_dims(x: Tensor, dims: List[int], keepdim: bool) -> Tensor:
    """RN(sqrt(RN(sum of x^2))) over ``dims``, the sum exact: x^2 is split into
    float32 hi = RN32(x^2) and lo = x^2 - hi (exact in binary64; lo fits float32
    unless x^2 is below float32's normal range, |x| < 2^-63, where lo is
    rounded), and carbon.sum adds all the hi and lo terms exactly."""
    dims = [d % x.dim() for d in dims]
    sq = aten.mul(x.double(), x.double())  # exact: at most 2 x 24 significant bits
    hi = sq.to(torch.float32)
    lo = aten.sub(sq, hi.double()).to(torch.float32)
    stacked = aten.stack([hi, lo])
    total = carbon_ops.sum(stacked, [0] + [d + 1 for d in dims], False, x.dtype)
    r = sqrt_rn(total)
    if keepdim:
        for d in sorted(dims):
            r = r.unsqueeze(d)
    return r


def _norm(a: dict) -> Tensor:
    """aten.norm (torch.norm, weight_norm's norm_except_dim): the vector-norm route with p = 2 or inf."""
    p = a.get("p")
    dim = a.get("dim")
    return _vector_norm({"self": a["self"], "ord": 2 if p is None else p, "dim": list(dim) if dim is not None else None,
                         "keepdim": a.get("keepdim", False), "dtype": a.get("dtype")})


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

def _layer_norm(a: dict):
    x, w, b = a["input"], a["weight"], a["bias"]
    _need_carbon_dtype("native_layer_norm", x, w, b)
    return carbon_ops.layer_norm(x, list(a["normalized_shape"]), w, b, a["eps"])


def _layer_norm_backward(a: dict):
    mask = [bool(m) for m in a["output_mask"]]
    return _norm_backward(a["grad_out"], a["input"], list(a["normalized_shape"]), a["mean"], a["rstd"], a["weight"],
                          *mask)  # one pass over x and grad_out on the CPU


def _rms_norm(a: dict):
    x, w = a["input"], a["weight"]
    _need_carbon_dtype("_fused_rms_norm", x, w)
    return carbon_ops.rms_norm(x, list(a["normalized_shape"]), w, a["eps"])


def _rms_norm_backward(a: dict):
    mask = a["output_mask"]
    dx, dw, _ = _norm_backward(a["grad_out"], a["input"], list(a["normalized_shape"]), None, a["rstd"], a["weight"],
                               bool(mask[0]), bool(mask[1]), False)
    return dx, dw


def _softmax_like(name: str, op: Callable) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        x = a["self"]
        _need_carbon_dtype(name, x)
        dtype = a.get("dtype")
        if a.get("half_to_float"):
            dtype = torch.float32
        return op(x, a["dim"], dtype)
    return handler


def _softmax_backward(op: Callable) -> Callable[[dict], Tensor]:
    return lambda a: op(a["grad_output"], a["output"], a["dim"], a["input_dtype"])


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

def _unary(name: str, op: Callable) -> Callable[[dict], Any]:
    def handler(a: dict) -> Any:
        x = a["self"]
        if not x.is_floating_point():
            raise NotCovered(f"{name} of an integer tensor")
        _need_carbon_dtype(name, x)
        return op(x)
    return handler


def _gelu(a: dict) -> Tensor:
    _need_carbon_dtype("gelu", a["self"])
    return carbon_ops.gelu(a["self"], a.get("approximate", "none"))


def _gelu_backward(a: dict) -> Tensor:
    fn = "gelu_tanh" if a.get("approximate", "none") == "tanh" else "gelu"
    return carbon_ops.elementwise_backward(a["grad_output"], a["self"], fn)


def _softplus(a: dict) -> Tensor:
    """beta = 1: x where x > threshold (torch's rule), else carbon's softplus."""
    x, beta, threshold = a["self"], a.get("beta", 1), a.get("threshold", 20)
    _need_carbon_dtype("softplus", x)
    if beta != 1:
        raise NotCovered(f"softplus with beta={beta}: carbon covers beta=1")
    return aten.where(aten.gt(x, threshold), x, carbon_ops.softplus(x))


def _softplus_backward(a: dict) -> Tensor:
    g, x, beta, threshold = a["grad_output"], a["self"], a.get("beta", 1), a.get("threshold", 20)
    if beta != 1:
        raise NotCovered(f"softplus_backward with beta={beta}: carbon covers beta=1")
    return aten.where(aten.gt(x, threshold), g, carbon_ops.elementwise_backward(g, x, "softplus"))


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

def _pool_pair(v: Any, default: Optional[List[int]] = None) -> List[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        return list(default or [])
    return v * 2 if len(v) == 1 else v


def _avg_pool2d_args(a: dict) -> tuple:
    kernel = _pool_pair(a["kernel_size"])
    stride = _pool_pair(a.get("stride", []), kernel)
    padding = _pool_pair(a.get("padding", 0))
    if a.get("ceil_mode", False) or a.get("divisor_override") is not None:
        raise NotCovered("avg_pool2d with ceil_mode or divisor_override")
    if not a.get("count_include_pad", True) and any(padding):
        raise NotCovered("avg_pool2d with padding and count_include_pad=False")
    return kernel, stride, padding


def _avg_pool2d(a: dict) -> Tensor:
    """Each output RN(exact Σ window / (kh·kw)), padding counted as +0 (count_include_pad): carbon.mean
    over each window, copied into columns as for a convolution."""
    x = a["self"]
    _need_carbon_dtype("avg_pool2d", x)
    kernel, stride, padding = _avg_pool2d_args(a)
    batched = x if x.dim() == 4 else x.unsqueeze(0)
    n, c = batched.shape[:2]
    cols, out = conv_columns(batched, kernel, stride, [1, 1], padding, 1)  # [1, C*K, N*P]
    means = carbon_ops.mean(cols.reshape([c, kernel[0] * kernel[1], n] + out), [1], False, None)  # [C, N, P...]
    y = aten.movedim(means, 0, 1).contiguous()
    return y if x.dim() == 4 else y.squeeze(0)


def _avg_pool2d_backward(a: dict) -> Tensor:
    """RN(exact Σ over the windows containing the position of RN(g / (kh·kw))): each window's share
    (one IEEE division), then one exact sum per input position (a transposed convolution with unit
    weights)."""
    g, x = a["grad_output"], a["self"]
    kernel, stride, padding = _avg_pool2d_args(a)
    gb, xb = (g, x) if x.dim() == 4 else (g.unsqueeze(0), x.unsqueeze(0))
    c = xb.shape[1]
    share = true_divide(gb, float(kernel[0] * kernel[1]))
    ones = aten.ones([c, 1] + kernel, dtype=gb.dtype, device=gb.device)
    out = conv_transpose_forward(share, ones, None, stride, padding,
                                 [xb.shape[2 + i] - conv_transpose_size(share, ones, stride, padding, [0, 0], [1, 1])[i]
                                  for i in range(2)], [1, 1], c)
    return out if x.dim() == 4 else out.squeeze(0)


def _interpolation_matrix(size_in: int, size_out: int, align_corners: bool, scale: Optional[float],
                          device: torch.device) -> Tensor:
    """[size_out, size_in] float32 weights of linear interpolation along one dimension, torch's rule in
    binary64: scale = (in − 1)/(out − 1) with align_corners, else 1/scale_factor if given, else in/out;
    src = scale·dst (align_corners) or max(scale·(dst + 0.5) − 0.5, 0); i0 = ⌊src⌋, i1 = min(i0 + 1, in − 1),
    λ1 = src − i0, λ0 = 1 − λ1; each entry RN32 of its binary64 weight (λ0 + λ1 where i0 = i1)."""
    if align_corners:
        step = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else size_in / size_out
    rows = [[0.0] * size_in for _ in range(size_out)]
    for dst in range(size_out):
        src = step * dst if align_corners else max(step * (dst + 0.5) - 0.5, 0.0)
        i0 = min(int(math.floor(src)), size_in - 1)
        i1 = min(i0 + 1, size_in - 1)
        lam1 = src - i0
        rows[dst][i0] += 1.0 - lam1
        rows[dst][i1] += lam1
    return torch.tensor(rows, dtype=torch.float64).to(device=device, dtype=torch.float32)


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


def _upsample_linear(spatial: int) -> Callable[[dict], Tensor]:
    """linear / bilinear / trilinear upsampling as separable exact products: along each spatial dimension
    from the last, RN(exact Σ of interpolation weight · value) (two terms; carbon.mm with the float32
    interpolation matrix); float32 between the passes, the input's dtype after the last."""
    def handler(a: dict) -> Tensor:
        x = a["input"] if "input" in a else a["self"]
        _need_carbon_dtype("upsample", x)
        in_sizes = list(x.shape[-spatial:])
        out_sizes, factors, align = _linear_upsample_args(a, spatial, in_sizes)
        t = x
        for k in reversed(range(spatial)):
            dim = x.dim() - spatial + k
            matrix = _interpolation_matrix(in_sizes[k], out_sizes[k], align, factors[k], x.device)
            t = _along(t, dim, matrix, x.dtype if k == 0 else torch.float32)
        return t.contiguous()
    return handler


def _upsample_linear_backward(spatial: int) -> Callable[[dict], Tensor]:
    """The transposed products: along each spatial dimension from the last, RN(exact Σ_j weight[j, k] · g_j)."""
    def handler(a: dict) -> Tensor:
        g = a["grad_output"]
        in_sizes = list(a["input_size"])[-spatial:]
        out_sizes, factors, align = _linear_upsample_args(a, spatial, in_sizes)
        t = g
        for k in reversed(range(spatial)):
            dim = g.dim() - spatial + k
            matrix = _interpolation_matrix(in_sizes[k], out_sizes[k], align, factors[k], g.device)
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

def _index_add(a: dict) -> Tensor:
    x, src = a["self"], a["source"]
    if not x.is_floating_point():
        return PASS
    return carbon_ops.index_add(x, a["dim"], a["index"], _scaled(src, a.get("alpha", 1)))


def _scatter_add(a: dict) -> Tensor:
    x = a["self"]
    if not x.is_floating_point():
        return PASS
    return carbon_ops.scatter_add(x, a["dim"], a["index"], a["src"])


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


def _adaptive_avg_pool2d(a: dict) -> Tensor:
    """Each output the exact mean of its region, rounded once (carbon.mean)."""
    x = a["self"]
    _need_carbon_dtype("_adaptive_avg_pool2d", x)
    oh, ow = list(a["output_size"])
    h, w = x.shape[-2:]
    if h % oh == 0 and w % ow == 0:  # a regular tiling: one call
        tiles = x.reshape(list(x.shape[:-2]) + [oh, h // oh, ow, w // ow])
        return carbon_ops.mean(tiles, [-3, -1], False, None)
    rows = []
    for h0, h1 in _pool_regions(h, oh):
        rows.append(aten.stack([carbon_ops.mean(x[..., h0:h1, w0:w1].contiguous(), [-2, -1], False, None)
                                for w0, w1 in _pool_regions(w, ow)], -1))
    return aten.stack(rows, -2)


def _adaptive_avg_pool2d_backward(a: dict) -> Tensor:
    """RN(g / |region|) to every position of the region (one IEEE division); where regions overlap
    (sizes not divisible), the shares are added region by region in row-major order, each addition
    rounded."""
    g, x = a["grad_output"], a["self"]
    oh, ow = g.shape[-2:]
    h, w = x.shape[-2:]
    if h % oh == 0 and w % ow == 0:
        share = true_divide(g, float((h // oh) * (w // ow)))
        return share.reshape(list(g.shape[:-2]) + [oh, 1, ow, 1]).expand(
            list(g.shape[:-2]) + [oh, h // oh, ow, w // ow]).reshape(x.shape).contiguous()
    out = aten.zeros_like(x, memory_format=torch.contiguous_format)
    for i, (h0, h1) in enumerate(_pool_regions(h, oh)):
        for j, (w0, w1) in enumerate(_pool_regions(w, ow)):
            share = true_divide(g[..., i:i + 1, j:j + 1], float((h1 - h0) * (w1 - w0)))
            out[..., h0:h1, w0:w1] = aten.add(out[..., h0:h1, w0:w1], share)
    return out


def _index_put(a: dict) -> Any:
    """x[indices] += values with accumulate=True (the backward of advanced indexing): every destination
    element gets RN(x + exact Σ of its values), duplicates included (carbon.index_add over the indexed
    dimensions flattened into one). Integer index tensors, broadcast together, on adjacent dimensions
    (torch's rule for where the broadcast dimensions go then keeps them in place); boolean masks are
    first turned into integer indices as torch does."""
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    if not a.get("accumulate", False) or not x.is_floating_point():
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
    idx = aten.broadcast_tensors([expanded[d] for d in used])
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


def _embedding_backward(a: dict) -> Tensor:
    return carbon_ops.embedding_backward(a["grad_output"], a["indices"], a["num_weights"], a["padding_idx"])


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
    x = a["self"]
    _need_random_dtype("normal_", x.dtype)
    return _normal_values(list(x.shape), a["mean"], a["std"], x.dtype, x.device)


def _exponential_(a: dict) -> Tensor:
    """RN(−LOG(RN(1 − u)) / λ) from one uniform draw u (k·2⁻²⁴) per element, as multinomial's race."""
    x, lambd = a["self"], a.get("lambd", 1.0)
    _need_random_dtype("exponential_", x.dtype)
    u = _uniform_values(list(x.shape), 0.0, 1.0, torch.float32, x.device)
    e = aten.neg(carbon_ops.log(aten.rsub(u, 1.0)))
    return true_divide(e, float(lambd)).to(x.dtype)


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
    "mm": _mm, "bmm": _bmm, "addmm": _addmm, "baddbmm": _baddbmm, "mv": _mv, "dot": _dot,
    "convolution": _convolution, "convolution_backward": _convolution_backward,
    # reductions
    "sum": _sum, "mean": _mean, "linalg_vector_norm": _vector_norm, "norm": _norm,
    "_weight_norm_interface": _weight_norm, "_weight_norm_interface_backward": _weight_norm_backward, "_foreach_norm": _foreach_norm,
    # normalization, softmax, losses
    "native_layer_norm": _layer_norm, "native_layer_norm_backward": _layer_norm_backward,
    "_fused_rms_norm": _rms_norm, "_fused_rms_norm_backward": _rms_norm_backward,
    "_softmax": _softmax_like("softmax", carbon_ops.softmax),
    "_safe_softmax": _softmax_like("softmax", carbon_ops.softmax),
    "_log_softmax": _softmax_like("log_softmax", carbon_ops.log_softmax),
    "_softmax_backward_data": _softmax_backward(carbon_ops.softmax_backward),
    "_log_softmax_backward_data": _softmax_backward(carbon_ops.log_softmax_backward),
    "nll_loss_forward": _nll_loss_forward, "nll_loss_backward": _nll_loss_backward,
    "nll_loss2d_forward": _nll_loss2d(_nll_loss_forward), "nll_loss2d_backward": _nll_loss2d(_nll_loss_backward),
    "mse_loss": _mse_loss, "mse_loss_backward": _mse_loss_backward, "logsumexp": _logsumexp, "xlogy": _xlogy,
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
    # log2 ... acos: carbon's functions (§6); their backward is autograd's formula (e.g. g / (x·RN(ln 2)),
    # g·cosh x, g·rsqrt(1 − x²)) from these routes and the routed single operations, as for sin and cos
    **{name: _unary(name, getattr(carbon_ops, name))
       for name in ("log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos")},
    "elu": _elu, "elu_backward": _elu_backward, "celu": _celu, "softplus": _softplus, "softplus_backward": _softplus_backward,
    "log_sigmoid_forward": _log_sigmoid_forward, "log_sigmoid_backward": _log_sigmoid_backward,
    "gelu": _gelu, "gelu_backward": _gelu_backward, "silu_backward": _silu_backward,
    "tanh_backward": _tanh_backward, "sigmoid_backward": _sigmoid_backward,
    # single IEEE operations, spelled out so that no device fuses them
    "add": _add, "sub": _sub, "rsub": _rsub, "div": _div, "true_divide": _div, "addcmul": _addcmul,
    "addcdiv": _addcdiv, "lerp": _lerp, "pow": _pow, "sqrt": _sqrt, "rsqrt": _rsqrt, "reciprocal": _reciprocal,
    # indexed accumulation
    "index_add": _index_add, "scatter_add": _scatter_add, "index_put": _index_put, "_index_put_impl": _index_put,
    "embedding_dense_backward": _embedding_backward,
    "max_pool2d_with_indices_backward": _max_pool_backward(2),
    "max_pool3d_with_indices_backward": _max_pool_backward(3),
    "_adaptive_avg_pool2d": _adaptive_avg_pool2d, "_adaptive_avg_pool2d_backward": _adaptive_avg_pool2d_backward,
    "avg_pool2d": _avg_pool2d, "avg_pool2d_backward": _avg_pool2d_backward,
    **{f"upsample_nearest{d}d_backward": _upsample_nearest_backward for d in (1, 2, 3)},
    "upsample_linear1d": _upsample_linear(1), "upsample_bilinear2d": _upsample_linear(2),
    "upsample_trilinear3d": _upsample_linear(3), "upsample_linear1d_backward": _upsample_linear_backward(1),
    "upsample_bilinear2d_backward": _upsample_linear_backward(2),
    "upsample_trilinear3d_backward": _upsample_linear_backward(3),
    # piecewise activations
    "hardsigmoid": _hardsigmoid, "hardsigmoid_backward": _hardsigmoid_backward, "hardswish": _hardswish,
    "hardswish_backward": _hardswish_backward, "mish": _mish, "mish_backward": _mish_backward, "glu": _glu,
    "glu_backward": _glu_backward,
    # randomness (carbon.Generator)
    "linspace": _linspace,
    "rand": _rand, "randn": _randn, "randint": _randint, "randperm": _randperm, "uniform": _uniform_,
    "normal": _normal_, "random": _random_, "exponential": _exponential_, "bernoulli": _bernoulli, "multinomial": _multinomial,
    "native_dropout": _native_dropout, "native_dropout_backward": _native_dropout_backward,
    # foreach (torch.optim's multi-tensor paths, grad scaling)
    **{f"_foreach_{b}": _foreach(b) for b in ("add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "pow",
                                            "reciprocal", "rsqrt", "exp", "log")},
}
