"""carbon.round_to(x, dtype): each element rounded once to the target format
(to nearest, ties to even, subnormals kept, overflow to inf, every NaN ->
the canonical NaN of the target). Checked against the oracle's round_bits
exhaustively for all 2^16 bfloat16 and float16 patterns, and for float32
patterns built around every rounding position (midpoints and their
neighbours at every exponent), edge cases and random bits; a wide strided
sweep of the 2^32 float32 patterns is compared with two independent
conversions (numpy float32 -> float16, torch float32 -> bfloat16) that agree
with the oracle."""

import math
import random
from fractions import Fraction
import struct

import numpy as np
import pytest
import torch

import carbon
from data import BF16, DTYPES, F16, F32, generator, random_values
from oracle import as_bits, assert_bits_equal, bits_tensor, round_bits, round_to_bits

pytestmark = pytest.mark.skipif(not hasattr(carbon, "round_to"), reason="carbon.round_to not built yet")

CANONICAL = {F32: 0x7FC00000, BF16: 0x7FC0, F16: 0x7E00}


def patterns16(dtype):
    """All 65536 bit patterns of a 16-bit format."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def patterns32(bits):
    return torch.tensor([b - (1 << 32) if b >> 31 else b for b in bits], dtype=torch.int32).view(F32)


@pytest.mark.parametrize("src", [BF16, F16])
@pytest.mark.parametrize("dst", DTYPES)
def test_every_16_bit_pattern(src, dst):
    x = patterns16(src)
    out = carbon.round_to(x, dst)
    assert_bits_equal(out, round_to_bits(x, dst), f"{src} -> {dst}", dtype=dst, show=10)
    assert_bits_equal(torch.ops.carbon.round_to(x, dst), round_to_bits(x, dst), "raw op")


def float32_edge_patterns():
    rng = random.Random(1)
    bits = set()
    for sign in (0, 1 << 31):
        for e in range(256):
            base = sign | (e << 23)
            # a midpoint at every rounding position s (bit s-1 set, below it zero), and its neighbours,
            # with an even and an odd kept part
            for s in range(1, 24):
                for high in (rng.getrandbits(23) & ~((1 << s) - 1), 0, ((1 << 23) - 1) & ~((1 << s) - 1)):
                    for kept_lsb in (0, 1 << s):
                        m = (high & ~(1 << s)) | kept_lsb
                        mid = m | (1 << (s - 1))
                        for v in (mid - 1, mid, mid + 1):
                            if 0 <= v < (1 << 23):
                                bits.add(base | v)
            bits.update({base, base | 1, base | 0x7FFFFF, base | 0x400000})
    bits.update({
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F7F8001, 0x7F7F0000, 0x7F800000, 0xFF800000,  # max, bf16 overflow tie
        0x477FE000, 0x477FF000, 0x477FEFFF, 0x477FF001, 0x477FFFFF, 0x47800000,  # 65504, 65520 (fp16 overflow tie)
        0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33400000, 0x33C00000,  # 2^-24, 2^-25 (fp16 subnormal tie)
        0x38800000, 0x387FFFFF, 0x387FE000, 0x387FF000, 0x387FF001,  # 2^-14 and just below (fp16 min normal)
        0x00000001, 0x007FFFFF, 0x00008000, 0x00018000, 0x00008001, 0x00007FFF, 0x00800000,  # float32 subnormals
        0x7F800001, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF, 0xFF800001, 0x7FC00000, 0xFFC00000,  # NaNs
        0x00000000, 0x80000000,
    })
    return sorted(bits)


@pytest.fixture(scope="module")
def edge_float32():
    return patterns32(float32_edge_patterns())


@pytest.mark.parametrize("dst", DTYPES)
def test_float32_patterns_around_every_rounding_position(edge_float32, dst):
    x = edge_float32
    assert x.numel() > 50_000
    out = carbon.round_to(x, dst)
    assert_bits_equal(out, round_to_bits(x, dst), f"float32 -> {dst}", dtype=dst, show=10)


@pytest.mark.parametrize("dst", DTYPES)
def test_random_float32_patterns(dst):
    rng = random.Random(f"rand{dst}")
    x = patterns32([rng.getrandbits(32) for _ in range(30_000)])
    assert_bits_equal(carbon.round_to(x, dst), round_to_bits(x, dst), f"random float32 -> {dst}", show=10)


@pytest.mark.parametrize("bits,dst,expected", [
    (0x3F808000, BF16, 0x3F80),  # 1 + 2^-8: tie -> even
    (0x3F818000, BF16, 0x3F82),  # tie -> even (up)
    (0x3F808001, BF16, 0x3F81),
    (0x7F7FFFFF, BF16, 0x7F80),  # float32 max -> bfloat16 inf
    (0x7F7F8000, BF16, 0x7F80),  # bf16 max + half an ulp: tie -> inf
    (0x7F7F7FFF, BF16, 0x7F7F),
    (0x00008000, BF16, 0x0000),  # half a bf16 quantum: tie -> 0
    (0x00018000, BF16, 0x0002),
    (0x80008001, BF16, 0x8001),
    (0x7F800001, BF16, 0x7FC0),  # a signalling NaN (truncation would give inf)
    (0xFFFFFFFF, BF16, 0x7FC0),
    (0x477FE000, F16, 0x7BFF),  # 65504
    (0x477FEFFF, F16, 0x7BFF),
    (0x477FF000, F16, 0x7C00),  # 65520: tie -> inf
    (0xC77FF000, F16, 0xFC00),
    (0x33000000, F16, 0x0000),  # 2^-25: tie -> 0
    (0x33000001, F16, 0x0001),
    (0xB3000001, F16, 0x8001),
    (0x33C00000, F16, 0x0002),  # 1.5 * 2^-24 -> 2^-23
    (0x387FE000, F16, 0x0400),  # 2^-14 - 2^-25: tie -> 2^-14 (even)
    (0x387FF000, F16, 0x0400),  # 2^-14 - 2^-26: below a quarter quantum away -> 2^-14
    (0x3F801000, F16, 0x3C00),  # 1 + 2^-11: tie -> 1
    (0x3F803000, F16, 0x3C02),
    (0x7FC12345, F16, 0x7E00),
    (0x7FC12345, F32, 0x7FC00000),  # same dtype: NaN canonicalized, everything else kept
    (0xFF800001, F32, 0x7FC00000),
    (0x00000001, F32, 0x00000001),
    (0x80000000, F32, 0x80000000),
])
def test_hand_derived_conversions(bits, dst, expected):
    x = patterns32([bits])
    assert round_bits(struct.unpack("<f", struct.pack("<I", bits))[0], dst) == expected  # the oracle agrees
    assert_bits_equal(carbon.round_to(x, dst), bits_tensor([expected], dst), hex(bits))
    assert_bits_equal(carbon.round_to(x[0], dst), bits_tensor(expected, dst), "0-dim")


@pytest.mark.parametrize("src,bits,dst,expected", [
    (BF16, 0x7F7F, F16, 0x7C00),  # bf16 max -> fp16 inf
    (BF16, 0x477F, F16, 0x7BF8),  # 65280 exact
    (BF16, 0x4780, F16, 0x7C00),  # 65536 -> inf
    (BF16, 0x3380, F16, 0x0001),  # 2^-24
    (BF16, 0x3300, F16, 0x0000),  # 2^-25 -> tie -> 0
    (BF16, 0x3340, F16, 0x0001),  # 1.5 * 2^-25 = 0.75 quanta -> 1
    (BF16, 0x0001, F16, 0x0000),  # bf16's smallest subnormal
    (BF16, 0x7F81, F16, 0x7E00),
    (F16, 0x3C01, BF16, 0x3F80),  # 1 + 2^-10 -> 1 (below the bf16 midpoint)
    (F16, 0x3C04, BF16, 0x3F80),  # 1 + 2^-8: tie -> 1
    (F16, 0x3C0C, BF16, 0x3F82),  # 1 + 3 * 2^-8: tie -> 1 + 2^-6
    (F16, 0x0001, BF16, 0x3380),  # 2^-24 exact in bf16
    (F16, 0x7BFF, BF16, 0x4780),  # 65504 -> 65536
    (F16, 0x7C01, BF16, 0x7FC0),
    (F16, 0xFE01, F16, 0x7E00),
    (BF16, 0xFFC1, BF16, 0x7FC0),
    (F16, 0x0001, F32, 0x33800000),
    (BF16, 0x0001, F32, 0x00010000),  # bf16 subnormal widens exactly (float32 subnormal)
])
def test_hand_derived_16_bit_conversions(src, bits, dst, expected):
    x = torch.tensor([bits - (1 << 16) if bits >> 15 else bits], dtype=torch.int16).view(src)
    assert_bits_equal(carbon.round_to(x, dst), bits_tensor([expected], dst), f"{hex(bits)} {src} -> {dst}")
    assert_bits_equal(round_to_bits(x, dst).view(dst), bits_tensor([expected], dst), "oracle")


def test_strided_sweep_of_all_float32_patterns():
    """4.2M float32 patterns spread over all 2^32 (stride 1021, coprime to
    every field width) compared with numpy (-> float16) and torch (->
    bfloat16): both single RN-even roundings, checked against the oracle on a
    sample first. NaNs are compared separately (canonical bits)."""
    bits = torch.arange(0, 2**32, 1021, dtype=torch.int64)
    bits = torch.cat([bits, bits + 510])  # offsets hit different low-bit patterns
    x = (bits - ((bits >> 31) << 32)).to(torch.int32).view(F32)
    nan = x.isnan()
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is what is wanted
        ref16 = torch.from_numpy(x.numpy().astype(np.float16))
    ref_bf = x.to(BF16)
    sample = x[::4099]
    assert_bits_equal(ref16[::4099][~sample.isnan()],
                      round_to_bits(sample[~sample.isnan()], F16), "numpy vs oracle")
    assert_bits_equal(sample.to(BF16)[~sample.isnan()], round_to_bits(sample[~sample.isnan()], BF16), "torch vs oracle")
    for dst, ref in ((F16, ref16), (BF16, ref_bf)):
        out = carbon.round_to(x, dst)
        assert out.dtype == dst and out.shape == x.shape
        got, want = as_bits(out), as_bits(ref)
        bad = ((got != want) & ~nan).nonzero().flatten()
        assert bad.numel() == 0, (f"-> {dst}: {bad.numel()} differ, e.g. float32 0x{int(bits[bad[0]]):08X}: "
                                  f"got 0x{int(got[bad[0]]) & 0xFFFF:04X}, want 0x{int(want[bad[0]]) & 0xFFFF:04X}")
        assert bool((got[nan] == CANONICAL[dst]).all()), f"-> {dst}: non-canonical NaN"
    out = carbon.round_to(x, F32)
    same = as_bits(out) == as_bits(x)
    assert bool(same[~nan].all()), "float32 -> float32 must keep every non-NaN value"
    assert bool((as_bits(out)[nan] == CANONICAL[F32]).all()), "float32 -> float32: NaNs canonical"


def test_shapes_layouts_and_empty():
    g = generator(3)
    x = random_values((6, 5, 4), F32, g, spread=30)
    for dst in DTYPES:
        ref = carbon.round_to(x, dst)
        assert ref.shape == x.shape
        for name, v in {"transposed": x.transpose(0, 2), "sliced": x[::2, 1:, ::3],
                        "expanded": x[:, :1].expand(6, 3, 4), "permuted": x.permute(1, 2, 0)}.items():
            out = carbon.round_to(v, dst)
            assert out.shape == v.shape, name
            assert torch.equal(as_bits(out), as_bits(carbon.round_to(v.contiguous(), dst))), name
            assert_bits_equal(out, round_to_bits(v, dst), name)
        for shape in [(0,), (3, 0), ()]:
            e = torch.zeros(shape, dtype=F16) if shape != () else torch.tensor(-2.0**-30)
            out = carbon.round_to(e, dst)
            assert out.shape == e.shape and out.dtype == dst
            assert_bits_equal(out, round_to_bits(e, dst), f"shape {shape}")


def test_thread_count_does_not_matter(restore_num_threads):
    rng = random.Random(4)
    x = patterns32([rng.getrandbits(32) for _ in range(1 << 16)]).repeat(16)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append([carbon.round_to(x, d) for d in DTYPES])
    for a, b in zip(*results):
        assert torch.equal(as_bits(a), as_bits(b))


@pytest.mark.parametrize("make", [
    lambda: carbon.round_to(torch.zeros(3, dtype=torch.float64), F32),
    lambda: carbon.round_to(torch.zeros(3, dtype=torch.int32), F32),
    lambda: carbon.round_to(torch.zeros(3), torch.float64),
    lambda: carbon.round_to(torch.zeros(3), torch.int16),
], ids=["float64 input", "int32 input", "float64 target", "int16 target"])
def test_unsupported_dtypes_raise_type_error(make):
    with pytest.raises(TypeError, match=r"^carbon\.round_to:"):
        make()


# ------------------------------------------------------- divisor and gradient


def quotient_bits(x: torch.Tensor, divisor: int, dtype: torch.dtype) -> torch.Tensor:
    """Oracle for round_to(x, dtype, divisor): RN_dtype(x / divisor), the exact
    rational rounded once (special values and signed zeros as for x itself)."""
    values = []
    for v in x.double().flatten().tolist():
        if math.isnan(v) or math.isinf(v) or v == 0.0:
            values.append(round_bits(v, dtype))
        else:
            values.append(round_bits(Fraction(v) / divisor, dtype))
    return bits_tensor(values, dtype).reshape(x.shape)


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("divisor", [1, 3, 7, 1000, 2**31 - 1, 2**32 - 1])
def test_divisor_is_one_rounding_of_the_quotient(src, dst, divisor):
    g = generator(divisor % 1000 + 7)
    x = random_values((257,), src, g)
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0], dtype=src)
    assert_bits_equal(carbon.round_to(x, dst, divisor), quotient_bits(x, divisor, dst), f"{src}->{dst} / {divisor}")


def test_divisor_quotient_just_off_a_midpoint():
    """x = 3 * 2^-134 + 2^-149 (a float32 subnormal) over 3 is 2^-134 + 2^-149/3:
    just above half of bfloat16's quantum 2^-133, so it rounds up to 2^-133
    (0x0001). Dividing in float32 first drops the 2^-149/3 and leaves the
    exact tie 2^-134, which rounds to even (0) -- so the case tells the two
    apart. (In the normal range a float32 quotient by a small n never lands
    on a bfloat16 midpoint.)"""
    x = torch.tensor([3 * 2.0**-134 + 2.0**-149], dtype=F32)
    assert x.double().item() == 3 * 2.0**-134 + 2.0**-149  # exact in float32
    naive = (x / 3).to(BF16)
    out = carbon.round_to(x, BF16, 3)
    assert_bits_equal(out, quotient_bits(x, 3, BF16), "oracle")
    assert as_bits(out).item() == 0x0001 and as_bits(naive).item() == 0x0000


@pytest.mark.parametrize("src,dst", [(F32, BF16), (BF16, F32), (F16, F16)])
def test_gradient_is_the_rounded_quotient(src, dst):
    x = random_values((33,), src, generator(3)).requires_grad_()
    carbon.round_to(x, dst, 5).backward(random_values((33,), dst, generator(4)))
    grad = random_values((33,), dst, generator(4))
    assert_bits_equal(x.grad, quotient_bits(grad, 5, src), "d x = RN(grad / divisor)")


@pytest.mark.parametrize("divisor", [0, -1, 2**32])
def test_bad_divisor_raises_value_error(divisor):
    with pytest.raises(ValueError, match=r"^carbon\.round_to"):
        carbon.round_to(torch.ones(3), F32, divisor)
