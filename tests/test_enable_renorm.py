"""torch.renorm under carbon.enable (docs/enable.md): each slice along dim whose p-norm exceeds maxnorm is scaled by
RN32(m / RN32(norm + RN32(1e-7))), m = RN32(maxnorm), the factor rounded to x's dtype, out = RN(x·f); the norm is
RN32 of the exact norm's steps (p = 2: RN32(√RN32(Σx²)), p = 1: RN32(Σ|x|), ∞: max|x|). Checked against those
steps in exact rational arithmetic, at 1 and 2 threads, in place, with torch's argument errors."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import carbon
from tests.oracle import bits_to_float, round_bits, round_value, sqrt_bits

F32 = torch.float32


def rn32(v) -> float:
    return bits_to_float(round_bits(v, F32), F32)


def expected(x: torch.Tensor, p: float, dim: int, maxnorm: float) -> torch.Tensor:
    """The documented steps, one slice at a time: exact sums (Fractions), each rounding by the integer oracle,
    the float32 additions and divisions as numpy float32 operations (IEEE, one rounding each)."""
    dtype = x.dtype
    moved = x.double().movedim(dim, 0)
    out = torch.empty_like(moved)
    m = np.float32(maxnorm)
    for i in range(moved.shape[0]):
        values = [Fraction(v) for v in moved[i].reshape(-1).tolist()]
        if p == 2:
            norm = bits_to_float(sqrt_bits(round_value(sum(v * v for v in values), F32), F32), F32)
        elif p == 1:
            norm = rn32(sum(abs(v) for v in values))
        else:
            norm = float(max(abs(v) for v in values))
        norm32 = np.float32(norm)
        f = m / (norm32 + np.float32(1e-7)) if norm32 > m else np.float32(1.0)
        f_t = float(round_value(Fraction(float(f)), dtype)) if dtype != F32 else float(f)
        out[i] = torch.tensor([float(round_value(v * Fraction(f_t), dtype)) for v in values],
                              dtype=torch.float64).reshape(moved[i].shape)
    return out.movedim(0, dim).to(dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("p,dim,maxnorm", [(2.0, 0, 2.5), (1.0, 1, 3.0), (math.inf, -1, 1.25), (2.0, 1, 1e-3)])
def test_renorm_follows_the_documented_steps(dtype, p, dim, maxnorm):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 9, 3, generator=g) * 2).to(dtype)
    x[1] = 0.1  # a slice below maxnorm: factor 1
    with carbon.enabled():
        got = torch.renorm(x, p, dim, maxnorm)
        inplace = x.clone().renorm_(p, dim, maxnorm)
    want = expected(x, p, dim, maxnorm)
    assert got.dtype == dtype and torch.equal(got.view(torch.int16 if dtype != F32 else torch.int32),
                                              want.view(torch.int16 if dtype != F32 else torch.int32))
    assert torch.equal(inplace, got)


def test_renorm_thread_invariance_and_errors(restore_num_threads):
    x = torch.randn(64, 300, generator=torch.Generator().manual_seed(8)) * 5
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            outs.append(torch.renorm(x, 2.0, 0, 10.0))
    assert torch.equal(outs[0], outs[1])
    with carbon.enabled():
        with pytest.raises(RuntimeError, match="non-positive"):
            torch.renorm(x, 0.0, 0, 1.0)
        with pytest.raises(RuntimeError, match="maxnorm"):
            torch.renorm(x, 2.0, 0, -1.0)
        with pytest.raises(RuntimeError, match="at least 2 dimensions"):
            torch.renorm(x[0], 2.0, 0, 1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_renorm_gpu_equals_cpu():
    x = torch.randn(32, 100, generator=torch.Generator().manual_seed(9)) * 5
    with carbon.enabled():
        for p in (1.0, 2.0, 3.0, math.inf):
            assert torch.equal(torch.renorm(x.cuda(), p, 1, 4.0).cpu(), torch.renorm(x, p, 1, 4.0))
