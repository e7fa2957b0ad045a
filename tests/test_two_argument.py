"""carbon.atan2 and carbon.hypot (docs/contract.md §6, "Two-argument functions"): correctly rounded, checked
against independent oracles — hypot with exact integer arithmetic (tests/oracle.py's integer square root of
the exact x^2 + y^2, rounded once), atan2 against mpmath at 200 bits — plus C's special
values, every dtype, broadcasting, 1 vs 2 threads, errors, and torch.atan2 / torch.hypot under carbon.enable."""

import math
from fractions import Fraction

import mpmath
import pytest
import torch

import carbon
from tests.oracle import as_bits, bits_tensor, bits_to_float, round_bits, sqrt_bits

mpmath.mp.prec = 200
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def values(n: int, seed: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    spread = 6 if dtype == torch.float16 else 30  # finite in the format
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-spread, spread, (n,), generator=g).float())
    return x.to(dtype)


def rn_mp(v, dtype) -> int:
    sign, man, exp, _ = mpmath.mpf(v)._mpf_
    return round_bits((-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hypot_is_correctly_rounded(dtype):
    x, y = values(3000, 1, dtype), values(3000, 2, dtype)
    x[:4] = torch.tensor([3.0, 0.0, -0.0, 5e-41 if dtype == torch.float32 else 1e-7])
    y[:4] = torch.tensor([4.0, 0.0, -2.0, 1e-41 if dtype == torch.float32 else 3e-7])
    got = carbon.hypot(x, y)
    want = [sqrt_bits(Fraction(a) ** 2 + Fraction(b) ** 2, dtype) for a, b in zip(x.float().tolist(), y.float().tolist())]
    assert torch.equal(as_bits(got), bits_tensor(want, dtype))
    assert got[0].item() == 5.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_atan2_is_correctly_rounded(dtype):
    y, x = values(3000, 3, dtype), values(3000, 4, dtype)
    x[:200] = y[:200] * 3  # ratios near 1/3, and equal magnitudes below
    x[200:300] = -y[200:300]
    got = carbon.atan2(y, x)
    for i, (b, a) in enumerate(zip(y.float().tolist(), x.float().tolist())):
        want = bits_to_float(rn_mp(mpmath.atan2(mpmath.mpf(b), mpmath.mpf(a)), dtype), dtype)
        assert got[i].item() == want, (i, b, a)


def test_special_values_are_cs():
    inf, nan = math.inf, math.nan
    cases = [(0.0, 1.0), (-0.0, 1.0), (0.0, -1.0), (-0.0, -1.0), (0.0, 0.0), (-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0),
             (1.0, 0.0), (-1.0, -0.0), (inf, 1.0), (-inf, -5.0), (1.0, inf), (-1.0, inf), (1.0, -inf), (-1.0, -inf),
             (inf, inf), (-inf, inf), (inf, -inf), (-inf, -inf), (nan, 1.0), (1.0, nan), (3e38, 1e-45), (1e-45, 3e38)]
    y = torch.tensor([c[0] for c in cases])
    x = torch.tensor([c[1] for c in cases])
    got = carbon.atan2(y, x)
    want = torch.tensor([math.atan2(b, a) for b, a in cases], dtype=torch.float64).float()  # C's rules
    assert torch.equal(as_bits(got), as_bits(want))
    h = carbon.hypot(torch.tensor([inf, nan, -inf, nan, 3e38]), torch.tensor([nan, inf, 1.0, 1.0, 3e38]))
    assert h[:3].tolist() == [inf, inf, inf] and math.isnan(h[3].item()) and h[4].item() == inf
    assert as_bits(carbon.atan2(torch.tensor([nan]), torch.tensor([1.0]))).item() == 0x7FC00000


def test_broadcasting_threads_and_errors(restore_num_threads):
    y, x = values(50 * 40, 5, torch.float32).reshape(50, 40), values(40, 6, torch.float32)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append((carbon.atan2(y, x), carbon.hypot(y, x)))
    for a, b in zip(*outs):
        assert torch.equal(as_bits(a), as_bits(b))
    assert torch.equal(as_bits(outs[0][0][7]), as_bits(carbon.atan2(y[7], x)))  # a row alone
    with pytest.raises(TypeError, match="carbon.atan2: y has dtype Float but x has dtype BFloat16"):
        torch.ops.carbon.atan2(torch.ones(2), torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="broadcast first"):
        torch.ops.carbon.hypot(torch.ones(2), torch.ones(3))
    with pytest.raises(TypeError, match="carbon.hypot: x has dtype Double"):
        torch.ops.carbon.hypot(torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    torch.library.opcheck(torch.ops.carbon.atan2, (torch.randn(3, 4), torch.randn(3, 4)))
    torch.library.opcheck(torch.ops.carbon.hypot, (torch.randn(3, 4), torch.randn(3, 4)))


def test_torch_atan2_and_hypot_under_enable(carbon_disabled_after):
    y = values(64, 7, torch.float32).reshape(8, 8).requires_grad_(True)
    x = values(8, 8, torch.float32).requires_grad_(True)
    with carbon.enabled():
        a = torch.atan2(y, x)
        h = torch.hypot(y, x)
        ints = torch.atan2(torch.arange(3), torch.tensor(2))
        half = torch.hypot(y.detach().half(), 2.0 * torch.ones((), dtype=torch.half))
        inplace = y.detach().clone()
        inplace.atan2_(x.detach())
        (a.sum() + h.sum()).backward()
    assert torch.equal(as_bits(a), as_bits(carbon.atan2(y.detach(), x.detach())))
    assert torch.equal(as_bits(h), as_bits(carbon.hypot(y.detach(), x.detach())))
    assert torch.equal(as_bits(inplace), as_bits(a.detach()))
    assert ints.dtype == torch.float32 and half.dtype == torch.float16
    assert y.grad is not None and x.grad is not None
