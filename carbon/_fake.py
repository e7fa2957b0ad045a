"""Fake (meta) implementations: output shapes and dtypes without computing,
for torch.compile, FakeTensor tracing and the meta device. They reject bad
input exactly like the kernels' checks in csrc/ (same
exception types, messages starting with "carbon.<op>:"), so tracing fails
the way eager execution does."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)


def _check_dtype(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in SUPPORTED:
        raise TypeError(
            f"carbon.{op}: {name} has dtype {t.dtype}; supported dtypes are float32, bfloat16 and float16"
        )


def _check_operands(op: str, a: Tensor, b: Tensor, rank: int) -> None:
    _check_dtype(op, "a", a)
    _check_dtype(op, "b", b)
    if a.device != b.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but a is on {a.device} and b is on {b.device}")
    if a.dim() != rank or b.dim() != rank:
        raise ValueError(f"carbon.{op}: expected {rank}-D tensors, got a with shape {tuple(a.shape)} and b with shape {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"carbon.{op}: shapes cannot be multiplied ({tuple(a.shape)} and {tuple(b.shape)})")
    if rank == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"carbon.{op}: batch sizes differ ({tuple(a.shape)} and {tuple(b.shape)})")


def _check_bias(op: str, bias: Tensor, a: Tensor, out_shape: Sequence[int]) -> None:
    _check_dtype(op, "bias", bias)
    if bias.device != a.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but a is on {a.device} and bias is on {bias.device}")
    expandable = bias.dim() <= len(out_shape) and all(
        s == 1 or s == o for s, o in zip(reversed(bias.shape), reversed(out_shape))
    )
    if not expandable:
        raise ValueError(f"carbon.{op}: bias of shape {tuple(bias.shape)} cannot be broadcast to the output shape {tuple(out_shape)}")


def _out_dtype(op: str, a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    dtype = out_dtype if out_dtype is not None else torch.promote_types(a.dtype, b.dtype)
    if dtype not in SUPPORTED:
        raise TypeError(f"carbon.{op}: output dtype {dtype} is not supported; use float32, bfloat16 or float16")
    return dtype


@torch.library.register_fake("carbon::mm")
def _mm_fake(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_operands("mm", a, b, 2)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_out_dtype("mm", a, b, out_dtype))


@torch.library.register_fake("carbon::addmm")
def _addmm_fake(bias: Tensor, a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_operands("addmm", a, b, 2)
    dtype = _out_dtype("addmm", a, b, out_dtype)
    _check_bias("addmm", bias, a, (a.shape[0], b.shape[1]))
    return a.new_empty((a.shape[0], b.shape[1]), dtype=dtype)


@torch.library.register_fake("carbon::bmm")
def _bmm_fake(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_operands("bmm", a, b, 3)
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=_out_dtype("bmm", a, b, out_dtype))


@torch.library.register_fake("carbon::baddbmm")
def _baddbmm_fake(bias: Tensor, a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_operands("baddbmm", a, b, 3)
    dtype = _out_dtype("baddbmm", a, b, out_dtype)
    _check_bias("baddbmm", bias, a, (a.shape[0], a.shape[1], b.shape[2]))
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=dtype)


def reduced_dims(op: str, ndim: int, dim: Optional[Sequence[int]]) -> list:
    """The dimensions a reduction reduces, normalized and checked like the
    kernels do (None or empty: all of them)."""
    span = max(ndim, 1)  # a 0-dim tensor accepts dim 0 and -1
    if not dim:
        return list(range(ndim))
    out = []
    for d in dim:
        if not -span <= d < span:
            raise ValueError(f"carbon.{op}: dim {d} is out of range for a tensor with {ndim} dimensions")
        w = d % span
        if w in out:
            raise ValueError(f"carbon.{op}: dim {d} appears more than once")
        out.append(w)
    return [d for d in out if d < ndim]


def _reduce_fake(op: str, x: Tensor, dim: Optional[Sequence[int]], keepdim: bool, dtype: Optional[torch.dtype]) -> Tensor:
    _check_dtype(op, "x", x)
    out_dtype = dtype if dtype is not None else x.dtype
    if out_dtype not in SUPPORTED:
        raise TypeError(f"carbon.{op}: output dtype {out_dtype} is not supported; use float32, bfloat16 or float16")
    reduced = reduced_dims(op, x.dim(), dim)
    shape = [1 if d in reduced else s for d, s in enumerate(x.shape) if keepdim or d not in reduced]
    return x.new_empty(shape, dtype=out_dtype)


@torch.library.register_fake("carbon::sum")
def _sum_fake(x: Tensor, dim: Optional[Sequence[int]] = None, keepdim: bool = False, dtype: Optional[torch.dtype] = None) -> Tensor:
    return _reduce_fake("sum", x, dim, keepdim, dtype)


@torch.library.register_fake("carbon::mean")
def _mean_fake(x: Tensor, dim: Optional[Sequence[int]] = None, keepdim: bool = False, dtype: Optional[torch.dtype] = None) -> Tensor:
    return _reduce_fake("mean", x, dim, keepdim, dtype)


@torch.library.register_fake("carbon::round_to")
def _round_to_fake(x: Tensor, dtype: torch.dtype, divisor: int = 1) -> Tensor:
    _check_dtype("round_to", "x", x)
    if dtype not in SUPPORTED:
        raise TypeError(f"carbon.round_to: output dtype {dtype} is not supported; use float32, bfloat16 or float16")
    if not 1 <= divisor < 2**32:
        raise ValueError(f"carbon.round_to: divisor must be in [1, 2^32), got {divisor}")
    return x.new_empty(x.shape, dtype=dtype)


# ---------------------------------------------------------------- softmax family


def _softmax_dim(op: str, ndim: int, dim: int) -> int:
    span = max(ndim, 1)
    if not -span <= dim < span:
        raise ValueError(f"carbon.{op}: dim {dim} is out of range for a tensor with {ndim} dimensions")
    return dim % span


def _softmax_fake(op: str, x: Tensor, dim: int, dtype: Optional[torch.dtype]) -> Tensor:
    _check_dtype(op, "x", x)
    out_dtype = dtype if dtype is not None else x.dtype
    if out_dtype not in SUPPORTED:
        raise TypeError(f"carbon.{op}: output dtype {out_dtype} is not supported; use float32, bfloat16 or float16")
    _softmax_dim(op, x.dim(), dim)
    return x.new_empty(x.shape, dtype=out_dtype)


@torch.library.register_fake("carbon::softmax")
def _softmax_forward_fake(x: Tensor, dim: int, dtype: Optional[torch.dtype] = None,
                          masked_rows_nan: bool = False) -> Tensor:
    return _softmax_fake("softmax", x, dim, dtype)


@torch.library.register_fake("carbon::log_softmax")
def _log_softmax_forward_fake(x: Tensor, dim: int, dtype: Optional[torch.dtype] = None,
                              masked_rows_nan: bool = False) -> Tensor:
    return _softmax_fake("log_softmax", x, dim, dtype)


def _softmax_backward_fake(op: str, grad: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    _check_dtype(op, "grad", grad)
    _check_dtype(op, "y", y)
    if input_dtype not in SUPPORTED:
        raise TypeError(f"carbon.{op}: output dtype {input_dtype} is not supported; use float32, bfloat16 or float16")
    if grad.shape != y.shape:
        raise ValueError(f"carbon.{op}: grad has shape {tuple(grad.shape)} but the output has shape {tuple(y.shape)}")
    if grad.dtype != y.dtype:
        raise TypeError(f"carbon.{op}: grad has dtype {grad.dtype} but the output has dtype {y.dtype}")
    _softmax_dim(op, y.dim(), dim)
    return y.new_empty(y.shape, dtype=input_dtype)


@torch.library.register_fake("carbon::softmax_backward")
def _softmax_backward_op_fake(grad: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _softmax_backward_fake("softmax_backward", grad, y, dim, input_dtype)


@torch.library.register_fake("carbon::log_softmax_backward")
def _log_softmax_backward_op_fake(grad: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _softmax_backward_fake("log_softmax_backward", grad, y, dim, input_dtype)


def _check_cross_entropy_args(op: str, reduction: int, label_smoothing: float) -> None:
    if reduction not in (0, 1, 2):
        raise ValueError(f"carbon.{op}: reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"carbon.{op}: label_smoothing must be in [0, 1], got {label_smoothing}")


@torch.library.register_fake("carbon::cross_entropy")
def _cross_entropy_fake(
    input: Tensor, target: Tensor, reduction: int = 1, ignore_index: int = -100, label_smoothing: float = 0.0
) -> tuple:
    _check_dtype("cross_entropy", "input", input)
    if input.dim() != 2:
        raise ValueError(f"carbon.cross_entropy: expected 2-D logits [N, C], got shape {tuple(input.shape)}")
    if target.dtype != torch.int64:
        raise TypeError(f"carbon.cross_entropy: target must hold class indices of dtype int64, got {target.dtype}")
    if target.device != input.device:
        raise ValueError(
            f"carbon.cross_entropy: expected all tensors on one device, but input is on {input.device} and target is on {target.device}"
        )
    if target.dim() != 1 or target.shape[0] != input.shape[0]:
        raise ValueError(
            f"carbon.cross_entropy: target has shape {tuple(target.shape)} but input has shape {tuple(input.shape)} (expected target of shape [N])"
        )
    _check_cross_entropy_args("cross_entropy", reduction, label_smoothing)
    n = input.shape[0]
    loss = input.new_empty((n,) if reduction == 0 else ())
    return loss, input.new_empty(input.shape, dtype=torch.float32), input.new_empty((), dtype=torch.int64)


@torch.library.register_fake("carbon::cross_entropy_backward")
def _cross_entropy_backward_fake(
    grad: Tensor,
    log_probs: Tensor,
    target: Tensor,
    count: Tensor,
    reduction: int,
    ignore_index: int,
    label_smoothing: float,
    input_dtype: torch.dtype,
) -> Tensor:
    _check_dtype("cross_entropy_backward", "grad", grad)
    _check_cross_entropy_args("cross_entropy_backward", reduction, label_smoothing)
    if input_dtype not in SUPPORTED:
        raise TypeError(f"carbon.cross_entropy_backward: output dtype {input_dtype} is not supported")
    return log_probs.new_empty(log_probs.shape, dtype=input_dtype)


# ---------------------------------------------------------------- attention


@torch.library.register_fake("carbon::attention_logits")
def _attention_logits_fake(scores: Tensor, scale: float, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    if scores.dtype != torch.float32:
        raise TypeError(f"carbon.attention_logits: scores must be float32, got {scores.dtype}")
    if scores.dim() != 3:
        raise ValueError(f"carbon.attention_logits: expected scores [B, Tq, Tk], got shape {tuple(scores.shape)}")
    if mask is not None:
        _check_dtype("attention_logits", "mask", mask)
        if tuple(mask.shape) != tuple(scores.shape):
            raise ValueError(
                f"carbon.attention_logits: mask has shape {tuple(mask.shape)} but the scores have shape {tuple(scores.shape)}"
            )
    return torch.empty_like(scores, memory_format=torch.contiguous_format)


@torch.library.register_fake("carbon::attention_probs")
def _attention_probs_fake(q: Tensor, k: Tensor, scale: float, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"carbon.attention_probs: expected q [B, L, E] and k [B, S, E], got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    _check_dtype("bmm", "a", q)
    _check_dtype("bmm", "b", k)
    shape = (q.shape[0], q.shape[1], k.shape[1])
    if mask is not None:
        _check_dtype("attention_logits", "mask", mask)
        if tuple(mask.shape) != shape:
            raise ValueError(f"carbon.attention_logits: mask has shape {tuple(mask.shape)} but the scores have shape {shape}")
    return q.new_empty(shape, dtype=torch.float32)


@torch.library.register_fake("carbon::attention_probs_backward")
def _attention_probs_backward_fake(grad: Tensor, probs: Tensor, scale: float) -> Tensor:
    if grad.dtype != torch.float32 or probs.dtype != torch.float32:
        raise TypeError(f"carbon.attention_probs_backward: grad and probs must be float32, got {grad.dtype} and {probs.dtype}")
    if probs.dim() != 3 or tuple(grad.shape) != tuple(probs.shape):
        raise ValueError(
            f"carbon.attention_probs_backward: expected grad and probs of one shape [B, L, S], got {tuple(grad.shape)} and {tuple(probs.shape)}"
        )
    return torch.empty_like(probs, memory_format=torch.contiguous_format)
# ---------------------------------------------------------------------------
# Elementwise math (exp, log, tanh, sigmoid, erf, gelu, silu, sin, cos, log1p, softplus, log_sigmoid, expm1,
# log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos, erfinv, asinh, acosh, atanh, lgamma, digamma,
# trigamma, their backward).
# Same checks as csrc/elementwise/elementwise.cpp. Self-contained section.
# ---------------------------------------------------------------------------

ELEMENTWISE_FUNCTIONS = ("exp", "log", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "sin", "cos", "log1p",
                         "softplus", "log_sigmoid", "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan",
                         "asin", "acos", "erfinv", "asinh", "acosh", "atanh", "lgamma", "digamma", "trigamma")


# float64 too (csrc/elementwise/binary64_math.h): these functions and both pow ops.
BINARY64_FUNCTIONS = ("exp", "log", "sin", "cos")


def _check_dtype_or_float64(op: str, name: str, t: Tensor, float64_ok: bool) -> None:
    if not (float64_ok and t.dtype == torch.float64):
        _check_dtype(op, name, t)


def _elementwise_fake(op: str, x: Tensor) -> Tensor:
    _check_dtype_or_float64(op, "x", x, op in BINARY64_FUNCTIONS)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _register_elementwise_fakes() -> None:
    for name in ("exp", "log", "tanh", "sigmoid", "erf", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid", "expm1",
                 "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh", "acosh",
                 "atanh", "lgamma", "digamma", "trigamma"):
        torch.library.register_fake(f"carbon::{name}")(lambda x, _name=name: _elementwise_fake(_name, x))


_register_elementwise_fakes()


@torch.library.register_fake("carbon::pow_tensor_scalar")
def _pow_tensor_scalar_fake(x: Tensor, exponent: float) -> Tensor:
    _check_dtype_or_float64("pow_tensor_scalar", "x", x, True)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("carbon::sqrt")
def _sqrt_fake(x: Tensor) -> Tensor:
    _check_dtype_or_float64("sqrt", "x", x, True)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("carbon::pow_scalar_tensor")
def _pow_scalar_tensor_fake(base: float, exponent: Tensor) -> Tensor:
    _check_dtype_or_float64("pow_scalar_tensor", "exponent", exponent, True)
    return torch.empty_like(exponent, memory_format=torch.contiguous_format)


def _two_argument_fake(op: str, names: tuple, a: Tensor, b: Tensor) -> Tensor:
    _check_dtype(op, names[0], a)
    _check_dtype(op, names[1], b)
    if a.dtype != b.dtype:
        raise TypeError(f"carbon.{op}: {names[0]} has dtype {a.dtype} but {names[1]} has dtype {b.dtype} (they must agree)")
    if a.shape != b.shape:
        raise ValueError(f"carbon.{op}: {names[0]} has shape {list(a.shape)} but {names[1]} has shape {list(b.shape)} "
                         "(they must agree; broadcast first)")
    if a.device != b.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but {names[0]} is on {a.device} and "
                         f"{names[1]} is on {b.device}")
    return torch.empty_like(a, memory_format=torch.contiguous_format)


@torch.library.register_fake("carbon::atan2")
def _atan2_fake(y: Tensor, x: Tensor) -> Tensor:
    return _two_argument_fake("atan2", ("y", "x"), y, x)


@torch.library.register_fake("carbon::hypot")
def _hypot_fake(x: Tensor, y: Tensor) -> Tensor:
    return _two_argument_fake("hypot", ("x", "y"), x, y)


@torch.library.register_fake("carbon::pow_tensor_tensor")
def _pow_tensor_tensor_fake(x: Tensor, exponent: Tensor) -> Tensor:
    return _two_argument_fake("pow_tensor_tensor", ("x", "exponent"), x, exponent)


@torch.library.register_fake("carbon::cumsum_rows")
def _cumsum_rows_fake(x: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_dtype("cumsum_rows", "x", x)
    if x.dim() != 2:
        raise ValueError(f"carbon.cumsum_rows: x must be 2-D [rows, n], got {x.dim()} dimensions")
    out_dtype = dtype or x.dtype
    if out_dtype not in SUPPORTED:
        raise TypeError(f"carbon.cumsum_rows: output dtype {out_dtype} is not supported; use float32, bfloat16 or float16")
    return x.new_empty(x.shape, dtype=out_dtype)


@torch.library.register_fake("carbon::sum_divided")
def _sum_divided_fake(x: Tensor, divisor: Tensor) -> Tensor:
    _check_dtype("sum_divided", "x", x)
    if divisor.dtype != torch.int64 or divisor.dim() != 0:
        raise TypeError(f"carbon.sum_divided: divisor must be a 0-dim int64 tensor, got {divisor.dtype} with "
                        f"{divisor.dim()} dimensions")
    if divisor.device != x.device:
        raise ValueError(f"carbon.sum_divided: expected x and divisor on one device, got {x.device} and {divisor.device}")
    return x.new_empty(())


@torch.library.register_fake("carbon::var_mean_rows")
def _var_mean_rows_fake(x: Tensor, correction: int = 1) -> tuple:
    _check_dtype("var_mean_rows", "x", x)
    if x.dim() != 2:
        raise ValueError(f"carbon.var_mean_rows: x must be 2-D [rows, n], got {x.dim()} dimensions")
    if correction < 0:
        raise ValueError(f"carbon.var_mean_rows: correction must be >= 0, got {correction}")
    out = x.new_empty((x.shape[0],), dtype=torch.float32)
    return out, out.clone()


@torch.library.register_fake("carbon::gelu")
def _gelu_fake(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"carbon.gelu: approximate must be 'none' or 'tanh', got '{approximate}'")
    return _elementwise_fake("gelu", x)


@torch.library.register_fake("carbon::elementwise_backward")
def _elementwise_backward_fake(grad: Tensor, x: Tensor, fn: str) -> Tensor:
    op = "elementwise_backward"
    if fn not in ELEMENTWISE_FUNCTIONS:
        raise ValueError(f"carbon.{op}: unknown function '{fn}'; expected exp, log, tanh, sigmoid, erf, gelu, gelu_tanh, silu, sin, cos, log1p, softplus, log_sigmoid, expm1, "
                         "log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos, erfinv, asinh, acosh, atanh, lgamma, digamma "
                         "or trigamma")
    _check_dtype_or_float64(op, "x", x, fn in BINARY64_FUNCTIONS)
    _check_dtype_or_float64(op, "grad", grad, fn in BINARY64_FUNCTIONS)
    if grad.dtype != x.dtype:
        raise TypeError(f"carbon.{op}: grad has dtype {grad.dtype} but x has dtype {x.dtype} (they must agree)")
    if grad.shape != x.shape:
        raise ValueError(f"carbon.{op}: grad has shape {list(grad.shape)} but x has shape {list(x.shape)} (they must agree)")
    if grad.device != x.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but grad is on {grad.device} and x is on {x.device}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)
# ============================================================================
# Normalization (layer_norm, rms_norm; csrc/norm/norm.cpp has the same checks).


def _norm_rows(op: str, x: Tensor, normalized_shape: Sequence[int]) -> list:
    """Checks x against normalized_shape; returns the leading shape (one row each)."""
    _check_dtype(op, "x", x)
    k = len(normalized_shape)
    if k < 1:
        raise ValueError(f"carbon.{op}: normalized_shape must have at least one dimension")
    if k > x.dim() or list(x.shape[x.dim() - k:]) != list(normalized_shape):
        raise ValueError(f"carbon.{op}: normalized_shape {list(normalized_shape)} does not match the trailing "
                         f"dimensions of x, of shape {list(x.shape)}")
    n = 1
    for s in normalized_shape:
        n *= s
    if n > 2**29:
        raise ValueError(f"carbon.{op}: at most 2^29 elements can be normalized together")
    return list(x.shape[: x.dim() - k])


def _norm_param(op: str, name: str, p: Optional[Tensor], x: Tensor, normalized_shape: Sequence[int]) -> None:
    if p is None:
        return
    if p.dtype != x.dtype:
        raise TypeError(f"carbon.{op}: {name} has dtype {p.dtype} but x has dtype {x.dtype}; they must be equal")
    if p.device != x.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but x is on {x.device} and {name} is on {p.device}")
    if list(p.shape) != list(normalized_shape):
        raise ValueError(f"carbon.{op}: {name} has shape {list(p.shape)} but normalized_shape is {list(normalized_shape)}")


def _norm_eps(op: str, eps: float) -> None:
    if not (0.0 <= eps < float("inf")):
        raise ValueError(f"carbon.{op}: eps must be finite and >= 0, got {eps}")


def _norm_stat(op: str, name: str, s: Tensor, x: Tensor, lead: list) -> None:
    if s.dtype != torch.float32:
        raise TypeError(f"carbon.{op}: {name} must be float32, got {s.dtype}")
    if s.device != x.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but x is on {x.device} and {name} is on {s.device}")
    rows = 1
    for d in lead:
        rows *= d
    if s.numel() != rows:
        raise ValueError(f"carbon.{op}: {name} has shape {list(s.shape)}, expected {lead}")


def _norm_grad(op: str, dy: Tensor, x: Tensor) -> None:
    if dy.dtype != x.dtype:
        raise TypeError(f"carbon.{op}: grad_out has dtype {dy.dtype} but x has dtype {x.dtype}")
    if dy.device != x.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but x is on {x.device} and grad_out is on {dy.device}")
    if dy.shape != x.shape:
        raise ValueError(f"carbon.{op}: grad_out has shape {list(dy.shape)} but x has shape {list(x.shape)}")


@torch.library.register_fake("carbon::layer_norm")
def _layer_norm_fake(x: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
                     bias: Optional[Tensor] = None, eps: float = 1e-5):
    lead = _norm_rows("layer_norm", x, normalized_shape)
    _norm_param("layer_norm", "weight", weight, x, normalized_shape)
    _norm_param("layer_norm", "bias", bias, x, normalized_shape)
    _norm_eps("layer_norm", eps)
    return (x.new_empty(x.shape), x.new_empty(lead, dtype=torch.float32),
            x.new_empty(lead, dtype=torch.float32))


@torch.library.register_fake("carbon::rms_norm")
def _rms_norm_fake(x: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
                   eps: Optional[float] = None):
    lead = _norm_rows("rms_norm", x, normalized_shape)
    _norm_param("rms_norm", "weight", weight, x, normalized_shape)
    if eps is not None:
        _norm_eps("rms_norm", eps)
    return x.new_empty(x.shape), x.new_empty(lead, dtype=torch.float32)


@torch.library.register_fake("carbon::norm_backward")
def _norm_backward_fake(grad_out: Tensor, x: Tensor, normalized_shape: Sequence[int], mean: Optional[Tensor],
                        rstd: Tensor, weight: Optional[Tensor] = None, output_mask: Sequence[bool] = (True, True, True)):
    op = "norm_backward"
    lead = _norm_rows(op, x, normalized_shape)
    _norm_param(op, "weight", weight, x, normalized_shape)
    _norm_grad(op, grad_out, x)
    if mean is not None:
        _norm_stat(op, "mean", mean, x, lead)
    _norm_stat(op, "rstd", rstd, x, lead)
    shape = list(normalized_shape)
    return (x.new_empty(x.shape if output_mask[0] else [0]), x.new_empty(shape if output_mask[1] else [0]),
            x.new_empty(shape if output_mask[2] else [0]))


# =====================================================================# Indexed accumulation (index_add, scatter_add, embedding; csrc/scatter/scatter.cpp
# has the same checks). Index ranges are data, so they are not checked here.


def _scatter_values(op: str, self: Tensor, name: str, t: Tensor) -> None:
    _check_dtype(op, "self", self)
    _check_dtype(op, name, t)
    if self.dtype != t.dtype:
        raise TypeError(f"carbon.{op}: {name} has dtype {t.dtype} but self has dtype {self.dtype}; they must agree")
    if self.device != t.device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but self is on {self.device} and {name} is on {t.device}")


def _scatter_index(op: str, name: str, index: Tensor, device: torch.device) -> None:
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"carbon.{op}: {name} has dtype {index.dtype}; expected int64 or int32")
    if index.device != device:
        raise ValueError(f"carbon.{op}: expected all tensors on one device, but self is on {device} and {name} is on {index.device}")


def _scatter_dim(op: str, dim: int, ndim: int) -> int:
    if ndim < 1:
        raise ValueError(f"carbon.{op}: self must have at least one dimension")
    if not -ndim <= dim < ndim:
        raise ValueError(f"carbon.{op}: dim {dim} is out of range for a tensor with {ndim} dimensions")
    return dim % ndim


@torch.library.register_fake("carbon::index_add")
def _index_add_fake(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    op = "index_add"
    _scatter_values(op, self, "source", source)
    _scatter_index(op, "index", index, self.device)
    d = _scatter_dim(op, dim, self.dim())
    if index.dim() > 1:
        raise ValueError(f"carbon.index_add: index must be 0-D or 1-D, got {index.dim()}-D")
    ok = source.dim() == self.dim() and source.shape[d] == index.numel() and all(
        i == d or source.shape[i] == self.shape[i] for i in range(self.dim()))
    if not ok:
        raise ValueError(f"carbon.index_add: source of shape {tuple(source.shape)} does not match self of shape "
                         f"{tuple(self.shape)} with {index.numel()} indices along dim {dim}")
    return self.new_empty(self.shape)


@torch.library.register_fake("carbon::scatter_add")
def _scatter_add_fake(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    op = "scatter_add"
    _scatter_values(op, self, "src", src)
    _scatter_index(op, "index", index, self.device)
    d = _scatter_dim(op, dim, self.dim())
    if index.numel() > 0:
        nd = self.dim()
        ok = index.dim() == nd and src.dim() == nd and all(
            index.shape[i] <= src.shape[i] and (i == d or index.shape[i] <= self.shape[i]) for i in range(nd))
        if not ok:
            raise ValueError(f"carbon.scatter_add: index of shape {tuple(index.shape)} does not fit self of shape "
                             f"{tuple(self.shape)} and src of shape {tuple(src.shape)}")
    return self.new_empty(self.shape)


@torch.library.register_fake("carbon::embedding")
def _embedding_fake(weight: Tensor, indices: Tensor, padding_idx: int = -1) -> Tensor:
    _check_dtype("embedding", "weight", weight)
    _scatter_index("embedding", "indices", indices, weight.device)
    if weight.dim() != 2:
        raise ValueError(f"carbon.embedding: weight must be 2-D, got shape {tuple(weight.shape)}")
    if not -1 <= padding_idx < weight.shape[0]:
        raise ValueError("carbon.embedding: padding_idx must be -1 (none) or in [0, num_embeddings)")
    return weight.new_empty((*indices.shape, weight.shape[1]))


@torch.library.register_fake("carbon::embedding_backward")
def _embedding_backward_fake(grad: Tensor, indices: Tensor, num_weights: int, padding_idx: int = -1) -> Tensor:
    _check_dtype("embedding_backward", "grad", grad)
    _scatter_index("embedding_backward", "indices", indices, grad.device)
    if num_weights < 0 or not -1 <= padding_idx < num_weights:
        raise ValueError("carbon.embedding_backward: padding_idx must be -1 (none) or in [0, num_weights)")
    if grad.dim() != indices.dim() + 1 or tuple(grad.shape[:-1]) != tuple(indices.shape):
        raise ValueError(f"carbon.embedding_backward: grad of shape {tuple(grad.shape)} does not match indices of "
                         f"shape {tuple(indices.shape)}")
    return grad.new_empty((num_weights, grad.shape[-1]))
# ---------------------------------------------------------------------------
# Random (uniform, normal, trunc_normal, bernoulli, dropout), each in two
# forms: (seed, offset) as ints, or .state, a tensor int64 [seed, offset]
# (carbon.Generator's draws). Same checks as csrc/random/random.cpp, except
# that a state tensor's offset is a value the fake cannot see (offset None).
# Self-contained section.
# ---------------------------------------------------------------------------


def _random_factory_fake(op: str, size: Sequence[int], offset: Optional[int], dtype: torch.dtype,
                         device: torch.device) -> Tensor:
    if dtype not in SUPPORTED:
        raise TypeError(f"carbon.{op}: output dtype {dtype} is not supported; use float32, bfloat16 or float16")
    if offset is not None and offset < 0:
        raise ValueError(f"carbon.{op}: offset must be >= 0, got {offset}")
    if any(s < 0 for s in size):
        raise ValueError(f"carbon.{op}: negative size {list(size)}")
    return torch.empty(size, dtype=dtype, device=device)


def _check_state(op: str, state: Tensor, device: torch.device) -> None:
    """The .state forms' checks of the state tensor (as random.cpp's tensor_state)."""
    if state.dtype != torch.int64:
        raise TypeError(f"carbon.{op}: state must be an int64 tensor [seed, offset], got {state.dtype}")
    if tuple(state.shape) != (2,):
        raise ValueError(f"carbon.{op}: state must be an int64 tensor [seed, offset] of shape (2,), got shape "
                         f"{list(state.shape)}")
    draw = torch.device(device)
    if state.device.type == draw.type == "cuda" and draw.index is not None and state.device.index != draw.index:
        raise RuntimeError(f"carbon.{op}: the state is on {state.device} but the draw on {device}")


def _check_finite(op: str, **values: float) -> None:
    for name, v in values.items():
        if not math.isfinite(v):
            raise ValueError(f"carbon.{op}: {name} must be finite, got {v}")


def _uniform_checks(low: float, high: float) -> None:
    _check_finite("uniform", low=low, high=high)
    if not low <= high:
        raise ValueError(f"carbon.uniform: low must be <= high, got low={low} and high={high}")


def _normal_checks(mean: float, std: float) -> None:
    _check_finite("normal", mean=mean, std=std)
    if std < 0:
        raise ValueError(f"carbon.normal: std must be >= 0, got {std}")


def _trunc_normal_checks(mean: float, std: float, a: float, b: float) -> None:
    _check_finite("trunc_normal", mean=mean, std=std, a=a, b=b)
    if std < 0:
        raise ValueError(f"carbon.trunc_normal: std must be >= 0, got {std}")
    if not a <= b:
        raise ValueError(f"carbon.trunc_normal: a must be <= b, got a={a} and b={b}")


@torch.library.register_fake("carbon::uniform")
def _uniform_fake(size: Sequence[int], seed: int, offset: int, low: float, high: float, dtype: torch.dtype,
                  device: torch.device) -> Tensor:
    _uniform_checks(low, high)
    return _random_factory_fake("uniform", size, offset, dtype, device)


@torch.library.register_fake("carbon::uniform.state")
def _uniform_state_fake(size: Sequence[int], state: Tensor, low: float, high: float, dtype: torch.dtype,
                        device: torch.device) -> Tensor:
    _uniform_checks(low, high)
    _check_state("uniform", state, device)
    return _random_factory_fake("uniform", size, None, dtype, device)


@torch.library.register_fake("carbon::normal")
def _normal_fake(size: Sequence[int], seed: int, offset: int, mean: float, std: float, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
    _normal_checks(mean, std)
    return _random_factory_fake("normal", size, offset, dtype, device)


@torch.library.register_fake("carbon::normal.state")
def _normal_state_fake(size: Sequence[int], state: Tensor, mean: float, std: float, dtype: torch.dtype,
                       device: torch.device) -> Tensor:
    _normal_checks(mean, std)
    _check_state("normal", state, device)
    return _random_factory_fake("normal", size, None, dtype, device)


@torch.library.register_fake("carbon::trunc_normal")
def _trunc_normal_fake(size: Sequence[int], seed: int, offset: int, mean: float, std: float, a: float, b: float,
                       dtype: torch.dtype, device: torch.device) -> Tensor:
    _trunc_normal_checks(mean, std, a, b)
    return _random_factory_fake("trunc_normal", size, offset, dtype, device)


@torch.library.register_fake("carbon::trunc_normal.state")
def _trunc_normal_state_fake(size: Sequence[int], state: Tensor, mean: float, std: float, a: float, b: float,
                             dtype: torch.dtype, device: torch.device) -> Tensor:
    _trunc_normal_checks(mean, std, a, b)
    _check_state("trunc_normal", state, device)
    return _random_factory_fake("trunc_normal", size, None, dtype, device)


def _random_tensor_fake(op: str, x: Tensor, p: Optional[float], offset: Optional[int]) -> Tensor:
    _check_dtype(op, "probs" if op == "bernoulli" else "x", x)
    if offset is not None and offset < 0:
        raise ValueError(f"carbon.{op}: offset must be >= 0, got {offset}")
    if p is not None and not 0.0 <= p <= 1.0:
        raise ValueError(f"carbon.{op}: p must be in [0, 1], got {p}")
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("carbon::bernoulli")
def _bernoulli_fake(probs: Tensor, seed: int, offset: int, p: Optional[float] = None) -> Tensor:
    return _random_tensor_fake("bernoulli", probs, p, offset)


@torch.library.register_fake("carbon::bernoulli.state")
def _bernoulli_state_fake(probs: Tensor, state: Tensor, p: Optional[float] = None) -> Tensor:
    _check_state("bernoulli", state, probs.device)
    return _random_tensor_fake("bernoulli", probs, p, None)


@torch.library.register_fake("carbon::dropout")
def _dropout_fake(x: Tensor, p: float, seed: int, offset: int) -> Tensor:
    return _random_tensor_fake("dropout", x, p, offset)


@torch.library.register_fake("carbon::dropout.state")
def _dropout_state_fake(x: Tensor, p: float, state: Tensor) -> Tensor:
    _check_state("dropout", state, x.device)
    return _random_tensor_fake("dropout", x, p, None)


# ---- optimizers, gradient clipping (csrc/optim/; contract §12) ----
# The fused steps update their tensors in place and return nothing.


@torch.library.register_fake("carbon::adam_step_")
def _adam_step_fake(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, lr, beta1, beta2, eps, weight_decay,
                    bias_correction1, bias_correction2_sqrt, decoupled, maximize) -> None:
    return None


@torch.library.register_fake("carbon::adam_step_capturable_")
def _adam_step_capturable_fake(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, lr_tensor, beta1,
                               beta2, eps, weight_decay, decoupled, maximize) -> None:
    return None


@torch.library.register_fake("carbon::sgd_step_")
def _sgd_step_fake(params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov, maximize,
                   first_step) -> None:
    return None


@torch.library.register_fake("carbon::sum_squares")
def _sum_squares_fake(tensors, sqrt=False) -> Tensor:
    if len(tensors) == 0:
        raise ValueError("carbon.sum_squares: expected at least one tensor")
    for i, t in enumerate(tensors):
        _check_dtype("sum_squares", f"tensors[{i}]", t)
    return tensors[0].new_empty((), dtype=torch.float32)


@torch.library.register_fake("carbon::clip_scale_")
def _clip_scale_fake(grads, total_norm, max_norm, eps=1e-6) -> None:
    return None
# ---- end optimizers ----
