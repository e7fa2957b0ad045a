"""carbon.atan2 and carbon.hypot (docs/contract.md §6, "Two-argument functions"): correctly rounded, checked
against independent oracles — hypot with exact integer arithmetic (tests/oracle.py's integer square root of
the exact x^2 + y^2, rounded once), atan2 against mpmath at 200 bits — plus C's special
values, every dtype, broadcasting, 1 vs 2 threads, errors, and torch.atan2 / torch.hypot under carbon.enable."""

import math
from typing import Optional
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


# ---- pow of two tensors (torch.pow(Tensor, Tensor) under carbon.enable) ---------------------------------------

def _c99_pow_special(a: float, b: float) -> Optional[float]:
    """C99 Annex F's pow at its special cases (None elsewhere), written from the standard."""
    odd = math.isfinite(b) and b == math.floor(b) and abs(b) < 2**53 and int(b) % 2 == 1
    if b == 0 or a == 1:
        return 1.0
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(b):
        if abs(a) == 1:
            return 1.0
        return 0.0 if (abs(a) < 1) == (b > 0) else math.inf
    if a == 0:
        if b < 0:
            return math.copysign(math.inf, a) if odd else math.inf
        return math.copysign(0.0, a) if odd else 0.0
    if math.isinf(a):
        magnitude = math.inf if b > 0 else 0.0
        return -magnitude if a < 0 and odd else magnitude
    if a < 0 and b != math.floor(b):
        return math.nan
    return None


def _pow_want_bits(a: float, b: float, dtype) -> set:
    """RN(a^b) (mpmath at 200 bits), with its neighbour when a^b lies within 2^-41 relative of a midpoint
    (contract §6: pow_core's error is below 2^-43), and C99's special values."""
    special = _c99_pow_special(a, b)
    if special is not None:
        return {round_bits(special, dtype)}
    v = mpmath.power(abs(mpmath.mpf(a)), mpmath.mpf(b))
    if a < 0 and int(b) % 2:
        v = -v
    slack = abs(v) * mpmath.mpf(2) ** -41
    return {rn_mp(v - slack, dtype), rn_mp(v, dtype), rn_mp(v + slack, dtype)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_of_two_tensors_is_correctly_rounded(dtype):
    g = torch.Generator().manual_seed(9)
    x = (torch.rand(2000, generator=g) * 6).to(dtype)
    y = (torch.randn(2000, generator=g) * 4).to(dtype)
    x[:300], y[:300] = -x[:300], torch.round(y[:300])  # negative bases with integer exponents
    specials = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 2.0, -2.0, 0.5]
    x = torch.cat([x, torch.tensor(specials, dtype=dtype).repeat_interleave(10)])
    y = torch.cat([y, torch.tensor(specials, dtype=dtype).repeat(10)])
    got = as_bits(torch.ops.carbon.pow_tensor_tensor(x, y)).tolist()
    mask = (1 << (32 if dtype == torch.float32 else 16)) - 1
    for i, (a, b) in enumerate(zip(x.float().tolist(), y.float().tolist())):
        assert got[i] & mask in _pow_want_bits(a, b, dtype), (i, a, b)


def test_torch_pow_of_two_tensors_under_enable(carbon_disabled_after):
    from torch import distributions as D
    x = (torch.rand(6, 5, generator=torch.Generator().manual_seed(3)) * 3 + 0.1).requires_grad_(True)
    e = torch.linspace(-2.0, 3.0, 5).requires_grad_(True)
    with carbon.enabled(seed=2):
        y = torch.pow(x, e)
        y.sum().backward()
        ints = torch.pow(torch.arange(1, 4), torch.tensor([0.5, 1.5, 2.5]))
        weibull = D.Weibull(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 0.7])).sample((3,))
        kumaraswamy = D.Kumaraswamy(torch.tensor([1.5]), torch.tensor([2.5])).sample((3,))
    assert torch.equal(as_bits(y), as_bits(torch.ops.carbon.pow_tensor_tensor(x.detach(), e.detach().expand(6, 5))))
    assert ints.dtype == torch.float32 and weibull.shape == (3, 2) and kumaraswamy.shape == (3, 1)
    assert x.grad is not None and e.grad is not None
