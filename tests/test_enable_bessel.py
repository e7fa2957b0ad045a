"""torch.special.i0 / i0e / i1 / i1e and torch.kaiser_window under carbon.enable (docs/enable.md,
carbon/_enable_bessel.py): every float32 result against mpmath's Bessel functions rounded once (the binary64
evaluation is within ~2⁻⁴⁵ relative, so it rounds correctly away from the rare near-midpoint cases), across the
series / asymptotic switch at |x| = 30, special values, bfloat16, the Kaiser window against an oracle of torch's
sequence, refusals, and the same bits at 1 and 2 threads."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest
import torch

import carbon
from tests.oracle import as_bits, assert_bits_equal, bits_tensor, bits_to_float, round_bits, round_value, sqrt_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32

FUNCTIONS = {"i0": (torch.special.i0, 0, False), "i0e": (torch.special.i0e, 0, True),
             "i1": (torch.special.i1, 1, False), "i1e": (torch.special.i1e, 1, True)}


def _exact(v: mpmath.mpf) -> Fraction:
    sign, man, exp, _ = v._mpf_
    return (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)


def _reference_bits(name: str, x: float, dtype: torch.dtype = F32) -> int:
    _, nu, scaled = FUNCTIONS[name]
    if math.isnan(x):
        return round_bits(math.nan, dtype)
    if math.isinf(x):
        value = 0.0 if scaled else math.inf
        return round_bits(math.copysign(value, x) if nu == 1 else value, dtype)
    with mpmath.workprec(256):
        v = mpmath.besseli(nu, mpmath.mpf(x))
        if scaled:
            v = v * mpmath.exp(-abs(mpmath.mpf(x)))
        if v == 0:
            return round_bits(math.copysign(0.0, x) if nu == 1 else 0.0, dtype)
        exact = _exact(v)
    if dtype == F32:
        return round_bits(exact, dtype)
    return round_bits(round_value(exact, F32), dtype)  # the float32 result rounded to the format


def _arguments() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.linspace(-95, 95, 761), torch.randn(300, generator=g) * 3,
                      torch.tensor([0.0, -0.0, 1e-30, -2e-38, 1e-44, 29.999998, 30.0, 30.000002, -30.0, 88.7, 91.9,
                                    92.0, 1e6, math.inf, -math.inf, math.nan])]).float()


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_each_result_is_the_correctly_rounded_function(name):
    x = _arguments()
    with carbon.enabled():
        got = FUNCTIONS[name][0](x)
    want = bits_tensor([_reference_bits(name, v) for v in x.tolist()], F32)
    assert_bits_equal(got, want, name)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_bfloat16_rounds_the_float32_result(name):
    x = (torch.linspace(-40, 40, 161) + 0.3).bfloat16()
    with carbon.enabled():
        got = FUNCTIONS[name][0](x)
    assert got.dtype == torch.bfloat16
    want = bits_tensor([_reference_bits(name, v, torch.bfloat16) for v in x.float().tolist()], torch.bfloat16)
    assert_bits_equal(got, want, name)


def _i0_32(v: Fraction) -> Fraction:
    return Fraction(bits_to_float(_reference_bits("i0", float(v)), F32))


def test_kaiser_window_is_torchs_sequence_with_carbons_i0():
    """α = (N − 1)/2, t = RN((i − α)/α), s = √RN(1 − RN(t·t)) (correctly rounded), w = RN(I0(RN(β·s)) / I0(β))."""
    for length, periodic, beta in ((1, True, 12.0), (16, True, 12.0), (31, False, 8.6), (256, True, 14.769656459379492)):
        with carbon.enabled():
            got = torch.kaiser_window(length, periodic=periodic, beta=beta)
        if length == 1:
            assert got.tolist() == [1.0]
            continue
        n = length + 1 if periodic else length
        alpha = Fraction((n - 1) / 2.0)
        b32 = round_value(Fraction(beta), F32)
        bottom = _i0_32(b32)
        want = []
        for i in range(length):
            t = round_value((i - alpha) / alpha, F32)
            s = Fraction(bits_to_float(sqrt_bits(abs(round_value(1 - round_value(t * t, F32), F32)), F32), F32))
            want.append(round_bits(_i0_32(round_value(b32 * s, F32)) / bottom, F32))
        assert_bits_equal(got, bits_tensor(want, F32), f"kaiser {length}")
        assert torch.allclose(got, torch.kaiser_window(length, periodic=periodic, beta=beta), atol=2e-6)


def test_same_bits_at_one_and_two_threads_and_refusals(restore_num_threads):
    x = torch.randn(100000, generator=torch.Generator().manual_seed(1)) * 40
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            results.append([as_bits(f(x)) for f, _, _ in FUNCTIONS.values()])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    with carbon.enabled():
        with pytest.raises(carbon.NotExactError, match="float64"):
            torch.special.i0(torch.ones(3, dtype=torch.float64))
        with pytest.raises(carbon.NotExactError, match="kaiser_window"):
            torch.kaiser_window(8, dtype=torch.float64)
