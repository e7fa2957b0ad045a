"""Independent reference of docs/contract.md §12 (optimizer updates and
gradient clipping), written with Python floats (IEEE fp64, one rounding per
operation) and exact fractions; nothing here calls carbon.

The final roundings: to float32 through numpy's float64 -> float32 cast
(round to nearest even, subnormals kept); to bfloat16 / float16 through
oracle.round_bits of the exact value (integer arithmetic)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Optional, Sequence

import numpy as np
import torch

from oracle import bits_to_float, round_bits


def rn32(x: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def rn(x, dtype: torch.dtype) -> float:
    """RN_dtype of a Python float or of an exact Fraction (rounded once)."""
    if dtype == torch.float32 and not isinstance(x, Fraction):
        return rn32(x)
    return bits_to_float(round_bits(x, dtype), dtype)


def beta_power(beta: float, t: int) -> float:
    """beta^t by binary exponentiation from the lowest exponent bit, as the
    contract defines it: the factors beta^(2^i) are built by repeated
    squaring and multiplied, lowest first, into 1.0."""
    squares = [beta]
    while (1 << len(squares)) <= t:
        squares.append(squares[-1] * squares[-1])
    acc = 1.0
    for i, sq in enumerate(squares):
        if (t >> i) & 1:
            acc = acc * sq
    return acc


def ieee_maximum(a: float, b: float) -> float:
    """IEEE 754-2019 maximum: NaN if either is NaN, -0 < +0, else the larger."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b == 0.0:
        return 0.0 if math.copysign(1.0, a) > 0 or math.copysign(1.0, b) > 0 else -0.0
    return a if a > b else b


def adam_reference(p: List[float], g: List[float], m: List[float], v: List[float], t: int, *, lr: float,
                   beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool, maximize: bool,
                   dtype: torch.dtype, v_max: Optional[List[float]] = None):
    """One step: new (p, m, v) lists of values; with AMSGrad's state v_max
    (max_exp_avg_sq) given, new (p, m, v, v_max)."""
    c1 = 1.0 - beta_power(beta1, t)
    c2s = math.sqrt(1.0 - beta_power(beta2, t))
    step_size = lr / c1
    decay = 1.0 - lr * weight_decay
    out_p, out_m, out_v, out_w = [], [], [], []
    for i, (pi, gi, mi, vi) in enumerate(zip(p, g, m, v)):
        gp = -gi if maximize else gi
        if decoupled:
            p0 = pi * decay
        else:
            p0 = pi
            if weight_decay != 0.0:
                gp = gp + weight_decay * pi
        m1 = rn32(beta1 * mi + (1.0 - beta1) * gp)
        v1 = rn32(beta2 * vi + (1.0 - beta2) * (gp * gp))
        source = v1
        if v_max is not None:
            source = ieee_maximum(v_max[i], v1)
            out_w.append(source)
        root = math.sqrt(source) if not (source < 0.0) else math.nan  # math.sqrt raises for negatives
        denom = root / c2s + eps
        out_p.append(rn(p0 - (step_size * m1) / denom, dtype))
        out_m.append(m1)
        out_v.append(v1)
    if v_max is not None:
        return out_p, out_m, out_v, out_w
    return out_p, out_m, out_v


def sgd_reference(p: List[float], g: List[float], b: List[float], first: bool, *, lr: float, momentum: float,
                  dampening: float, weight_decay: float, nesterov: bool, maximize: bool, dtype: torch.dtype):
    """One step: new (p, b) lists (b unchanged when momentum is 0)."""
    out_p, out_b = [], []
    for pi, gi, bi in zip(p, g, b):
        gp = -gi if maximize else gi
        if weight_decay != 0.0:
            gp = gp + weight_decay * pi
        d = gp
        b1 = bi
        if momentum != 0.0:
            b1 = rn32(gp) if first else rn32(momentum * bi + (1.0 - dampening) * gp)
            d = gp + momentum * b1 if nesterov else b1
        out_p.append(rn(pi - lr * d, dtype))
        out_b.append(b1)
    return out_p, out_b


def values(t: torch.Tensor) -> List[float]:
    return t.detach().cpu().double().flatten().tolist()


def from_values(vals: Sequence[float], like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` holding the given (representable) values exactly."""
    return torch.tensor(list(vals), dtype=torch.float64).reshape(like.shape).to(dtype)


def sum_squares_bits(tensors: Sequence[torch.Tensor]) -> int:
    """float32 bits of RN32(exact sum of g^2), from fractions."""
    total = Fraction(0)
    for t in tensors:
        for x in values(t):
            total += Fraction(x) * Fraction(x)
    return round_bits(total, torch.float32)


def l2_norm_value(tensors: Sequence[torch.Tensor]) -> float:
    """RN32(sqrt(S)) with S = RN32(exact sum of squares): the exact square
    root rounded once (decided with integers: r is RN32(sqrt S) iff the
    midpoints around r bracket sqrt S)."""
    s = bits_to_float(sum_squares_bits(tensors), torch.float32)
    if math.isinf(s):
        return math.inf
    guess = rn32(math.sqrt(s))
    fs = Fraction(s)
    for cand in (guess, float(np.nextafter(np.float32(guess), np.float32(0))),
                 float(np.nextafter(np.float32(guess), np.float32(np.inf)))):
        lo = (Fraction(cand) + Fraction(float(np.nextafter(np.float32(cand), np.float32(0))))) / 2
        hi = (Fraction(cand) + Fraction(float(np.nextafter(np.float32(cand), np.float32(np.inf))))) / 2
        if cand == 0.0:
            lo = Fraction(0)
        # ties cannot occur: a square root of a float32 is never a float32 midpoint
        if lo * lo <= fs <= hi * hi:
            return cand
    raise AssertionError("no candidate")


def clip_coefficient(total: float, max_norm: float) -> float:
    coef = rn32(max_norm / (total + 1e-6))
    return 1.0 if coef > 1.0 else coef


def scaled_values(t: torch.Tensor, coef: float) -> torch.Tensor:
    # zero and non-finite products: the IEEE product (exact, signed zero kept)
    return from_values([rn(Fraction(x) * Fraction(coef), t.dtype) if math.isfinite(x) and x * coef != 0 else x * coef
                        for x in values(t)], t, t.dtype)
