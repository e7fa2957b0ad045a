"""High-precision reference for Carbon's elementwise math, written from the
definitions alone (mpmath at 256 bits; never imports carbon).

``expected_bits(name, x, dtype)`` returns the set of acceptable result bits:
the correctly rounded value RN(f(x)), plus its neighbour when f(x) lies so
close to a rounding midpoint (within the relative tolerance ``rel``) that
Carbon's documented error bound (< 2^-40 relative before the one rounding)
allows either. Derivatives: ``grad_expected_bits(name, g, x, dtype)`` for
RN(g * f'(x)), with an absolute slack near zeros of f' (docs/contract.md §6).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Set

import mpmath as mp
import torch

from oracle import fmt_of, round_bits

mp.mp.prec = 256
REL = Fraction(1, 2**41)  # tolerance around midpoints: 2^-41 relative (2^-17 float32 ulp)

FORWARD = ("exp", "log", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "sin", "cos", "log1p", "softplus",
           "log_sigmoid", "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos",
           "erfinv", "asinh", "acosh", "atanh")
A = mp.mpf("0.044715")
C = mp.sqrt(2 / mp.pi)


def _Phi(x):
    return mp.erfc(-x / mp.sqrt(2)) / 2


def _phi(x):
    return mp.exp(-x * x / 2) / mp.sqrt(2 * mp.pi)


def _sigmoid(x):
    return 1 / (1 + mp.exp(-x))


def value(name: str, x: float):
    """f(x) as an mpf for finite x (special results as Python floats)."""
    X = mp.mpf(x)
    if name == "exp":
        return mp.exp(X)
    if name == "log":
        if x < 0:
            return math.nan
        if x == 0:
            return -math.inf
        return mp.log(X)
    if name == "tanh":
        return mp.tanh(X)
    if name == "sigmoid":
        return _sigmoid(X)
    if name == "erf":
        return mp.erf(X)
    if name == "gelu":
        return X * _Phi(X)
    if name == "gelu_tanh":
        # (1 + tanh u)/2 = 1/(1 + e^{-2u}): no cancellation at mpmath's precision
        return X / (1 + mp.exp(-2 * C * (X + A * X**3)))
    if name == "silu":
        return X * _sigmoid(X)
    # mpmath reduces large arguments at a working precision grown by their
    # magnitude, so sin(1e38) is as accurate as sin(1).
    if name == "sin":
        return mp.sin(X)
    if name == "cos":
        return mp.cos(X)
    if name == "log1p":
        if x < -1:
            return math.nan
        if x == -1:
            return -math.inf
        return mp.log1p(X)
    if name == "softplus":
        return mp.log1p(mp.exp(X))
    if name == "log_sigmoid":
        return -mp.log1p(mp.exp(-X))
    if name == "expm1":
        return mp.expm1(X)
    if name in ("log2", "log10"):
        if x < 0:
            return math.nan
        if x == 0:
            return -math.inf
        return mp.log(X) / mp.log(2 if name == "log2" else 10)
    if name == "exp2":
        return mp.power(2, X)
    if name == "erfc":
        return mp.erfc(X)
    if name == "sinh":
        return mp.sinh(X)
    if name == "cosh":
        return mp.cosh(X)
    if name == "tan":
        return mp.tan(X)  # reduced at a working precision grown by |x|, as sin
    if name == "atan":
        return mp.atan(X)
    if name in ("asin", "acos"):
        if abs(x) > 1:
            return math.nan
        return mp.asin(X) if name == "asin" else mp.acos(X)
    if name in ("erfinv", "atanh"):
        if abs(x) > 1:
            return math.nan
        if abs(x) == 1:
            return math.copysign(math.inf, x)
        return mp.erfinv(X) if name == "erfinv" else mp.atanh(X)
    if name == "asinh":
        return mp.asinh(X)
    if name == "acosh":
        return math.nan if x < 1 else mp.acosh(X)
    if name in ("lgamma", "digamma", "trigamma", "tetragamma"):
        return _gamma_family(name, x)
    raise ValueError(name)


def _is_pole(x: float) -> bool:
    return x <= 0 and x == math.floor(x)


def _gamma_family(name: str, x: float):
    """lgamma = log|Gamma|, digamma = psi, trigamma = psi', tetragamma = psi'' (mpmath), with the poles'
    values of the contract: lgamma +inf at 0 and the negative integers; psi -1/x at +-0 and NaN at the
    negative integers; psi' +inf at both; psi'' -2/x^3 at +-0 and NaN at the negative integers."""
    X = mp.mpf(x)
    if name == "lgamma":
        if _is_pole(x):
            return math.inf
        return 0.0 if x in (1.0, 2.0) else mp.re(mp.loggamma(X))
    if x == 0:
        return {"digamma": -math.copysign(math.inf, x), "trigamma": math.inf,
                "tetragamma": -math.copysign(math.inf, x)}[name]
    if _is_pole(x):
        return math.inf if name == "trigamma" else math.nan
    n = {"digamma": 0, "trigamma": 1, "tetragamma": 2}[name]
    if x < -100 and n > 0:
        # mpmath's psi(n, x) is slow (~25 s) far below 0: the reflection formulas at 256 bits
        s, c = mp.sinpi(X), mp.cospi(X)
        return mp.pi**2 / s**2 - mp.psi(1, 1 - X) if n == 1 else mp.psi(2, 1 - X) - 2 * mp.pi**3 * c / s**3
    return mp.psi(n, X)


