"""torch.ops.carbon.sum_divided(x, d) = RN_F(exact sum of x / d), d a 0-dim
int64 tensor on x's device (docs/contract.md §4), against the integer oracle
(tests/oracle.row_quotient_bits): ties, cancellation, specials, every dtype,
any order of the elements."""

from __future__ import annotations

import math
import random

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon; this file must run alone too)
from tests.oracle import as_bits, row_quotient_bits

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check(values, d, dtype):
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    got = as_bits(torch.ops.carbon.sum_divided(x, torch.tensor(d))).item()
    mask = (1 << (x.element_size() * 8)) - 1
    assert got & mask == row_quotient_bits(x.double().tolist(), max(d, 0), dtype), (values[:5], d, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_vectors_and_divisors(dtype):
    rng = random.Random(3)
    for n in (1, 2, 9, 100, 3000):
        values = [rng.gauss(0, 1) * 2.0 ** rng.randint(-20, 20) for _ in range(n)]
        for d in (1, 3, n, 7 * n + 1, 2**31 - 1):
            check(values, d, dtype)


def test_ties_cancellation_and_order():
    # 1 + 2^-24 = a float32 midpoint; huge terms that cancel
    check([1.0, 2.0 ** -24], 1, torch.float32)
    check([2.0 ** 100, 3.0, -(2.0 ** 100), 2.0 ** -30], 3, torch.float32)
    values = [random.Random(5).uniform(-1e6, 1e6) for _ in range(500)]
    x = torch.tensor(values)
    ref = as_bits(torch.ops.carbon.sum_divided(x, torch.tensor(7)))
    assert torch.equal(ref, as_bits(torch.ops.carbon.sum_divided(x.flip(0), torch.tensor(7))))
    check(values, 7, torch.float32)


LARGE_DIVISORS = (2**32 - 1, 2**32, 2**32 + 1, 3 * 2**40 + 7, 2**53 - 1, 2**53, 2**53 + 1, 2**62 + 3, 2**63 - 1)


def chunks24(value: int, scale: float) -> list:
    """value * scale as float32-exact pieces: value's 24-bit chunks, each times scale."""
    pieces = []
    shift = 0
    while value:
        pieces.append(float(value & 0xFFFFFF) * 2.0**shift * scale)
        value >>= 24
        shift += 24
    return pieces


def tie_values(d: int, nudge: float) -> list:
    """Float32 values summing exactly to (1 + 2^-24) d + nudge: over d, a float32
    midpoint (ties to even: 1.0) pushed up or down by nudge / d."""
    return chunks24(d, 1.0) + chunks24(d, 2.0**-24) + ([nudge] if nudge else [])


@pytest.mark.parametrize("d", LARGE_DIVISORS)
def test_divisors_beyond_32_and_53_bits(d):
    """Any positive int64 divisor: the exact tier's long division (32-bit digits
    below 2^32, bit by bit above) and the skip of tiers 1 and 2 above 2^53,
    where d is not exact as a double. A midpoint quotient (the exact tier's
    tie) and one nudged by 2^-120 either way (its sticky bit), against the
    oracle and by hand, in two element orders; random values too."""
    for nudge, bits in ((0.0, 0x3F800000), (2.0**-120, 0x3F800001), (-(2.0**-120), 0x3F800000)):
        values = tie_values(d, nudge)
        assert row_quotient_bits(values, d, torch.float32) == bits
        for order in (values, values[::-1]):
            check(order, d, torch.float32)
    rng = random.Random(d)
    check([rng.gauss(0, 1) * 2.0 ** rng.randint(-20, 60) for _ in range(50)], d, torch.float32)


def test_specials_and_empty():
    check([1.0, math.inf], 2, torch.float32)
    check([math.inf, -math.inf], 2, torch.float32)
    check([math.nan, 1.0], 2, torch.float32)
    check([-0.0, -0.0], 3, torch.float32)
    check([1.0, 2.0], 0, torch.float32)  # the mean of nothing: NaN
    assert torch.isnan(torch.ops.carbon.sum_divided(torch.tensor([1.0]), torch.tensor(-4)))
    assert torch.isnan(torch.ops.carbon.sum_divided(torch.empty(0), torch.tensor(3)))


def test_errors_and_opcheck():
    with pytest.raises(TypeError, match="divisor must be a 0-dim int64 tensor"):
        torch.ops.carbon.sum_divided(torch.ones(3), torch.tensor(3.0))
    with pytest.raises(TypeError, match="divisor must be a 0-dim int64 tensor"):
        torch.ops.carbon.sum_divided(torch.ones(3), torch.tensor([3]))
    with pytest.raises(TypeError, match="carbon.sum_divided: x has dtype"):
        torch.ops.carbon.sum_divided(torch.ones(3, dtype=torch.float64), torch.tensor(3))
    torch.library.opcheck(torch.ops.carbon.sum_divided, (torch.randn(4, 5), torch.tensor(6)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_equals_cpu_without_sync():
    x = torch.randn(100000, generator=torch.Generator().manual_seed(0)) * 1e3
    d = torch.tensor(99991)
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = torch.ops.carbon.sum_divided(x.cuda(), d.cuda())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(as_bits(gpu.cpu()), as_bits(torch.ops.carbon.sum_divided(x, d)))
    for big in LARGE_DIVISORS:  # the exact tier's long division on the device
        for nudge in (0.0, 2.0**-120, -(2.0**-120)):
            y = torch.tensor(tie_values(big, nudge), dtype=torch.float32)
            want = as_bits(torch.ops.carbon.sum_divided(y, torch.tensor(big)))
            assert torch.equal(as_bits(torch.ops.carbon.sum_divided(y.cuda(), torch.tensor(big).cuda()).cpu()), want)
