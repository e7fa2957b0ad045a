"""Shared checks of the layer_norm / rms_norm tests: run carbon, compare every
output bit for bit with tests/norm_reference.py (independent of carbon)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from data import F16, F32, generator, random_values
from norm_reference import layer_norm_backward_ref, layer_norm_ref, rms_norm_backward_ref, rms_norm_ref
from oracle import assert_bits_equal

F32 = torch.float32
NS = (1, 2, 3, 7, 64, 768, 1000, 4097)
AFFINE = ("none", "weight", "bias", "both")


def rows_for(n: int) -> int:
    return 3 if n <= 1000 else 2


def norm_data(rows: int, n: int, dtype: torch.dtype, seed: int, offset: bool = True) -> torch.Tensor:
    """Random rows of varied scale; with `offset`, each row also gets a common
    shift (so the mean is far from 0 and the centring cancels)."""
    g = generator(seed)
    spread = 2 if dtype == F16 else 8
    x = random_values((rows, n), dtype, g, spread=spread).double()
    if offset:
        shift = torch.randn((rows, 1), generator=g, dtype=torch.float64) * 4.0 ** torch.randint(-2, 3, (rows, 1), generator=g)
        x = x + shift
    return x.to(dtype)


def params(n_shape: Sequence[int], dtype: torch.dtype, affine: str, seed: int):
    g = generator(seed + 7)
    w = random_values(tuple(n_shape), dtype, g, spread=1) if affine in ("weight", "both") else None
    b = random_values(tuple(n_shape), dtype, g, spread=1) if affine in ("bias", "both") else None
    return w, b


def check_layer_norm(x: torch.Tensor, ns: Sequence[int], w=None, b=None, eps: float = 1e-5, context: str = ""):
    y, mean, rstd = torch.ops.carbon.layer_norm(x, list(ns), w, b, eps)
    ey, em, er = layer_norm_ref(x, ns, w, b, eps)
    assert_bits_equal(mean, em, f"{context} mean", dtype=F32)
    assert_bits_equal(rstd, er, f"{context} rstd", dtype=F32)
    assert_bits_equal(y, ey, f"{context} y", dtype=x.dtype)
    return y, mean, rstd


def check_rms_norm(x: torch.Tensor, ns: Sequence[int], w=None, eps: Optional[float] = None, context: str = ""):
    y, rstd = torch.ops.carbon.rms_norm(x, list(ns), w, eps)
    ey, er = rms_norm_ref(x, ns, w, eps)
    assert_bits_equal(rstd, er, f"{context} rstd", dtype=F32)
    assert_bits_equal(y, ey, f"{context} y", dtype=x.dtype)
    return y, rstd


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def check_layer_norm_grads(x, ns, w=None, b=None, eps: float = 1e-5, dy=None, seed: int = 0, context: str = ""):
    """Backward through autograd (dx, dweight, dbias) against the reference."""
    import carbon

    if dy is None:
        dy = random_values(tuple(x.shape), x.dtype, generator(seed + 11), spread=2)
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    carbon.layer_norm(xr, ns, wr, br, eps).backward(dy)
    edx, edw, edb = layer_norm_backward_ref(dy, x, ns, w, b is not None, eps)
    assert_bits_equal(xr.grad, edx, f"{context} dx", dtype=x.dtype)
    if w is not None:
        assert_bits_equal(wr.grad, edw, f"{context} dweight", dtype=w.dtype)
    if b is not None:
        assert_bits_equal(br.grad, edb, f"{context} dbias", dtype=b.dtype)


def check_rms_norm_grads(x, ns, w=None, eps=None, dy=None, seed: int = 0, context: str = ""):
    import carbon

    if dy is None:
        dy = random_values(tuple(x.shape), x.dtype, generator(seed + 11), spread=2)
    xr, wr = _leaf(x), _leaf(w)
    carbon.rms_norm(xr, ns, wr, eps).backward(dy)
    edx, edw = rms_norm_backward_ref(dy, x, ns, w, eps)
    assert_bits_equal(xr.grad, edx, f"{context} dx", dtype=x.dtype)
    if w is not None:
        assert_bits_equal(wr.grad, edw, f"{context} dweight", dtype=w.dtype)


def tie_square() -> float:
    """a = 1 + 2^-12: a^2 = 1 + 2^-11 + 2^-24 is exactly halfway between two
    float32 values (25 significant bits)."""
    return 1.0 + 2.0**-12


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, context: str = "") -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, context
    from oracle import as_bits

    assert torch.equal(as_bits(a), as_bits(b)), f"{context}: bits differ"


def is_nan_all(t: torch.Tensor) -> bool:
    return bool(torch.isnan(t.float()).all())


def adversarial_norm_rows(dtype, n):
    """Rows of n >= 8 (a power of two, so that the ties below stay ties) on which tier 1 cannot decide the
    statistics: a variance tie and a mean-of-squares tie (float32 inputs), a mean tie, centred rows (mean
    exactly 0), NaN, +-inf, inf - inf, a row of -inf with one finite value, constant rows, signed zeros, huge cancelling terms, subnormals."""
    a = tie_square() if dtype == F32 else 1.0  # float32: a * a is a float32 midpoint
    big = 1e30 if dtype != F16 else 1e4
    tiny = 2.0**-24 if dtype == F16 else 2.0**-133
    fill = lambda head, v: head + [v] * (n - len(head))  # noqa: E731
    rows = [
        fill([3.0 - a, 3.0 + a], 3.0),     # mean 3, variance 2 a^2 / n
        fill([a], 0.0),                    # mean of squares a^2 / n
        ([2.0, 2.0**-23] * n)[:n],         # mean 1 + 2^-24
        fill([1.0, 2.0**-23], 1.0),        # mean 1 + 2^-23 / n: a hair above 1
        ([1.0, -1.0] * n)[:n - n % 2] + [0.0] * (n % 2),
        fill([1.0, math.nan], 2.0),
        fill([1.0, math.inf], 2.0),
        fill([math.inf, -math.inf], 2.0),
        fill([-math.inf, 1.0], -math.inf),
        [5.0] * n,
        ([0.0, -0.0] * n)[:n],
        [-0.0] * n,
        fill([big, -big, 1.0, 3.0], 0.0),
        fill([tiny, -tiny, tiny], tiny),
    ]
    return torch.tensor(rows, dtype=torch.float64).to(dtype)
