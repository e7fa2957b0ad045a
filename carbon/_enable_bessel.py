"""carbon.enable's routes for the modified Bessel functions torch.special.i0, i0e, i1, i1e (torch.i0) and the Kaiser
window built on i0 (torch.kaiser_window; torchaudio's Kaiser-windowed resampling, FIR filter design). docs/enable.md
has the definitions.

torch evaluates them with Cephes' Chebyshev expansions in the input's precision, compiled differently per device.
Here each is one fixed binary64 expression per element, rounded once to float32 (bfloat16 / float16 inputs: that
float32 value rounded to their format, as torch's float32 opmath; float64 raises, binary64 being not enough for a
float64 result): with y = |x|,

* y < 30: the power series Σ_{k<80} t_k with t_0 = 1 (I₀) or y/2 (I₁) and t_k = RN(RN(t_{k−1}·q) / (k·(k + ν))),
  q = RN((y/2)²), added in order of k. Every term is positive, so the relative error stays below ~2⁻⁴⁶.
* y ≥ 30: Hankel's asymptotic series e^y / √(2πy) · Σ_{k<20} a_k with a_0 = 1 and
  a_k = RN(a_{k−1}·RN((( 2k − 1)² − 4ν²) / RN(8y·k))) (truncation below 2⁻⁵⁶ there).
* The scaled forms (i0e, i1e) multiply the series by EXP(−y) and leave e^y out of the asymptotic one; I₁ takes x's
  sign. EXP is carbon's correctly rounded float64 exp; √ is IEEE's binary64 square root (carbon.sqrt). ±∞ gives
  ∞ (I₀), ±∞ (I₁), 0 (the scaled forms); NaN gives NaN. For |x| < 2⁻¹⁰⁰, I₁ and I₁e are RN(|x|/2·(1 ± 2⁻⁴⁰)) with x's sign: the
  correction x²/8 (or −|x|) is lost in binary64 and x/2 can be a midpoint of float32's subnormal grid; the nudge
  puts it on the exact value's side without crossing another rounding boundary.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["BESSEL", "kaiser_window"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

_SERIES_BELOW = 30.0
_SERIES_TERMS = 80
_ASYMPTOTIC_TERMS = 20


def _series(y: Tensor, nu: int) -> Tensor:
    q = aten.mul(aten.mul(y, 0.5), aten.mul(y, 0.5))
    term = aten.ones_like(y) if nu == 0 else aten.mul(y, 0.5)
    total = term
    for k in range(1, _SERIES_TERMS):
        term = aten.div(aten.mul(term, q), float(k * (k + nu)))  # an exact integer divisor below 2^53
        total = aten.add(total, term)
    return total


def _asymptotic(y: Tensor, nu: int) -> Tensor:
    """Σ a_k (without e^y / √(2πy))."""
    mu = 4 * nu * nu
    eight_y = aten.mul(y, 8.0)
    a = aten.ones_like(y)
    total = a
    for k in range(1, _ASYMPTOTIC_TERMS):
        a = aten.mul(a, aten.div(aten.full_like(y, float((2 * k - 1) ** 2 - mu)), aten.mul(eight_y, float(k))))
        total = aten.add(total, a)
    return total


def _bessel(x: Tensor, nu: int, scaled: bool) -> Tensor:
    y = aten.abs(x.to(torch.float64))
    small = aten.lt(y, _SERIES_BELOW)
    safe_small = aten.where(small, y, 1.0)  # each branch on arguments it is meant for (no overflow, no 0 / 0)
    safe_large = aten.where(small, _SERIES_BELOW, y)
    series = _series(safe_small, nu)
    if scaled:
        series = aten.mul(series, carbon_ops.exp(aten.neg(safe_small)))
    root = routes.sqrt_rn(aten.mul(safe_large, 2 * math.pi))
    large = aten.div(_asymptotic(safe_large, nu), root)
    if not scaled:
        large = aten.mul(carbon_ops.exp(safe_large), large)
    value = aten.where(small, series, large)
    infinite = aten.isinf(y)
    value = aten.where(infinite, 0.0 if scaled else math.inf, value)
    value = aten.where(aten.isnan(y), math.nan, value)
    if nu == 1:
        # |x| < 2⁻¹⁰⁰: I₁ = x/2·(1 + x²/8 + …) and I₁e = x/2·(1 − |x| + …), whose corrections binary64 loses; x/2
        # itself can be a midpoint of float32's subnormal grid, so it is nudged by 2⁻⁴⁰ to the side the exact value
        # lies on (no other rounding boundary is that close to x/2).
        nudge = 1 - 2.0 ** -40 if scaled else 1 + 2.0 ** -40
        value = aten.where(aten.lt(y, 2.0 ** -100), aten.mul(aten.mul(y, 0.5), nudge), value)
        value = aten.where(aten.signbit(x), aten.neg(value), value)
    return value


def _route(name: str, nu: int, scaled: bool) -> Callable[[dict], Any]:
    def handler(a: dict) -> Any:
        x = a["self"]
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())  # torch's promotion of integer inputs
        routes._need_carbon_dtype(name, x)  # float64: a binary64 evaluation is not enough for its result
        value = _bessel(x, nu, scaled).to(torch.float32)
        return value if x.dtype == torch.float32 else carbon_ops.round_to(value, x.dtype, 1)
    return handler


def kaiser_window(a: dict) -> Any:
    """torch's sequence in float32 with carbon's i0 and correctly rounded operations: N = L + 1 points (periodic) or
    L, α = (N − 1)/2, t = RN((i − α) / α), s = √RN(1 − RN(t·t)) (|·| first, as torch), w = RN(I0(RN(β·s)) /
    I0(β)) with β rounded to float32; the first L. float32 only."""
    length, periodic, beta = a["window_length"], bool(a.get("periodic", True)), float(a.get("beta", 12.0))
    dtype = a.get("dtype") or torch.get_default_dtype()
    device = torch.device(a.get("device") or "cpu")
    if length < 0 or a.get("layout") not in (None, torch.strided) or not dtype.is_floating_point:
        return routes.PASS
    if dtype != torch.float32:
        raise routes.NotCovered(f"kaiser_window in {dtype}: carbon computes float32 Kaiser windows")
    if length <= 1:
        return aten.ones([length], dtype=dtype, device=device)
    n = length + 1 if periodic else length
    alpha = (n - 1) / 2.0
    i = aten.arange(n, dtype=torch.float32, device=device)
    t = routes.true_divide(aten.sub(i, alpha), alpha)
    s = routes.sqrt_rn(aten.abs(aten.rsub(aten.mul(t, t), 1.0)))
    beta32 = torch.full([], beta, dtype=torch.float32, device=device)
    top = _bessel(aten.mul(s, beta32), 0, False).to(torch.float32)
    bottom = _bessel(beta32, 0, False).to(torch.float32)
    return routes.true_divide(top, bottom)[:length].contiguous()


BESSEL = {"i0": _route("i0", 0, False), "special_i0": _route("i0", 0, False),
          "special_i0e": _route("i0e", 0, True), "special_i1": _route("i1", 1, False),
          "special_i1e": _route("i1e", 1, True), "kaiser_window": kaiser_window}
