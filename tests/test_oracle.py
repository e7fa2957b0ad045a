"""The oracle is checked on its own, before anything is compared with it:
hand-derived roundings, exhaustive round trips of the 16-bit formats, and
agreement with two independent conversions (numpy's float64 -> float32 /
float16 and torch's float32 -> bfloat16, each a single RN-even rounding)."""

import math
import random
import struct
from fractions import Fraction as F

import numpy as np
import pytest
import torch

from oracle import (
    as_bits,
    assert_bits_equal,
    bits_to_float,
    exact_sum_bits,
    is_midpoint,
    mm_bits,
    round_bits,
    sum_to_shape_bits,
)

f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
P = F(2)  # P ** n is an exact power of two


def fp32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# value, dtype, expected bits -- each derived by hand from the format's layout.
HAND_CASES = [
    # float32: 24-bit significand, ulp(1) = 2^-23, ulp just below 1 = 2^-24
    (1 + P**-24, f32, 0x3F800000),  # tie -> even (1.0)
    (1 + P**-24 + P**-80, f32, 0x3F800001),  # just above the tie -> up
    (1 + 3 * P**-24, f32, 0x3F800002),  # tie between ...01 (odd) and ...02 -> up
    (1 - P**-25, f32, 0x3F800000),  # tie between 1-2^-24 (odd significand) and 1
    (1 - P**-25 - P**-80, f32, 0x3F7FFFFF),  # just below that tie -> down
    (-(1 + P**-24 + P**-80), f32, 0xBF800001),
    (F(1, 3), f32, 0x3EAAAAAB),
    (F(1, 10), f32, 0x3DCCCCCD),
    (P**128 - P**104, f32, 0x7F7FFFFF),  # the largest finite value
    (P**128 - P**103, f32, 0x7F800000),  # tie with 2^128 -> even -> overflow to inf
    (P**128 - P**103 - P**50, f32, 0x7F7FFFFF),  # just below the overflow threshold
    (-(P**128 - P**103), f32, 0xFF800000),
    (P**200, f32, 0x7F800000),
    (P**-149, f32, 0x00000001),  # smallest subnormal
    (P**-150, f32, 0x00000000),  # tie between 0 and 2^-149 -> even (0)
    (P**-150 + P**-200, f32, 0x00000001),
    (3 * P**-150, f32, 0x00000002),  # 1.5 quanta -> 2 (even)
    (-(P**-151), f32, 0x80000000),  # underflow keeps the sign
    (P**-126 - P**-150, f32, 0x00800000),  # (2^23 - 1/2) quanta -> 2^23 quanta = 2^-126
    (P**-126 - P**-149, f32, 0x007FFFFF),  # largest subnormal
    (F(0), f32, 0x00000000),
    # float16: 11-bit significand, max 65504, quantum 2^-24
    (F(65504), f16, 0x7BFF),
    (F(65519), f16, 0x7BFF),
    (F(65520), f16, 0x7C00),  # tie between 65504 (odd) and 65536 -> overflow
    (F(-65520), f16, 0xFC00),
    (P**-24, f16, 0x0001),
    (P**-25, f16, 0x0000),  # tie -> 0
    (3 * P**-25, f16, 0x0002),
    (-(3 * P**-25), f16, 0x8002),
    (1 + P**-11, f16, 0x3C00),
    (1 + 3 * P**-11, f16, 0x3C02),
    (F(2049), f16, 0x6800),  # tie between 2048 and 2050 -> 2048
    (F(2051), f16, 0x6802),  # tie between 2050 (odd) and 2052 -> 2052
    (F(1, 3), f16, 0x3555),
    (P**-14, f16, 0x0400),  # smallest normal
    # bfloat16: 8-bit significand, float32's exponent range
    (1 + P**-8, bf16, 0x3F80),
    (1 + 3 * P**-8, bf16, 0x3F82),
    (1 + P**-8 + P**-30, bf16, 0x3F81),
    (F(1, 3), bf16, 0x3EAB),
    (P**128 - P**120, bf16, 0x7F7F),  # the largest finite bfloat16
    (P**128 - P**119, bf16, 0x7F80),  # tie with 2^128 -> overflow
    (P**128 - P**119 - P**100, bf16, 0x7F7F),
    (P**-133, bf16, 0x0001),
    (P**-134, bf16, 0x0000),
    (3 * P**-134, bf16, 0x0002),
    (F(257), bf16, 0x4380),  # 257 = 256 + 1: tie between 256 and 258 -> 256
    (F(259), bf16, 0x4382),  # tie between 258 (odd) and 260 -> 260
]


