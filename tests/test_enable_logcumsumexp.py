"""torch.logcumsumexp under carbon.enable (docs/enable.md, carbon/_enable_logcumsumexp.py): the binary64 fold
against an independent scalar evaluation of its definition (Python floats, mpmath's correctly rounded exp and log),
bit for bit; within one float32 ulp of the exact value (mpmath at 200 bits); infinities and NaN; bfloat16; a row
alone vs in a batch, 1 vs 2 threads; gradients under strict mode."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

import carbon
from oracle import as_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
mp.mp.prec = 200


def exp64(v: float) -> float:
    return 0.0 if v < -746 else float(mp.exp(v))


def log1p64(t: float) -> float:
    u = 1.0 + t
    return t if u == 1.0 else float(mp.log(u)) * (t / (u - 1.0))


def fold_oracle(row: list) -> list:
    """The documented fold in Python floats (IEEE binary64), then rounded to float32."""
    out, y = [], None
    for x in row:
        if y is None:
            y = x
        elif math.isnan(x) or math.isnan(y):
            y = math.nan
        elif x == -math.inf:
            pass
        elif y == -math.inf:
            y = x
        elif max(x, y) == math.inf:
            y = math.inf
        else:
            y = max(y, x) + log1p64(exp64(-abs(y - x)))
        out.append(float(np.float32(y)))
    return out


def rows(seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 40)) * np.array([[1e-3], [1], [10], [100], [1e4], [1]])
    x[5] = np.linspace(-50, 50, 40)  # the running maximum changes at every step
    return torch.tensor(x, dtype=torch.float32)


def test_logcumsumexp_is_the_documented_fold():
    x = rows(0)
    x[1, 3] = -math.inf
    x[2, :2] = -math.inf
    x[3, 7] = math.inf
    x[4, 9] = math.nan
    with carbon.enabled():
        y = torch.logcumsumexp(x, 1)
    want = [fold_oracle(r) for r in x.double().tolist()]
    assert torch.equal(as_bits(y), as_bits(torch.tensor(want, dtype=torch.float32)))
    assert y[2, :2].tolist() == [-math.inf, -math.inf] and math.isinf(y[3, 7].item())
    assert y[4, 9:].isnan().all() and not y[4, :9].isnan().any()


def test_logcumsumexp_is_within_one_ulp_of_the_exact_value():
    x = rows(1)
    with carbon.enabled():
        y = torch.logcumsumexp(x, 1)
    for r, got in zip(x.double().tolist(), y.tolist()):
        for k in range(len(r)):
            exact = mp.log(mp.fsum(mp.exp(mp.mpf(v)) for v in r[:k + 1]))
            ulp = np.spacing(np.float32(abs(float(exact))))
            assert abs(mp.mpf(got[k]) - exact) <= ulp


def test_bfloat16_dims_batches_and_threads(restore_num_threads):
    x = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(2)) * 5
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append([torch.logcumsumexp(x, d) for d in (0, 1, -1)] + [torch.logcumsumexp(x.bfloat16(), 1)])
            alone = torch.logcumsumexp(x[1, :, 4], 0)
    for one, two in zip(*runs):
        assert torch.equal(as_bits(one), as_bits(two))
    assert torch.equal(as_bits(runs[0][1][1, :, 4]), as_bits(alone))
    want16 = [fold_oracle(r) for r in x.bfloat16().double().transpose(1, 2).reshape(-1, 5).tolist()]
    want16 = torch.tensor(want16).bfloat16().reshape(3, 17, 5).transpose(1, 2)  # float32 -> bfloat16: one rounding
    assert torch.equal(as_bits(runs[0][3]), as_bits(want16))
    with carbon.enabled():
        assert torch.logcumsumexp(torch.empty(0, 3), 0).shape == (0, 3)
        assert torch.logcumsumexp(torch.tensor(2.5), 0).item() == 2.5
        with pytest.raises(carbon.NotExactError, match="logcumsumexp in torch.float64"):
            torch.logcumsumexp(torch.ones(3, dtype=torch.float64), 0)


def test_gradients_run_under_strict_mode(restore_num_threads):
    grads = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x = rows(3)[:4, :12].clone().requires_grad_()
        with carbon.enabled(strict=True):
            torch.logcumsumexp(x, 1).square().sum().backward()
        grads.append(x.grad)
    x64 = rows(3)[:4, :12].double().requires_grad_()
    torch.logcumsumexp(x64, 1).square().sum().backward()
    assert torch.equal(as_bits(grads[0]), as_bits(grads[1]))
    assert torch.allclose(grads[0].double(), x64.grad, rtol=1e-4, atol=1e-4)