def derivative(name: str, x: float):
    """(f'(x), scale): scale is the size of the terms that f' sums, for the
    absolute slack near its zeros."""
    X = mp.mpf(x)
    if name == "exp":
        v = mp.exp(X)
        return v, abs(v)
    if name == "log":
        if x < 0:
            return math.nan, 0
        if x == 0:
            return math.inf, 0
        return 1 / X, abs(1 / X)
    if name == "tanh":
        v = 1 / mp.cosh(X) ** 2
        return v, v
    if name == "sigmoid":
        v = _sigmoid(X) * _sigmoid(-X)
        return v, v
    if name == "erf":
        v = 2 / mp.sqrt(mp.pi) * mp.exp(-X * X)
        return v, v
    if name == "gelu":
        p, t = _Phi(X), X * _phi(X)
        return p + t, abs(p) + abs(t)
    if name == "gelu_tanh":
        u = C * (X + A * X**3)
        # (1 + tanh u)/2 = s and (1 - tanh^2 u)/2 = 2 s (1 - s), s = 1/(1 + e^{-2u})
        s, one_minus_s = 1 / (1 + mp.exp(-2 * u)), 1 / (1 + mp.exp(2 * u))
        p, t = s, X * 2 * s * one_minus_s * C * (1 + 3 * A * X * X)
        return p + t, abs(p) + abs(t)
    if name == "silu":
        s, one_minus_s = _sigmoid(X), _sigmoid(-X)
        p, t = s, X * s * one_minus_s
        return p + t, abs(p) + abs(t)
    if name == "sin":
        v = mp.cos(X)
        return v, abs(v)
    if name == "cos":
        v = -mp.sin(X)
        return v, abs(v)
    if name == "log1p":
        if x < -1:
            return math.nan, 0
        if x == -1:
            return math.inf, 0
        v = 1 / (1 + X)
        return v, abs(v)
    if name == "softplus":
        v = _sigmoid(X)
        return v, v
    if name == "log_sigmoid":
        v = _sigmoid(-X)
        return v, v
    if name == "expm1":
        v = mp.exp(X)
        return v, v
    if name in ("log2", "log10"):
        if x < 0:
            return math.nan, 0
        if x == 0:
            return math.inf, 0
        v = 1 / (X * mp.log(2 if name == "log2" else 10))
        return v, abs(v)
    if name == "exp2":
        v = mp.power(2, X) * mp.log(2)
        return v, v
    if name == "erfc":
        v = -2 / mp.sqrt(mp.pi) * mp.exp(-X * X)
        return v, abs(v)
    if name == "sinh":
        v = mp.cosh(X)
        return v, v
    if name == "cosh":
        v = mp.sinh(X)
        return v, abs(v)
    if name == "tan":
        v = 1 / mp.cos(X) ** 2
        return v, v
    if name == "atan":
        v = 1 / (1 + X * X)
        return v, v
    if name in ("asin", "acos"):
        if abs(x) > 1:
            return math.nan, 0
        if abs(x) == 1:
            return (math.inf if name == "asin" else -math.inf), 0
        v = 1 / mp.sqrt(1 - X * X)
        return (v if name == "asin" else -v), v
    if name in ("erfinv", "atanh"):
        if abs(x) > 1:
            return math.nan, 0
        if abs(x) == 1:
            return math.inf, 0
        v = mp.sqrt(mp.pi) / 2 * mp.exp(mp.erfinv(X) ** 2) if name == "erfinv" else 1 / (1 - X * X)
        return v, v
    if name == "asinh":
        v = 1 / mp.sqrt(1 + X * X)
        return v, v
    if name == "acosh":
        if x < 1:
            return math.nan, 0
        if x == 1:
            return math.inf, 0
        v = 1 / mp.sqrt(X * X - 1)
        return v, v
    if name in ("lgamma", "digamma", "trigamma"):
        higher = {"lgamma": "digamma", "digamma": "trigamma", "trigamma": "tetragamma"}[name]
        v = _gamma_family(higher, x)
        if isinstance(v, float):
            return v, 0
        if name == "trigamma" and x < 0:
            # psi''(x) = psi''(1 - x) - 2 pi^3 cos(pi x) / sin^3(pi x): the bound is absolute in these terms
            return v, abs(mp.psi(2, 1 - X)) + abs(2 * mp.pi**3 * mp.cospi(X) / mp.sinpi(X) ** 3)
        return v, abs(v)
    raise ValueError(name)


