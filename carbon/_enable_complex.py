"""carbon.enable's routes for complex64 tensors (docs/enable.md, "Complex numbers"): elementwise products, quotients
and exp (rotary embeddings, S4D's Vandermonde kernels), sums, the matrix products spectral layers multiply their
Fourier modes with (FNO's einsum → bmm), a spectrum's magnitude and phase (abs, angle, sgn: |STFT| features and
their gradients), torch.polar, complex random draws (FNO's `torch.rand(..., dtype=cfloat)` weights) and the foreach
steps of clip_grad_norm_ over a model with complex parameters.

torch computes a complex product, quotient or modulus as several roundings it fuses differently per device (CUDA's
complex kernels are compiled with contraction on, its division scales like numpy's); here each is a fixed
sequence: IEEE operations in float32 (mul), an exact sum rounded once (matrix products), a binary64 expression
rounded once (div, exp), or carbon's correctly rounded float32 hypot / atan2 / cos / sin.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import Tensor

from carbon import _enable_allow
from carbon import _enable_routes as routes

__all__ = ["COMPLEX", "from_parts", "parts", "polar"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _need_complex64(op: str, *tensors: Tensor) -> None:
    for t in tensors:
        if t.is_complex() and t.dtype != torch.complex64:
            raise routes.NotCovered(f"complex {op} in {t.dtype}: carbon computes complex64 (float32 parts)")


def _promoted(op: str, x: Any, y: Any) -> Tuple[Any, Any]:
    """Both operands of a binary op whose result (torch's type promotion) must be complex64: complex operands
    (tensors, 0-dim wrapped scalars such as the 1j of ``1j * t``, Python complex numbers) as complex64 tensors,
    as torch converts them; real ones unchanged."""
    dtype = torch.result_type(x, y)
    if dtype != torch.complex64:
        raise routes.NotCovered(f"complex {op} in {dtype}: carbon computes complex64 (float32 parts)")

    def cast(v: Any, other: Any) -> Any:
        if isinstance(v, complex):
            device = other.device if isinstance(other, Tensor) else None
            return torch.full([], v, dtype=torch.complex64, device=device)
        if isinstance(v, Tensor) and v.is_complex() and v.dtype != torch.complex64:
            return v.to(torch.complex64)
        if isinstance(v, Tensor) and v.is_floating_point() and v.dtype not in routes._CARBON_DTYPES:
            raise routes.NotCovered(f"complex {op} with a {v.dtype} tensor")
        return v
    return cast(x, y), cast(y, x)


def _is_complex(v: Any) -> bool:
    return isinstance(v, Tensor) and v.is_complex()


def parts(z: Tensor) -> Tuple[Tensor, Tensor]:
    """The float32 real and imaginary parts of a complex64 tensor (a conjugated view resolved exactly), contiguous."""
    z = z.resolve_conj().resolve_neg()
    return aten.real(z).contiguous(), aten.imag(z).contiguous()


def from_parts(re: Tensor, im: Tensor) -> Tensor:
    """The complex64 tensor of two float32 parts."""
    return aten.complex(re.contiguous(), im.contiguous())


# ---- elementwise arithmetic -------------------------------------------------------------------------------------

def _mul(a: dict) -> Tensor:
    """(a + bi)(c + di) = RN(RN(a·c) − RN(b·d)) + RN(RN(a·d) + RN(b·c))·i, each product and the sum rounded
    (torch fuses them into fmas on some devices, not on others); by a real factor r: RN(a·r) + RN(b·r)·i."""
    x, y = _promoted("mul", a["self"], a["other"])
    if not _is_complex(x):
        x, y = y, x
    xr, xi = parts(x)
    if _is_complex(y):
        yr, yi = parts(y)
        return from_parts(aten.sub(aten.mul(xr, yr), aten.mul(xi, yi)), aten.add(aten.mul(xr, yi), aten.mul(xi, yr)))
    return from_parts(aten.mul(xr, y), aten.mul(xi, y))


def _wide(t: Any) -> Any:
    return t.to(torch.float64) if isinstance(t, Tensor) else float(t)


def _div(a: dict) -> Any:
    """x / y. By a real y: RN(a / y) + RN(b / y)·i. By a complex y = c + di, in binary64 (every float32 product
    exact there, no overflow or underflow of the squares): den = RN64(c² + d²), re = RN32(RN64(RN64(a·c + b·d) /
    den)), im = RN32(RN64(RN64(b·c − a·d) / den)) (b = 0 for a real x). torch's kernels scale by the larger of
    |c|, |d| first (numpy's rule) in float32, with device-dependent fusing."""
    if a.get("rounding_mode") is not None:
        return routes.PASS  # torch's own error for complex operands
    x, y = _promoted("div", a["self"], a["other"])
    if not _is_complex(y):
        xr, xi = parts(x)
        return from_parts(routes.true_divide(xr, y), routes.true_divide(xi, y))
    c, d = (t.to(torch.float64) for t in parts(y))
    den = aten.add(aten.mul(c, c), aten.mul(d, d))
    if _is_complex(x):
        xr, xi = (t.to(torch.float64) for t in parts(x))
        re = aten.add(aten.mul(xr, c), aten.mul(xi, d))
        im = aten.sub(aten.mul(xi, c), aten.mul(xr, d))
    else:
        xr = _wide(x)
        re, im = aten.mul(c, xr), aten.neg(aten.mul(d, xr))
    return from_parts(aten.div(re, den).to(torch.float32), aten.div(im, den).to(torch.float32))


def _reciprocal(a: dict) -> Tensor:
    """1 / z as _div's 1 / (c + di): RN32(RN64(c / den)) − RN32(RN64(d / den))·i (``1 / z`` in Python)."""
    z = a["self"]
    _need_complex64("reciprocal", z)
    return _div({"self": 1.0, "other": z})


def _exp(a: dict) -> Tensor:
    """e^(a + bi) = RN32(RN64(EXP(a)·COS(b))) + RN32(RN64(EXP(a)·SIN(b)))·i with carbon's float64 exp, cos and sin
    (correctly rounded in binary64), so each part is within about one binary64 rounding of the exact value
    before its single float32 rounding."""
    z = a["self"]
    _need_complex64("exp", z)
    re, im = (t.to(torch.float64) for t in parts(z))
    scale = carbon_ops.exp(re)
    return from_parts(aten.mul(scale, carbon_ops.cos(im)).to(torch.float32),
                    aten.mul(scale, carbon_ops.sin(im)).to(torch.float32))


def _sum(a: dict) -> Tensor:
    """Each part summed exactly and rounded once (carbon.sum over the float32 parts)."""
    x, dim, keepdim = a["self"], a.get("dim"), a.get("keepdim", False)
    _need_complex64("sum", x)
    if a.get("dtype") not in (None, x.dtype):
        raise routes.NotCovered("complex sum with a dtype argument")
    parts = aten.view_as_real(x.resolve_conj())
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else [d % x.dim() for d in dim]
    total = carbon_ops.sum(parts.contiguous(), dims, keepdim, None) if dims else parts
    return aten.view_as_complex(total.contiguous())


def polar(a: dict) -> Tensor:
    """abs·e^{i·angle} (real arguments: in ROUTES): RN(abs·COS(angle)) + RN(abs·SIN(angle))·i with carbon's
    float32 cos and sin."""
    r, theta = a["abs"], a["angle"]
    routes._need_carbon_dtype("polar", r, theta)
    if r.dtype != torch.float32 or theta.dtype != torch.float32:
        raise routes.NotCovered("polar of non-float32 tensors")
    return aten.complex(aten.mul(r, carbon_ops.cos(theta)), aten.mul(r, carbon_ops.sin(theta)))


# ---- products --------------------------------------------------------------------------------------------------

def _block_operands(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    """[x_re, x_im] (..., M, 2K) and [[y_re, y_im], [−y_im, y_re]] (..., 2K, 2N): their real product holds the
    complex product's real parts in its first N columns and its imaginary parts in the last N."""
    xr, xi = parts(x)
    yr, yi = parts(y)
    left = aten.cat([xr, xi], -1).contiguous()
    right = aten.cat([aten.cat([yr, yi], -1), aten.cat([aten.neg(yi), yr], -1)], -2).contiguous()
    return left, right


def _split_columns(p: Tensor) -> Tensor:
    n = p.shape[-1] // 2
    return from_parts(p[..., :n], p[..., n:])


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
    return carbon_ops.hypot(*parts(z))


def _angle(a: dict) -> Any:
    """arg z = ATAN2(im, re): carbon's correctly rounded float32 atan2."""
    z = a["self"]
    _need_complex64("angle", z)
    re, im = parts(z)
    return carbon_ops.atan2(im, re)


def _sgn(a: dict) -> Any:
    """z / |z| as (RN(re / HYPOT(re, im)), RN(im / HYPOT(re, im))), 0 where z = 0 (torch's rule; abs's gradient)."""
    z = a["self"]
    _need_complex64("sgn", z)
    re, im = parts(z)
    r = carbon_ops.hypot(re, im)
    zero = aten.eq(r, 0)
    return from_parts(aten.where(zero, 0.0, aten.div(re, r)), aten.where(zero, 0.0, aten.div(im, r)))


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

def _vector_norm(a: dict) -> Tensor:
    """linalg_vector_norm of a complex64 tensor (spectral losses, torch.linalg.norm of a spectrum): ord 2 is the
    float view's exact 2-norm, √RN(exact Σ re² + im²) over the dims (their parts' axis added); another ord is the
    real route's norm of the moduli HYPOT(re, im) (ord 1: RN(exact Σ |z|), ∞: max |z|, …)."""
    z, ord_, dim, keepdim = a["self"], a["ord"], a["dim"], a["keepdim"]
    _need_complex64("linalg_vector_norm", z)
    if a.get("dtype") not in (None, torch.float32):
        raise routes.NotCovered("complex linalg_vector_norm with a dtype argument")
    dims = list(range(z.dim())) if dim is None or len(dim) == 0 else [d % z.dim() for d in dim]
    if ord_ == 2:
        view = aten.view_as_real(z.resolve_conj())
        norm = routes._vector_norm({"self": view, "ord": 2, "dim": dims + [z.dim()], "keepdim": True, "dtype": None})
        norm = norm.squeeze(-1)
        return norm if keepdim else (norm.squeeze(dims) if dims else norm)
    moduli = carbon_ops.hypot(*parts(z))
    return routes._vector_norm({"self": moduli, "ord": ord_, "dim": dim, "keepdim": keepdim, "dtype": None})


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
    "mul": _mul, "div": _div, "reciprocal": _reciprocal, "exp": _exp, "sum": _sum, "mm": _mm, "bmm": _bmm, "abs": _abs, "angle": _angle, "sgn": _sgn,
    "rand": _rand, "randn": _randn, "rand_like": _like(False), "randn_like": _like(True), "uniform": _uniform_,
    "normal": _normal_, "linalg_vector_norm": _vector_norm, "_foreach_norm": _foreach_norm, "_foreach_mul": _foreach_mixed("mul"),
}