@pytest.mark.parametrize("value,dtype,bits", HAND_CASES)
def test_round_bits_hand_cases(value, dtype, bits):
    assert round_bits(value, dtype) == bits, f"RN_{dtype}({value}) = 0x{round_bits(value, dtype):X}, expected 0x{bits:X}"


def test_round_bits_float_specials():
    assert round_bits(-0.0, f32) == 0x80000000
    assert round_bits(0.0, f16) == 0
    assert round_bits(math.inf, bf16) == 0x7F80
    assert round_bits(-math.inf, f16) == 0xFC00
    assert round_bits(math.nan, f32) == 0x7FC00000
    assert round_bits(math.nan, bf16) == 0x7FC0
    assert round_bits(math.nan, f16) == 0x7E00


def test_round_bits_agrees_with_numpy_float32_and_float16():
    rng = random.Random(1234)
    with np.errstate(over="ignore"):  # overflow to inf is one of the cases checked
        for _ in range(4000):
            x = math.ldexp(rng.uniform(-1, 1), rng.randint(-160, 135))
            assert round_bits(x, f32) == int(np.array(x).astype(np.float32).view(np.uint32)), x
            y = math.ldexp(rng.uniform(-1, 1), rng.randint(-30, 18))
            assert round_bits(y, f16) == int(np.array(y).astype(np.float16).view(np.uint16)), y


def test_round_bits_agrees_with_torch_float32_to_bfloat16():
    rng = random.Random(99)
    xs = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(4000)]
    xs = [x for x in xs if math.isfinite(x)]
    expected = torch.tensor(xs, dtype=torch.float32).to(bf16).view(torch.int16).tolist()
    assert [round_bits(x, bf16) for x in xs] == [e & 0xFFFF for e in expected]


@pytest.mark.parametrize("dtype", [bf16, f16])
def test_16_bit_formats_round_trip_exhaustively(dtype):
    """Every 16-bit pattern decodes like torch decodes it, and every finite
    value rounds to itself."""
    values = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(dtype).double().tolist()
    for bits, v in enumerate(values):
        decoded = bits_to_float(bits, dtype)
        if math.isnan(v):
            assert math.isnan(decoded)
            continue
        assert decoded == v and math.copysign(1, decoded) == math.copysign(1, v), hex(bits)
        assert round_bits(v, dtype) == bits, hex(bits)


def test_exact_sum_special_value_rules():
    inf, nan = math.inf, math.nan
    assert exact_sum_bits([(inf, 0.0)], f32) == 0x7FC00000  # inf * 0
    assert exact_sum_bits([(inf, 1.0), (-inf, 1.0)], f32) == 0x7FC00000  # inf - inf
    assert exact_sum_bits([(inf, 2.0), (1.0,)], f32) == 0x7F800000
    assert exact_sum_bits([(inf, -2.0), (1.0, 5.0)], bf16) == 0xFF80
    assert exact_sum_bits([(1.0, 1.0), (-inf,)], f16) == 0xFC00  # an infinite bias
    assert exact_sum_bits([(inf, 1.0), (-inf,)], f16) == 0x7E00
    assert exact_sum_bits([(nan, 0.0)], bf16) == 0x7FC0
    assert exact_sum_bits([(1.0, 2.0), (nan,)], f16) == 0x7E00
    # signed zeros: -0 iff there is a term and every term is -0
    assert exact_sum_bits([], f32) == 0
    assert exact_sum_bits([(-0.0,)], f32) == 0x80000000
    assert exact_sum_bits([(0.0, -1.0)], f32) == 0x80000000  # 0 * -1 = -0
    assert exact_sum_bits([(-0.0, -0.0)], f32) == 0  # (-0)(-0) = +0
    assert exact_sum_bits([(0.0, -1.0), (-0.0, 3.0)], f16) == 0x8000
    assert exact_sum_bits([(0.0, -1.0), (0.0, 3.0)], f16) == 0
    assert exact_sum_bits([(0.0, -1.0), (0.0,)], bf16) == 0  # +0 bias
    assert exact_sum_bits([(1.0, 1.0), (-1.0, 1.0)], f32) == 0  # exact cancellation -> +0
    assert exact_sum_bits([(-1.0, 1.0), (1.0, 1.0), (-0.0,)], f32) == 0


