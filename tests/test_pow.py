"""carbon's pow ops (torch.ops.carbon.pow_tensor_scalar / pow_scalar_tensor,
routed by carbon.enable for non-integer exponents): each result is one
rounding of x^p evaluated with relative error < 2^-40 (docs/contract.md §6),
so it is the correctly rounded value except within 2^-41 relative of a
rounding midpoint. Checked against mpmath at 256 bits; special values
against C's pow (Python's math.pow)."""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

import mpmath as mp
import pytest
import torch

import carbon
from tests.data import seed_of
from tests.elementwise_ref import REL, _bits_around, _fraction
from tests.oracle import as_bits, bits_to_float, fmt_of, round_bits

mp.mp.prec = 256
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _is_special(x: float, p: float) -> bool:
    return (not math.isfinite(x) or not math.isfinite(p) or x == 0 or p == 0 or x == 1
            or (x < 0 and not float(p).is_integer()))


def c_pow(x: float, p: float) -> float:
    """C99 / IEEE 754 pow for the special cases (exact: 0, inf, NaN or 1).
    Python's math.pow is C's pow but raises where C returns inf or NaN."""
    try:
        return math.pow(x, p)
    except ValueError:
        if x == 0:  # 0 to a negative power: inf, negative for -0 and an odd integer p
            odd = float(p).is_integer() and int(p) % 2 == 1
            return -math.inf if math.copysign(1.0, x) < 0 and odd else math.inf
        return math.nan  # a negative base to a non-integer power


def expected(x: float, p: float, dtype: torch.dtype) -> set:
    """Acceptable bits of RN(x^p)."""
    if _is_special(x, p):
        return {round_bits(c_pow(x, p), dtype)}
    v = mp.power(mp.mpf(abs(x)), mp.mpf(p))
    if x < 0 and int(p) % 2 == 1:
        v = -v
    return _bits_around(v, abs(_fraction(v)) * REL, dtype)


def tensor_of(values, dtype):
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def check_tensor_base(values, p, dtype):
    x = tensor_of(values, dtype)
    got = as_bits(torch.ops.carbon.pow_tensor_scalar(x, p)).tolist()
    mask = (1 << fmt_of(dtype).total_bits) - 1
    for xv, g in zip(x.double().tolist(), got):
        assert g & mask in expected(xv, p, dtype), (xv, p, dtype, bits_to_float(g & mask, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [1.5, -0.5, 1 / 3, -2.7, 0.1, 7.25, -100.5, 1e-3])
def test_tensor_base_is_correctly_rounded(p, dtype):
    rng = random.Random(seed_of(p, str(dtype)) % 1000)
    # positive bases over many binades, and near 1
    values = [2.0 ** rng.uniform(-30, 30) for _ in range(150)] + [1 + rng.uniform(-1e-3, 1e-3) for _ in range(30)]
    check_tensor_base(values, p, dtype)


def test_random_float32_bit_patterns_and_exponents():
    rng = random.Random(5)
    for _ in range(20):
        p = rng.choice([rng.uniform(-8, 8), rng.uniform(-0.01, 0.01), float(rng.randint(-9, 9)) + 0.5])
        bits = [rng.getrandbits(31) for _ in range(60)]  # positive float32 patterns, NaNs and infinities included
        check_tensor_base([struct.unpack("<f", struct.pack("<I", b))[0] for b in bits], p, torch.float32)


def test_special_values_follow_ieee_pow():
    xs = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, 2.0, -2.0, 3.0]
    ps = [0.0, -0.0, 0.5, -0.5, 2.0, 3.0, -3.0, 1.5, math.inf, -math.inf, math.nan]
    for p in ps:
        check_tensor_base(xs, p, torch.float32)


def test_number_base_tensor_exponent_rotary_frequencies():
    """inv_freq = 1 / base ** (arange(0, dim, 2) / dim), as in Llama."""
    for base in (10000.0, 500000.0, 2.0, 0.5):
        y = torch.arange(0, 128, 2, dtype=torch.float32) / 128
        y = torch.cat([y, torch.tensor([0.0, -0.0, 1.0, -1.0, 30.0, -200.0, math.inf, -math.inf, math.nan])])
        got = as_bits(torch.ops.carbon.pow_scalar_tensor(base, y)).tolist()
        for yv, g in zip(y.tolist(), got):
            assert g & 0xFFFFFFFF in expected(base, yv, torch.float32), (base, yv)


def test_under_enable_non_integer_powers_route_to_carbon():
    x = torch.rand(50, generator=torch.Generator().manual_seed(1)) * 10
    with carbon.enabled():
        a = x ** 1.5
        b = torch.pow(10000.0, torch.arange(0, 16, 2).float() / 16)
        c = torch.arange(6) ** 0.25  # integer base: converted to float32 first
    assert torch.equal(as_bits(a), as_bits(torch.ops.carbon.pow_tensor_scalar(x, 1.5)))
    for xv, g in zip(x.tolist(), as_bits(a).tolist()):
        assert g & 0xFFFFFFFF in expected(xv, 1.5, torch.float32)
    for yv, g in zip((torch.arange(0, 16, 2).float() / 16).tolist(), as_bits(b).tolist()):
        assert g & 0xFFFFFFFF in expected(10000.0, yv, torch.float32)
    for k, g in zip(range(6), as_bits(c).tolist()):
        assert g & 0xFFFFFFFF in expected(float(k), 0.25, torch.float32)


def test_errors_and_meta():
    with pytest.raises(TypeError, match="carbon.pow_tensor_scalar: x has dtype"):
        torch.ops.carbon.pow_tensor_scalar(torch.ones(2, dtype=torch.int32), 1.5)
    with pytest.raises(TypeError, match="carbon.pow_scalar_tensor: exponent has dtype"):
        torch.ops.carbon.pow_scalar_tensor(2.0, torch.ones(2, dtype=torch.int64))
    m = torch.ops.carbon.pow_tensor_scalar(torch.empty(3, 0, 2, dtype=torch.bfloat16, device="meta"), 2.5)
    assert m.shape == (3, 0, 2) and m.dtype == torch.bfloat16
    x = torch.rand(3, 4)
    torch.library.opcheck(torch.ops.carbon.pow_tensor_scalar, (x, 0.75))
    torch.library.opcheck(torch.ops.carbon.pow_scalar_tensor, (3.0, x))
