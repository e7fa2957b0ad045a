"""carbon.enable's routes for complex64 tensors beyond copies, add and mul (docs/enable.md): the matrix products
spectral layers multiply their Fourier modes with (FNO's einsum → bmm), a spectrum's magnitude and phase (abs,
angle, sgn: |STFT| features and their gradients), complex random draws (FNO's `torch.rand(..., dtype=cfloat)`
weights) and the foreach steps of clip_grad_norm_ over a model with complex parameters.

torch computes a complex product or modulus as several roundings it fuses differently per device (CUDA's
complex kernels are compiled with contraction on); here each part is one exact sum rounded once (products) or
carbon's correctly rounded float32 hypot / atan2.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import Tensor

from carbon import _enable_allow
from carbon import _enable_routes as routes

__all__ = ["COMPLEX"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _need_complex64(op: str, *tensors: Tensor) -> None:
    for t in tensors:
        if t.is_complex() and t.dtype != torch.complex64:
            raise routes.NotCovered(f"complex {op} in {t.dtype}: carbon computes complex64 (float32 parts)")


def _parts(z: Tensor) -> Tuple[Tensor, Tensor]:
    """The float32 real and imaginary parts of a complex64 tensor (a conjugated view resolved exactly)."""
    z = z.resolve_conj().resolve_neg()
    return aten.real(z).contiguous(), aten.imag(z).contiguous()


def _complex(re: Tensor, im: Tensor) -> Tensor:
    return aten.complex(re.contiguous(), im.contiguous())


# ---- products --------------------------------------------------------------------------------------------------

def _block_operands(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    """[x_re, x_im] (..., M, 2K) and [[y_re, y_im], [−y_im, y_re]] (..., 2K, 2N): their real product holds the
    complex product's real parts in its first N columns and its imaginary parts in the last N."""
    xr, xi = _parts(x)
    yr, yi = _parts(y)
    left = aten.cat([xr, xi], -1).contiguous()
    right = aten.cat([aten.cat([yr, yi], -1), aten.cat([aten.neg(yi), yr], -1)], -2).contiguous()
    return left, right


def _split_columns(p: Tensor) -> Tensor:
    n = p.shape[-1] // 2
    return _complex(p[..., :n], p[..., n:])


def _mm(a: dict) -> Any:
    """mm of complex64 matrices: re = RN(exact Σ a_re·b_re − a_im·b_im), im = RN(exact Σ a_re·b_im + a_im·b_re)."""
    x, y = a["self"], a["mat2"]
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[0] or not (x.is_complex() and y.is_complex()):
        return routes.PASS  # torch's own error
    _need_complex64("mm", x, y)
    return _split_columns(carbon_ops.mm(*_block_operands(x, y), None))


def _bmm(a: dict) -> Any:
    """bmm of complex64 batches, each product as _mm's."""
    x, y = a["self"], a["mat2"]
    if x.dim() != 3 or y.dim() != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[1] \
            or not (x.is_complex() and y.is_complex()):
        return routes.PASS
    _need_complex64("bmm", x, y)
    return _split_columns(carbon_ops.bmm(*_block_operands(x, y), None))


# ---- modulus and phase -----------------------------------------------------------------------------------------

def _abs(a: dict) -> Any:
    """|z| = HYPOT(re, im): carbon's correctly rounded float32 hypot (torch's CPU std::abs and CUDA's differ)."""
    z = a["self"]
    _need_complex64("abs", z)
    return carbon_ops.hypot(*_parts(z))


def _angle(a: dict) -> Any:
    """arg z = ATAN2(im, re): carbon's correctly rounded float32 atan2."""
    z = a["self"]
    _need_complex64("angle", z)
    re, im = _parts(z)
    return carbon_ops.atan2(im, re)


def _sgn(a: dict) -> Any:
    """z / |z| as (RN(re / HYPOT(re, im)), RN(im / HYPOT(re, im))), 0 where z = 0 (torch's rule; abs's gradient)."""
    z = a["self"]
    _need_complex64("sgn", z)
    re, im = _parts(z)
    r = carbon_ops.hypot(re, im)
    zero = aten.eq(r, 0)
    return _complex(aten.where(zero, 0.0, aten.div(re, r)), aten.where(zero, 0.0, aten.div(im, r)))