def test_exact_sum_is_exact():
    big = float(np.float32(3e38))
    assert exact_sum_bits([(big, 3.0), (big, -3.0), (1.0, 1.0)], f32) == 0x3F800000
    # the double-rounding trap: 1 + 2^-24 + 2^-80 -> 1 + 2^-23
    assert exact_sum_bits([(1.0, 1.0), (2.0**-24, 1.0), (2.0**-40, 2.0**-40)], f32) == 0x3F800001
    assert exact_sum_bits([(1e30, 1e30), (-1e30, 1e30), (2.0**-149, 2.0**-149)], bf16) == 0x0000
    assert exact_sum_bits([(2.0**-149, 2.0**-149)] * 3, f32) == 0x00000000
    assert exact_sum_bits([(2.0**-100, 2.0**-50)] * 3, f32) == 0x00000002  # 1.5 quanta -> 2
    assert exact_sum_bits([(-(2.0**-100), 2.0**-60)], f32) == 0x80000000  # tiny negative -> -0


def test_mm_bits_small_integer_matrices():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    expected = torch.tensor([[fp32_bits(v) for v in r] for r in [[19.0, 22.0], [43.0, 50.0]]], dtype=torch.int64)
    assert mm_bits(a, b).long().tolist() == expected.tolist()
    biased = mm_bits(a, b, bias=torch.tensor([0.5, -0.5]))
    assert biased.long().tolist() == [[fp32_bits(19.5), fp32_bits(21.5)], [fp32_bits(43.5), fp32_bits(49.5)]]
    # bfloat16 output, ties to even: 257 -> 256, 259 -> 260
    c = mm_bits(torch.tensor([[256.0, 1.0], [256.0, 3.0]]), torch.tensor([[1.0], [1.0]]), out_dtype=bf16)
    assert (c.int() & 0xFFFF).tolist() == [[0x4380], [0x4382]]


def test_sum_to_shape_bits():
    g = torch.tensor([[1.0, 2.0, -0.0], [3.0, 2.0**-24, -0.0]])
    assert sum_to_shape_bits(g, (3,), f32).tolist() == [fp32_bits(4.0), fp32_bits(2.0), -(2**31)]
    assert sum_to_shape_bits(g, (2, 1), f32).tolist() == [[fp32_bits(3.0)], [fp32_bits(3.0)]]  # 3 + 2^-24 ties to 3
    assert sum_to_shape_bits(g, (), f32).item() == fp32_bits(6.0)  # 6 + 2^-24 -> 6


def test_is_midpoint():
    assert is_midpoint(1 + P**-24, f32) and not is_midpoint(1 + P**-23, f32)
    assert is_midpoint(F(2049), f16) and not is_midpoint(F(2050), f16)
    assert is_midpoint(F(257), bf16) and is_midpoint(P**-134, bf16)


def test_assert_bits_equal_reports_differences():
    nan = torch.tensor([float("nan")])
    assert_bits_equal(nan, torch.tensor([0x7FC00000], dtype=torch.int32))
    with pytest.raises(AssertionError, match=r"at \(0,\): expected 0\.0 .*got -0\.0"):
        assert_bits_equal(torch.tensor([-0.0]), torch.tensor([0], dtype=torch.int32))
    other_nan = torch.tensor([0x7E01], dtype=torch.int16).view(f16)  # a NaN, but not the canonical one
    with pytest.raises(AssertionError, match="expected nan \\(0x7E00\\), got nan \\(0x7E01\\)"):
        assert_bits_equal(other_nan, torch.tensor([0x7E00], dtype=torch.int16))
    assert as_bits(torch.tensor([1.0], dtype=bf16)).item() == 0x3F80