# Limits at +-inf (and NaN) of each function and derivative.
_LIMITS = {
    "exp": (math.inf, 0.0), "log": (math.inf, math.nan), "tanh": (1.0, -1.0), "sigmoid": (1.0, 0.0),
    "erf": (1.0, -1.0), "gelu": (math.inf, -0.0), "gelu_tanh": (math.inf, -0.0), "silu": (math.inf, -0.0),
    "sin": (math.nan, math.nan), "cos": (math.nan, math.nan), "log1p": (math.inf, math.nan),
    "softplus": (math.inf, 0.0), "log_sigmoid": (-0.0, -math.inf), "expm1": (math.inf, -1.0),
    "log2": (math.inf, math.nan), "log10": (math.inf, math.nan), "exp2": (math.inf, 0.0), "erfc": (0.0, 2.0),
    "sinh": (math.inf, -math.inf), "cosh": (math.inf, math.inf), "tan": (math.nan, math.nan),
    "atan": (math.pi / 2, -math.pi / 2), "asin": (math.nan, math.nan), "acos": (math.nan, math.nan),
    "erfinv": (math.nan, math.nan), "asinh": (math.inf, -math.inf), "acosh": (math.inf, math.nan),
    "atanh": (math.nan, math.nan), "lgamma": (math.inf, math.inf), "digamma": (math.inf, math.nan),
    "trigamma": (0.0, math.nan),
}
_GRAD_LIMITS = {
    "exp": (math.inf, 0.0), "log": (0.0, math.nan), "tanh": (0.0, 0.0), "sigmoid": (0.0, 0.0),
    "erf": (0.0, 0.0), "gelu": (1.0, 0.0), "gelu_tanh": (1.0, 0.0), "silu": (1.0, 0.0),
    "sin": (math.nan, math.nan), "cos": (math.nan, math.nan), "log1p": (0.0, math.nan),
    "softplus": (1.0, 0.0), "log_sigmoid": (0.0, 1.0), "expm1": (math.inf, 0.0),
    "log2": (0.0, math.nan), "log10": (0.0, math.nan), "exp2": (math.inf, 0.0), "erfc": (-0.0, -0.0),
    "sinh": (math.inf, math.inf), "cosh": (math.inf, -math.inf), "tan": (math.nan, math.nan),
    "atan": (0.0, 0.0), "asin": (math.nan, math.nan), "acos": (math.nan, math.nan),
    "erfinv": (math.nan, math.nan), "asinh": (0.0, 0.0), "acosh": (0.0, math.nan), "atanh": (math.nan, math.nan),
    "lgamma": (math.inf, math.nan), "digamma": (0.0, math.nan), "trigamma": (-0.0, math.nan),
}


