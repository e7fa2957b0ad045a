"""carbon.lgamma, carbon.digamma and carbon.trigamma (docs/contract.md §6, "The gamma family") against mpmath
at 256 bits (tests/elementwise_ref.py): every result is the correctly rounded value of log|Gamma(x)|, psi(x)
or psi'(x) (or, within 2^-41 relative of a rounding midpoint, its neighbour) — at the poles and the
special values, next to every zero a float32 argument can approach (lgamma at 1 and 2 and between the
negative integers, digamma's positive and negative zeros), next to the negative integers, over all
exponents and in float32, bfloat16 and float16. Gradients RN(g * f'(x)) against psi, psi' and psi''
evaluated by mpmath; 1 vs 2 threads; opcheck; errors."""

from __future__ import annotations

import math
import random

import mpmath as mp
import pytest
import torch

import carbon
from elementwise_ref import grad_expected_bits
from oracle import as_bits, bits_to_float, fmt_of
from test_elementwise import _f32_bits as f32_bits
from test_elementwise import check  # RN(f(x)) of every bit pattern against elementwise_ref, by carbon.<name>

NAMES = ("lgamma", "digamma", "trigamma")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CALL = {"lgamma": carbon.lgamma, "digamma": carbon.digamma, "trigamma": carbon.trigamma}


def neighbours(values, d: int):
    """float32 bit patterns of each value's float32 rounding and the d patterns on each side."""
    out = set()
    for v in values:
        b = f32_bits(v)
        out.update(b + k for k in range(-d, d + 1) if 0 <= b + k < 1 << 32)
    return sorted(out)


def _roots(f, starts):
    return [float(mp.findroot(f, s)) for s in starts]


# The zeros a float32 argument can come near (for n > 8 the zeros lie closer to -n than float32 resolves).
LGAMMA_ZEROS = _roots(lambda t: mp.re(mp.loggamma(t)), [-n - 0.1 for n in range(2, 9)] + [-n - 0.9 for n in range(2, 9)])
DIGAMMA_ZEROS = _roots(mp.digamma, [1.46] + [-n - 0.5 for n in range(0, 9)])
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0, -3.0, -100.0,
            2.0**-149, -(2.0**-149), 2.0**-126, 2.0**-25, -(2.0**-25), 2.0**-24, 16.0, 15.0, 17.0, 1e10, 3e38,
            -(2.0**23), -(2.0**23) + 0.5, -(2.0**22) - 0.5, 4.08e36, 4.09e36]


@pytest.mark.parametrize("name", NAMES)
def test_specials_poles_and_thresholds(name):
    # every pattern within 3 of: the poles, 1 and 2 (lgamma's zeros), the series' thresholds 2^-25 and 16,
    # the largest negative non-integers, lgamma's overflow of float32 (~4.08e36)
    check(name, torch.float32, neighbours([v for v in SPECIALS if not math.isnan(v)], 3) + [0x7FC00000])


@pytest.mark.parametrize("name", NAMES)
def test_next_to_the_zeros(name):
    # lgamma(1 + e) ~ -0.577 e and lgamma(2 + e) ~ 0.42 e; at the irrational zeros the closest float32
    # arguments give the smallest |f(x)| (the hardest relative accuracy)
    zeros = [1.0, 2.0] + LGAMMA_ZEROS + DIGAMMA_ZEROS
    check(name, torch.float32, neighbours(zeros, 40))


@pytest.mark.parametrize("name", NAMES)
def test_next_to_the_negative_integers(name):
    ints = [-float(n) for n in range(1, 40)] + [-1000.0, -65536.0, -(2.0**22) + 1.0]
    check(name, torch.float32, [b for b in neighbours(ints, 4)])


@pytest.mark.parametrize("name", NAMES)
def test_random_bit_patterns(name):
    rng = random.Random(5 + len(name))
    check(name, torch.float32, [rng.getrandbits(32) for _ in range(1500)])