# ---- random draws: torch fills a complex tensor's float view --------------------------------------------------

def _complex_dtype(op: str, dtype: torch.dtype) -> None:
    if dtype != torch.complex64:
        raise routes.NotCovered(f"{op} in {dtype}: carbon draws complex64 (float32 parts)")


def _draws(size: List[int], dtype: torch.dtype, device: Any, normal: bool, low: float, high: float) -> Tensor:
    """A complex64 tensor whose float view [..., 2] is one carbon draw per float, as torch fills it: uniform in
    [low, high), or normal with the given mean and std / √2 (torch's rule: the modulus then has variance std²)."""
    _complex_dtype("a complex draw", dtype)
    shape = list(size) + [2]
    if normal:
        values = routes._normal_values(shape, low, high / math.sqrt(2.0), torch.float32, device)
    else:
        values = routes._uniform_values(shape, low, high, torch.float32, device)
    return aten.view_as_complex(values)


def _rand(a: dict) -> Tensor:
    dtype, device = routes._factory(a)
    return _draws(a["size"], dtype, device, False, 0.0, 1.0)


def _randn(a: dict) -> Tensor:
    dtype, device = routes._factory(a)
    return _draws(a["size"], dtype, device, True, 0.0, 1.0)


def _like(normal: bool) -> Callable[[dict], Tensor]:
    def handler(a: dict) -> Tensor:
        x = a["self"]
        dtype = a.get("dtype") or x.dtype
        device = a.get("device") or x.device
        return _draws(list(x.shape), dtype, device, normal, 0.0, 1.0)
    return handler


def _uniform_(a: dict) -> Tensor:
    x = a["self"]
    return _draws(list(x.shape), x.dtype, x.device, False, float(a["from"]), float(a["to"]))


def _normal_(a: dict) -> Tensor:
    x = a.get("self")
    if x is None or isinstance(a.get("mean"), Tensor) or isinstance(a.get("std"), Tensor):
        raise routes.NotCovered("complex normal with tensor mean or std")
    return _draws(list(x.shape), x.dtype, x.device, True, float(a["mean"]), float(a["std"]))


# ---- foreach (clip_grad_norm_ over real and complex parameters) -----------------------------------------------

def _foreach_norm(a: dict) -> List[Tensor]:
    """A complex tensor's 2-norm is its float view's: √(Σ re² + im²), one exact sum (the real route's)."""
    out = []
    for t in a["self"]:
        if t.is_complex():
            _need_complex64("_foreach_norm", t)
            if a["ord"] != 2:
                raise routes.NotCovered(f"_foreach_norm of a complex tensor with ord={a['ord']}")
            t = aten.view_as_real(t.resolve_conj())
        out.extend(routes._foreach_norm(dict(a, self=[t])))
    return out


def _foreach_mixed(base: str) -> Callable:
    """``_foreach_<base>`` over a list holding complex tensors: each complex element by this module's (or
    carbon's complex mul) route, each real one by the real route."""
    real = routes._foreach(base)

    def handler(a: dict, route: Callable[[str, dict], Any]) -> List[Tensor]:
        def either(name: str, elem: dict) -> Any:
            if _enable_allow.has_complex((), elem):
                complex_route = routes.COMPLEX_ROUTES.get(name)
                if complex_route is None:
                    raise routes.NotCovered(f"_foreach_{base} of a complex tensor")
                return complex_route(elem)
            return route(name, elem)
        return real(a, either)
    handler.takes_route = True  # type: ignore[attr-defined]
    return handler


COMPLEX: Dict[str, Callable] = {
    "mm": _mm, "bmm": _bmm, "abs": _abs, "angle": _angle, "sgn": _sgn,
    "rand": _rand, "randn": _randn, "rand_like": _like(False), "randn_like": _like(True), "uniform": _uniform_,
    "normal": _normal_, "_foreach_norm": _foreach_norm, "_foreach_mul": _foreach_mixed("mul"),
}