def _fraction(v) -> Fraction:
    """v exactly; magnitudes beyond 2^+-300 (which round to 0 or inf in every
    format, like their clamped stand-ins) are clamped to 2^+-300."""
    v = mp.mpf(v)
    if v != 0 and abs(v) < mp.mpf(2) ** -300:
        v = mp.sign(v) * mp.mpf(2) ** -300
    if abs(v) > mp.mpf(2) ** 300:
        v = mp.sign(v) * mp.mpf(2) ** 300
    sign, man, exp, _ = v._mpf_
    f = Fraction(int(man)) * (Fraction(2) ** int(exp))
    return -f if sign else f


def _bits_around(v, slack: Fraction, dtype: torch.dtype) -> Set[int]:
    """RN of every value in [v - slack, v + slack] (the two ends suffice)."""
    if isinstance(v, float):
        return {round_bits(v, dtype)}
    fv = _fraction(v)
    if fv == 0:
        return {round_bits(0.0, dtype)}
    return {round_bits(fv - slack, dtype), round_bits(fv, dtype), round_bits(fv + slack, dtype)}


def _zero_result_signs(bits: Set[int], dtype: torch.dtype) -> Set[int]:
    # A result that rounds to zero may be +-0 when the reference is exactly 0.
    sign = fmt_of(dtype).sign_bit
    return bits | {b ^ sign for b in bits if b & ~sign == 0}


def expected_bits(name: str, x: float, dtype: torch.dtype, rel: Fraction = REL) -> Set[int]:
    if math.isnan(x):
        return {fmt_of(dtype).nan_bits}
    if math.isinf(x):
        return {round_bits(_LIMITS[name][0 if x > 0 else 1], dtype)}
    if x == 0 and name in ("tanh", "erf", "gelu", "gelu_tanh", "silu", "sin", "log1p", "expm1", "sinh", "tan", "atan",
                           "asin", "erfinv", "asinh", "atanh"):
        return {round_bits(x, dtype)}  # odd or x*(...): keeps the sign of zero
    v = value(name, x)
    if isinstance(v, float):
        return {round_bits(v, dtype)}
    return _bits_around(v, abs(_fraction(v)) * rel, dtype)


def grad_expected_bits(name: str, g: float, x: float, dtype: torch.dtype, rel: Fraction = REL,
                       abs_slack: Fraction = Fraction(1, 2**50)) -> Set[int]:
    """Acceptable bits of RN(g * f'(x)) for finite g."""
    if math.isnan(x) or math.isnan(g):
        return {fmt_of(dtype).nan_bits}
    if math.isinf(x):
        d = _GRAD_LIMITS[name][0 if x > 0 else 1]
        return _zero_result_signs({round_bits(g * d if not (d == 0 and math.isinf(g)) else math.nan, dtype)}, dtype)
    d, scale = derivative(name, x)
    if isinstance(d, float):
        prod = g * d if not (g == 0 and math.isinf(d)) else math.nan
        return _zero_result_signs({round_bits(prod, dtype)}, dtype)
    v = mp.mpf(g) * d
    slack = abs(_fraction(v)) * rel + abs(Fraction(g)) * _fraction(scale) * abs_slack
    return _zero_result_signs(_bits_around(v, slack, dtype), dtype)
