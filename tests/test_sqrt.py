"""carbon.sqrt (torch.ops.carbon.sqrt; torch.sqrt / rsqrt and every route's square root under carbon.enable):
RN(√x) in x's dtype, float32 / bfloat16 / float16 / float64, against an integer oracle (an integer square root
with a sticky bit, rounded once). Every bfloat16 and float16 bit pattern, float32 and float64 samples that
include perfect squares, their neighbours, subnormals and the extremes; -0 -> -0, negative and NaN -> the
canonical NaN; the CUDA kernel's bits equal the CPU's (skipped without a GPU)."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch

import carbon
from tests.oracle import as_bits, bits_tensor, bits_to_float, fmt_of, sqrt_bits

SMALL = (torch.float32, torch.bfloat16, torch.float16)


def expected_bits(x: float, dtype: torch.dtype) -> int:
    """Unsigned bits of RN_dtype(√x) for a value x of dtype, IEEE's special cases included."""
    f = fmt_of(dtype)
    if math.isnan(x) or x < 0:
        return f.nan_bits
    if x == 0:
        return f.sign_bit if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        return f.inf_bits
    return sqrt_bits(x, dtype)


def check(x: torch.Tensor) -> None:
    out = torch.ops.carbon.sqrt(x)
    assert out.dtype == x.dtype and out.shape == x.shape
    mask = (1 << fmt_of(x.dtype).total_bits) - 1
    got = [b & mask for b in as_bits(out).reshape(-1).tolist()]
    values = x.double().reshape(-1).tolist() if x.dtype != torch.float64 else x.reshape(-1).tolist()
    want = [expected_bits(v, x.dtype) for v in values]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{len(bad)} of {len(want)} {x.dtype} roots differ, first sqrt({values[bad[0]]!r}): " \
                    f"0x{got[bad[0]]:X} vs 0x{want[bad[0]]:X}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_every_half_precision_pattern(dtype):
    check(torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype))


def float32_samples(rng: random.Random) -> list:
    values = [0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, 1e-45, 2.0**-149, 2.0**-126, 3.4028234663852886e38]
    for _ in range(4000):
        values.append(struct.unpack("<f", struct.pack("<I", rng.getrandbits(31)))[0])
    for _ in range(500):  # perfect squares and their neighbours
        r = rng.randrange(1, 1 << 12) * 2.0 ** rng.randint(-70, 60)
        sq = r * r
        values += [sq, math.nextafter(sq, 0), math.nextafter(sq, math.inf)]
    return values


def test_float32_samples():
    rng = random.Random(1)
    x = torch.tensor(float32_samples(rng), dtype=torch.float64).to(torch.float32)
    check(x)


def test_float64_samples():
    rng = random.Random(2)
    values = [0.0, -0.0, math.inf, -math.inf, math.nan, -2.0, 5e-324, 2.0**-1022, 1.7976931348623157e308, 2.0, 0.5]
    for _ in range(4000):
        bits = rng.getrandbits(63)
        values.append(struct.unpack("<d", struct.pack("<Q", bits))[0])
    for _ in range(1000):  # perfect squares of 26-bit integers, and the doubles next to them (roots near midpoints)
        r = rng.randrange(1 << 25, 1 << 26) * 2.0 ** rng.randint(-500, 480)
        sq = r * r
        values += [sq, math.nextafter(sq, 0), math.nextafter(sq, math.inf)]
    check(torch.tensor(values, dtype=torch.float64))


def test_nan_bits_are_canonical_and_layouts():
    for dtype in SMALL + (torch.float64,):
        x = torch.tensor([-1.0, math.nan, -math.inf, -0.0, 4.0], dtype=dtype)
        out = torch.ops.carbon.sqrt(x)
        assert [b & ((1 << fmt_of(dtype).total_bits) - 1) for b in as_bits(out).tolist()[:3]] == [fmt_of(dtype).nan_bits] * 3
        assert math.copysign(1.0, out[3].item()) < 0 and out[4].item() == 2.0
    wide = torch.rand(6, 9, dtype=torch.float64) * 100
    for view in (wide.t(), wide[:, ::2], wide[2:, 3:]):
        check(view)
    assert torch.ops.carbon.sqrt(torch.empty(0, 3)).shape == (0, 3)


def test_bad_input():
    with pytest.raises(TypeError, match="carbon.sqrt: x has dtype"):
        torch.ops.carbon.sqrt(torch.ones(3, dtype=torch.int32))
    torch.library.opcheck(torch.ops.carbon.sqrt, (torch.rand(3, 4),))
    torch.library.opcheck(torch.ops.carbon.sqrt, (torch.rand(3, 4, dtype=torch.float64),))


def test_torch_sqrt_and_rsqrt_of_float64_under_enable():
    """torch.sqrt of float64 was refused under strict carbon.enable (torch's CPU root is not correctly rounded);
    it is carbon.sqrt now, and rsqrt is RN(1 / RN(√x)), the two steps it is documented as."""
    rng = random.Random(3)
    values = [rng.uniform(0, 1e6) for _ in range(200)] + [0.0, -0.0, 1e-300, 2.0]
    x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    with carbon.enabled():
        root = torch.sqrt(x)
        inv = torch.rsqrt(x.detach())
        root.backward(torch.ones_like(root))  # (a float64 sum is not covered)
    assert torch.equal(as_bits(root), bits_tensor([expected_bits(v, torch.float64) for v in values], torch.float64))
    for v, r in zip(values, inv.tolist()):
        s = bits_to_float(expected_bits(v, torch.float64), torch.float64)
        assert r == (1.0 / s if s != 0 else math.copysign(math.inf, s))
    assert x.grad is not None and x.grad.dtype == torch.float64


def test_carbon_sqrt_and_its_gradient():
    """carbon.sqrt's gradient is torch's formula g / (2·√x): 2·√x exact, one IEEE division — here in Python's
    binary64 arithmetic (float64 tensors) from the oracle's root."""
    rng = random.Random(5)
    values = [rng.uniform(1e-3, 1e3) for _ in range(100)]
    grads = [rng.uniform(-2, 2) for _ in range(100)]
    x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    y = carbon.sqrt(x)
    y.backward(torch.tensor(grads, dtype=torch.float64))
    roots = [bits_to_float(expected_bits(v, torch.float64), torch.float64) for v in values]
    assert y.detach().tolist() == roots
    assert x.grad.tolist() == [g / (2 * r) for g, r in zip(grads, roots)]
    torch.library.opcheck(torch.ops.carbon.sqrt, (torch.rand(3, 4, requires_grad=True) + 0.5,))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_equals_cpu():
    rng = random.Random(4)
    for dtype in SMALL + (torch.float64,):
        x = torch.tensor(float32_samples(rng), dtype=torch.float64).to(dtype)
        assert torch.equal(as_bits(torch.ops.carbon.sqrt(x.cuda()).cpu()), as_bits(torch.ops.carbon.sqrt(x)))
