"""Test data: seeded random matrices and exactly constructed values."""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import torch

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPES = (F32, BF16, F16)
# (a dtype, b dtype, out_dtype argument): every combination, out_dtype None = promoted
DTYPE_COMBOS = list(itertools.product(DTYPES, DTYPES, (None,) + DTYPES))

# Exponent spread of random data per dtype: wide, but keeping float16's
# products and sums mostly finite.
DEFAULT_SPREAD = {F32: 20, BF16: 20, F16: 3}


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_values(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator,
                  spread: Optional[int] = None, scale_exp: int = 0) -> torch.Tensor:
    """Normal samples times 2^e, e uniform in [-spread, spread] per element
    (times 2^scale_exp overall), converted to `dtype`."""
    spread = DEFAULT_SPREAD[dtype] if spread is None else spread
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    e = torch.randint(-spread, spread + 1, tuple(shape), generator=g, dtype=torch.int64)
    return (x * torch.pow(2.0, (e + scale_exp).double())).to(dtype)


def exact_tensor(values, dtype: torch.dtype) -> torch.Tensor:
    """A tensor holding exactly the given Python floats (asserts none is rounded)."""
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    back = t.double()
    src = torch.tensor(values, dtype=torch.float64)
    same = (back == src) | (back.isnan() & src.isnan())
    assert bool(same.all()) and bool((back.signbit() == src.signbit()).all()), \
        f"{values} is not exactly representable in {dtype}"
    return t


PRECISION = {F32: (24, -126), BF16: (8, -126), F16: (11, -14)}


def _representable(x: float, dtype) -> bool:
    return torch.tensor(x, dtype=torch.float64).to(dtype).item() == x


def tie_rows(a_dtype, out_dtype, rows, K, nudge, rng, pairs=1):
    """Rows of `a` (values of a_dtype, shuffled, zero-padded to K) whose plain
    sum is a tie of out_dtype: v + ulp(v)/2 with v a random out_dtype value
    (split into a_dtype-sized chunks when a_dtype is narrower), plus `pairs`
    pairs y, -y that cancel, plus, when nudge is nonzero, a term
    nudge * |ulp(v)/2| (or a larger one if a_dtype cannot hold it) that moves
    the sum just off the tie. (rng: a random.Random.)"""
    p_out, emin_out = PRECISION[out_dtype]
    p_in = PRECISION[a_dtype][0]
    e_range = (-10, 10) if F16 in (a_dtype, out_dtype) else (-40, 40)
    result = []
    while len(result) < rows:
        E = rng.randint(*e_range)
        m = rng.randrange(2 ** (p_out - 1), 2**p_out)
        sign = rng.choice([1.0, -1.0])
        lsb = E - p_out + 1
        chunks = []
        for shift in range(0, p_out, p_in):  # p_in-bit pieces of m, lowest first
            piece = (m >> shift) & ((1 << p_in) - 1)
            if piece:
                chunks.append(sign * math.ldexp(piece, lsb + shift))
        half = sign * math.ldexp(1.0, lsb - 1)
        terms = chunks + [half]
        for _ in range(pairs):
            y = math.ldexp(rng.choice([1.0, -1.0]) * rng.randrange(1, 2**p_in), E + rng.randint(-2, 2) - p_in + 1)
            terms += [y, -y]
        if nudge:  # the first of these sizes that a_dtype can hold
            sizes = [t for t in (abs(nudge), 2.0**-12, 2.0**-4, 0.5) if _representable(abs(half) * t, a_dtype)]
            terms.append(math.copysign(abs(half) * sizes[0], nudge) if sizes else math.nan)
        if not all(_representable(t, a_dtype) for t in terms) or not (emin_out <= E):
            continue
        assert len(terms) <= K
        terms += [0.0] * (K - len(terms))
        rng.shuffle(terms)
        result.append(terms)
    return result