@pytest.mark.parametrize("name", NAMES)
def test_random_moderate_values(name):
    # where the distributions evaluate them: |x| in [2^-8, 2^7), both signs
    rng = random.Random(17 + len(name))
    bits = [(rng.getrandbits(1) << 31) | (rng.randrange(127 - 8, 127 + 7) << 23) | rng.getrandbits(23) for _ in range(1500)]
    check(name, torch.float32, bits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_16_bit_formats(name, dtype):
    rng = random.Random(3)
    specials = [fmt_of(dtype).nan_bits]
    for v in SPECIALS[:16]:
        t = torch.tensor([v], dtype=dtype)
        specials.append(int(as_bits(t)[0]) & ((1 << 16) - 1))
    check(name, dtype, sorted(set(specials + [rng.getrandbits(16) for _ in range(700)])))


def test_exact_values():
    # lgamma(1) = lgamma(2) = +0 exactly (not a tiny residue), lgamma(3) = log 2 rounded, digamma(1) = -gamma
    # and trigamma(1) = pi^2/6 rounded: values known in closed form, rounded with Python's own floats
    x = torch.tensor([1.0, 2.0, 3.0])
    assert as_bits(carbon.lgamma(x)).tolist()[:2] == [0, 0]
    assert carbon.lgamma(x)[2].item() == float(torch.tensor(math.log(2.0), dtype=torch.float32))
    one = torch.tensor([1.0])
    assert carbon.digamma(one).item() == float(torch.tensor(-0.57721566490153286, dtype=torch.float32))
    assert carbon.trigamma(one).item() == float(torch.tensor(math.pi**2 / 6, dtype=torch.float32))
    assert carbon.polygamma(0, one).item() == carbon.digamma(one).item()
    assert carbon.polygamma(1, one).item() == carbon.trigamma(one).item()


# ---------------------------------------------------------------- gradients


def check_grad(name: str, dtype: torch.dtype, xs, gs) -> None:
    x = torch.tensor(xs, dtype=torch.float64).to(dtype).requires_grad_(True)
    g = torch.tensor(gs, dtype=torch.float64).to(dtype)
    (grad,) = torch.autograd.grad(CALL[name](x), x, g)
    assert grad.dtype == dtype
    got = as_bits(grad).tolist()
    mask = (1 << fmt_of(dtype).total_bits) - 1
    bad = []
    for xi, gi, b in zip(x.detach().double().tolist(), g.double().tolist(), got):
        if b & mask not in grad_expected_bits(name, gi, xi, dtype):
            bad.append((xi, gi, bits_to_float(b & mask, dtype)))
    assert not bad, f"d{name} {dtype}: {len(bad)} of {len(xs)} wrong, e.g. (x, g, got): {bad[:4]}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_gradients(name, dtype):
    # lgamma' = psi, digamma' = psi', trigamma' = psi'' (whose zeros below 0 allow an absolute slack)
    rng = random.Random(23)
    xs = [0.0, -0.0, 1.0, 2.0, -1.0, -2.5, 1e-30, -1e-30, 100.0, math.inf, -math.inf, math.nan] + DIGAMMA_ZEROS[:3]
    xs += [rng.uniform(-12, 12) for _ in range(250)] + [rng.gauss(0, 1) * 2.0 ** rng.randint(-20, 20) for _ in range(100)]
    gs = [rng.gauss(0, 1) * 2.0 ** rng.randint(-3, 3) for _ in xs]
    check_grad(name, dtype, xs, gs)


# ---------------------------------------------------------------- threads, batches, registration, errors


@pytest.mark.parametrize("name", NAMES)
def test_same_bits_at_1_and_2_threads_and_alone(name, restore_num_threads):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(70_000, generator=g) * 8
    torch.set_num_threads(1)
    one = as_bits(CALL[name](x))
    torch.set_num_threads(2)
    two = as_bits(CALL[name](x))
    assert torch.equal(one, two)
    alone = torch.stack([as_bits(CALL[name](x[i:i + 1]))[0] for i in (0, 4097, 69_999)])
    assert torch.equal(alone, one[[0, 4097, 69_999]])


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(name):
    torch.library.opcheck(getattr(torch.ops.carbon, name), (torch.randn(3, 5) * 4,))


def test_errors():
    with pytest.raises(TypeError, match=r"carbon\.lgamma"):
        carbon.lgamma(torch.arange(3))
    with pytest.raises(TypeError, match=r"carbon\.digamma"):
        carbon.digamma(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"carbon\.polygamma: n must be 0 or 1, got 2"):
        carbon.polygamma(2, torch.ones(3))
    assert carbon.trigamma(torch.ones(0, 4)).shape == (0, 4)
