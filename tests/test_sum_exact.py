"""carbon.sum(x, dim, keepdim, dtype=...) returns, for each output element,
RN_F(exact sum of the reduced elements): one rounding (to nearest, ties to
even) of the exact real sum into the output dtype F (the `dtype` argument,
else x.dtype). Special values and the sign of an exact zero follow the
contract (§1); an empty reduction gives +0. Every result is compared bit for
bit with the exact oracle (tests/oracle.py: sum_bits)."""

import itertools
import math
import random
import struct
import zlib
from fractions import Fraction

import pytest
import torch

import carbon
from data import (
    BF16, DTYPE_PAIRS, DTYPES, F16, F32, dim_spellings, exact_tensor, finite_bit_patterns, generator,
    random_values, reduction_values, shuffle_reduced, tie_rows, to_rows,
)
from oracle import assert_bits_equal, bits_tensor, is_midpoint, round_bits, sum_bits
from reduce_util import SHAPES, check, check_memory_layouts, dims_for, hand_bits, same_bits

pytestmark = pytest.mark.skipif(not hasattr(carbon, "sum"), reason="carbon.sum not built yet")

F32_MAX = (2 - 2.0**-23) * 2.0**127
BF16_MAX = (2 - 2.0**-7) * 2.0**127
BIG = struct.unpack("<f", struct.pack("<f", 3e38))[0]  # a float32 near its maximum
INF, NAN, Z = math.inf, math.nan, -0.0


def spread_for(in_dtype, out_dtype):
    return 3 if F16 in (in_dtype, out_dtype) else 20


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------- random data, every shape / dim / dtype

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_sum_random(shape, in_dtype, out_dtype):
    g = generator(seed_of("sum", shape, in_dtype))
    x = reduction_values(shape, in_dtype, g, dim=-1 if shape else None, spread=spread_for(in_dtype, out_dtype))
    for dim in dims_for(len(shape)):
        for keepdim in (False, True):
            check("sum", x, dim, keepdim, out_dtype)


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_every_dim_combination_of_a_3d_tensor(in_dtype, out_dtype):
    g = generator(seed_of("3d", in_dtype))
    for dim_layout in (-1, (0, 2)):
        x = reduction_values((3, 4, 5), in_dtype, g, dim=dim_layout, spread=spread_for(in_dtype, out_dtype))
        for dim in dim_spellings(3):
            for keepdim in (False, True):
                check("sum", x, dim, keepdim, out_dtype)


def test_calling_conventions_and_raw_op():
    g = generator(1)
    x = random_values((3, 4, 5), BF16, g)
    full = sum_bits(x)
    assert_bits_equal(carbon.sum(x), full, "carbon.sum(x)", dtype=BF16)
    assert_bits_equal(carbon.sum(x, 1), sum_bits(x, 1), "positional dim")
    assert_bits_equal(carbon.sum(x, (0, 2), True), sum_bits(x, (0, 2), True), "positional keepdim")
    assert_bits_equal(carbon.sum(x, dim=[-1], keepdim=False, dtype=F32), sum_bits(x, -1, False, F32), "keywords", dtype=F32)
    raw = torch.ops.carbon.sum
    assert_bits_equal(raw(x), full, "raw op, defaults")
    assert_bits_equal(raw(x, None, False, None), full, "raw op, explicit None")
    assert_bits_equal(raw(x, [], False, None), full, "raw op, dim=[]")
    assert_bits_equal(raw(x, [2, 0], True, F16), sum_bits(x, (0, 2), True, F16), "raw op, dims and dtype", dtype=F16)
    assert_bits_equal(raw.default(x, [1], False, F32), sum_bits(x, 1, False, F32), "raw overload", dtype=F32)
    s = exact_tensor(-0.0, F32)
    for dim in (None, 0, -1):
        out = carbon.sum(s, dim) if dim is not None else carbon.sum(s)
        assert out.shape == () and out.dtype == F32
        assert_bits_equal(out, bits_tensor(0x80000000, F32), f"0-dim, dim={dim}")
    assert carbon.sum(s, 0, keepdim=True).shape == ()


# ---------------------------------------------------------------- hand-derived cases

# (values, input dtype, output dtype, expected bits) -- every expected value derived by hand.
HAND = [
    # cancellation of huge terms
    ([2.0**100, 1.5, -(2.0**100)], F32, F32, 0x3FC00000),
    ([-(2.0**100), 2.0**100, 2.0**-100], F32, F32, 0x0D800000),
    ([2.0**127, 2.0**-149, -(2.0**127)], F32, F32, 0x00000001),
    ([BIG, BIG, -BIG, -BIG, 1.0], F32, F32, 0x3F800000),  # partial sums overflow float32
    ([BIG, BIG, 1.0, -BIG, -BIG], F32, BF16, 0x3F80),
    ([1.5 * 2.0**127, 1.5 * 2.0**127, -1.5 * 2.0**127, -1.5 * 2.0**127, 1.0], BF16, BF16, 0x3F80),  # overflows a float32 accumulator
    ([1.5 * 2.0**127, 1.5 * 2.0**127, -1.5 * 2.0**127, -1.5 * 2.0**127, 1.0], BF16, F32, 0x3F800000),
    ([60000.0, 60000.0, -60000.0, -60000.0, 1.0], F16, F16, 0x3C00),  # overflows a float16 accumulator
    ([60000.0, 60000.0, 2.0**-24], F16, F32, 0x47EA6000),  # 120000 (2^-24 is far below half an ulp)
    # ties and the double-rounding trap
    ([1.0, 2.0**-24], F32, F32, 0x3F800000),  # tie -> even (down)
    ([1.0 + 2.0**-23, 2.0**-24], F32, F32, 0x3F800002),  # tie -> even (up)
    ([1.0, 2.0**-24, 2.0**-80], F32, F32, 0x3F800001),  # just above the tie; RN64 first would give 1
    ([1.0 + 2.0**-23, 2.0**-24, -(2.0**-80)], F32, F32, 0x3F800001),  # just below
    ([1.0, 2.0**-8], BF16, BF16, 0x3F80),
    ([1.0 + 2.0**-7, 2.0**-8], BF16, BF16, 0x3F82),
    ([1.0, 2.0**-8, 2.0**-100], BF16, BF16, 0x3F81),  # an fp32 accumulator loses 2^-100 and lands on the tie
    ([1.0 + 2.0**-7, 2.0**-8, -(2.0**-100)], BF16, BF16, 0x3F81),
    ([1.0, 2.0**-24, 2.0**-100], BF16, F32, 0x3F800001),
    ([1.0, 2.0**-8, 2.0**-80], F32, BF16, 0x3F81),  # RN_bf16(RN_f32(sum)) would be the tie -> 1
    ([1.0, 2.0**-11], F16, F16, 0x3C00),
    ([1.0, 2.0**-11, 2.0**-24], F16, F16, 0x3C01),
    ([1.0 + 2.0**-10, 2.0**-11, -(2.0**-24)], F16, F16, 0x3C01),
    ([1.0, 2.0**-11, 2.0**-40], F32, F16, 0x3C01),
    # overflow
    ([2.0**127, 2.0**127], F32, F32, 0x7F800000),
    ([F32_MAX, 2.0**103], F32, F32, 0x7F800000),  # the overflow threshold is a tie -> inf
    ([F32_MAX, 2.0**102], F32, F32, 0x7F7FFFFF),
    ([-F32_MAX, -(2.0**103)], F32, F32, 0xFF800000),
    ([BF16_MAX, 2.0**119], BF16, BF16, 0x7F80),  # bf16 max + half an ulp: tie -> inf
    ([BF16_MAX, 2.0**118], BF16, BF16, 0x7F7F),
    ([BF16_MAX, 2.0**119], BF16, F32, 0x7F7F8000),  # exact in float32
    ([65504.0, 16.0], F16, F16, 0x7C00),  # 65520: tie -> inf
    ([65504.0, 15.0], F16, F16, 0x7BFF),
    ([65504.0, 16.0], F16, F32, 0x477FF000),
    ([-65504.0, -16.0], F16, F16, 0xFC00),
    ([60000.0, 5520.0], F32, F16, 0x7C00),
    ([BIG, BIG], F32, F32, 0x7F800000),
    # just off the overflow thresholds (ties with 2^128 / 2^16), by the smallest subnormal
    ([F32_MAX, 2.0**103, -(2.0**-149)], F32, F32, 0x7F7FFFFF),
    ([F32_MAX, 2.0**103, 2.0**-149], F32, F32, 0x7F800000),
    ([-F32_MAX, -(2.0**103), 2.0**-149], F32, F32, 0xFF7FFFFF),
    ([2.0**128 - 2.0**119, -(2.0**-149)], F32, BF16, 0x7F7F),
    ([2.0**128 - 2.0**119, 2.0**-149], F32, BF16, 0x7F80),
    ([2.0**128 - 2.0**119], F32, BF16, 0x7F80),
    ([65520.0, -(2.0**-149)], F32, F16, 0x7BFF),
    ([65520.0, 2.0**-149], F32, F16, 0x7C00),
    ([65504.0, 8.0, 8.0, -(2.0**-24)], F16, F16, 0x7BFF),
    # subnormals and underflow
    ([2.0**-149, 2.0**-149], F32, F32, 0x00000002),
    ([2.0**-126, -(2.0**-149)], F32, F32, 0x007FFFFF),
    ([2.0**-149, 2.0**-149, 2.0**-149], F32, BF16, 0x0000),  # 3 * 2^-149 << half a bf16 quantum
    ([2.0**-134, 2.0**-135], F32, BF16, 0x0001),  # 0.75 quanta -> 1
    ([3 * 2.0**-134], F32, BF16, 0x0002),  # 1.5 quanta -> 2 (even)
    ([2.0**-133, 2.0**-133, 2.0**-133], BF16, BF16, 0x0003),
    ([2.0**-24, 2.0**-24, 2.0**-24], F16, F16, 0x0003),
    ([2.0**-25, 2.0**-26], F32, F16, 0x0001),
    ([2.0**-25, -(2.0**-40)], F32, F16, 0x0000),  # just below half a quantum -> +0
    ([-(2.0**-25), -(2.0**-40)], F32, F16, 0x8001),
    ([-(2.0**-30)], F32, F16, 0x8000),  # a negative value that underflows keeps its sign
    ([-(2.0**-30), 2.0**-31], F32, F16, 0x8000),
    ([-(2.0**-140)], F32, BF16, 0x8000),
]


@pytest.mark.parametrize("values,in_dtype,out_dtype,bits", HAND, ids=[f"{i}" for i in range(len(HAND))])
def test_hand_derived_sums_in_every_order(values, in_dtype, out_dtype, bits):
    perms = list(itertools.permutations(values))
    x = exact_tensor([list(p) for p in perms], in_dtype)  # every order, one row each
    expected = bits_tensor([bits] * len(perms), out_dtype)
    assert_bits_equal(sum_bits(x, 1, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    assert_bits_equal(carbon.sum(x, 1, dtype=out_dtype), expected, f"{values} -> {out_dtype}")
    # the same reduction over dim 0 of the transpose, and as a full reduction of each row
    assert_bits_equal(carbon.sum(x.t(), 0, dtype=out_dtype), expected, "over dim 0 of the transpose")
    assert_bits_equal(carbon.sum(x[0], dtype=out_dtype), bits_tensor(bits, out_dtype), "full reduction")


SPECIAL = [
    ([INF, 1.0], "+inf"),
    ([INF, -(2.0**100), 2.0**100], "+inf"),
    ([-INF, 5.0, BIG, BIG], "-inf"),  # an infinity wins over a finite overflow
    ([INF, -INF], "nan"),
    ([1.0, -INF, 2.0, INF, 3.0], "nan"),
    ([INF, INF], "+inf"),
    ([-INF, -INF, -0.0], "-inf"),
    ([NAN, 1.0], "nan"),
    ([NAN, INF], "nan"),
    ([-0.0, NAN, -INF], "nan"),
    ([Z], "-0"),
    ([Z, Z, Z], "-0"),
    ([Z, 0.0], "+0"),
    ([0.0, Z], "+0"),
    ([0.0], "+0"),
    ([1.0, -1.0], "+0"),  # cancellation -> +0
    ([-1.0, 1.0, Z], "+0"),
    ([-(2.0**-100), Z, 2.0**-100], "+0"),
    ([], "+0"),  # empty sum
]


def fit(v, dtype):
    """A stand-in of the same role for values the input dtype cannot hold."""
    if abs(v) == BIG and dtype != F32:
        return math.copysign(BF16_MAX if dtype == BF16 else 65504.0, v)
    if dtype == F16 and abs(v) in (2.0**100, 2.0**-100):
        return math.copysign(2.0**10 if abs(v) > 1 else 2.0**-20, v)
    return v


@pytest.mark.parametrize("values,kind", SPECIAL, ids=[f"{i}" for i in range(len(SPECIAL))])
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_special_values_and_signed_zeros(values, kind, in_dtype, out_dtype):
    values = [fit(v, in_dtype) for v in values]
    x = exact_tensor([values], in_dtype).reshape(1, len(values))
    expected = bits_tensor([hand_bits(kind, out_dtype)], out_dtype)
    assert_bits_equal(sum_bits(x, 1, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    assert_bits_equal(carbon.sum(x, 1, dtype=out_dtype), expected, f"{values}")
    assert_bits_equal(carbon.sum(x.flip(1), -1, dtype=out_dtype), expected, f"{values} reversed")
    assert_bits_equal(carbon.sum(x[0], dtype=out_dtype), expected[0], f"{values} full reduction")


@pytest.mark.parametrize("dtype,nan_bits", [(F32, [0x7FC12345, 0xFFC00000, 0x7F800001, 0xFFFFFFFF]),
                                            (BF16, [0x7FC1, 0xFFC0, 0x7F81, 0xFFFF]),
                                            (F16, [0x7E01, 0xFE00, 0x7C01, 0xFFFF])])
def test_nan_payloads_become_the_canonical_nan(dtype, nan_bits):
    width = 32 if dtype == F32 else 16
    int_dtype = torch.int32 if dtype == F32 else torch.int16
    nans = torch.tensor([b - (1 << width) if b >> (width - 1) else b for b in nan_bits], dtype=int_dtype).view(dtype)
    x = torch.stack([nans, torch.ones(4, dtype=dtype), -nans], dim=1)  # rows [nan_i, 1, -nan_i]
    for out_dtype in DTYPES:
        check("sum", x, 1, dtype=out_dtype)
        check("sum", x[:, :1], 1, dtype=out_dtype)
        check("sum", x, 0, dtype=out_dtype)


def test_empty_reductions_give_positive_zero():
    for shape, dim in [((0,), None), ((0,), 0), ((3, 0), 1), ((0, 4), 0), ((2, 0, 3), 1), ((2, 0, 3), (0, 1)),
                       ((2, 0, 3), None), ((0, 0), [])]:
        for in_dtype, out_dtype in DTYPE_PAIRS:
            x = torch.zeros(shape, dtype=in_dtype)
            for keepdim in (False, True):
                out = check("sum", x, dim, keepdim, out_dtype)
                assert out.numel() == 0 or bool((out == 0).all() and not out.signbit().any()), f"{shape} {dim}"
    # -0 elements elsewhere do not matter to the empty ones
    x = exact_tensor([[Z, Z], [Z, 0.0]], F32)
    assert_bits_equal(carbon.sum(x[:, :0], 1), bits_tensor([0, 0], F32), "empty rows")


# ---------------------------------------------------------------- ties in every output format

NUDGES = {"tie": 0.0, "just-above": 2.0**-60, "just-below": -(2.0**-60), "near-above": 2.0**-30, "near-below": -(2.0**-30)}


@pytest.mark.parametrize("nudge", NUDGES.values(), ids=NUDGES.keys())
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_exact_ties_in_every_output_format(out_dtype, in_dtype, nudge):
    rng = random.Random(f"sum{out_dtype}{in_dtype}{nudge}")
    rows = tie_rows(in_dtype, out_dtype, 24, 10, nudge, rng, pairs=2)
    x = exact_tensor(rows, in_dtype)
    ties = sum(is_midpoint(sum(Fraction(v) for v in r), out_dtype) for r in x.double().tolist())
    assert ties == (24 if nudge == 0 else 0), f"{ties} ties: the data no longer tests tie breaking"
    check("sum", x, 1, dtype=out_dtype, context=f"nudge {nudge}")
    check("sum", x.t(), 0, dtype=out_dtype, context=f"transposed, nudge {nudge}")
    check("sum", x.reshape(24, 2, 5), (1, 2), True, out_dtype, context=f"two dims, nudge {nudge}")


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_integer_rows_have_many_ties(out_dtype):
    """Sums of integers (exact in every input format used) that need more bits
    than the output has: many are exact ties, all must round to even."""
    g = generator(5)
    bound = {F32: 2**23, BF16: 2**8, F16: 2**11}[out_dtype]
    x = torch.randint(-bound, bound, (64, 12), generator=g).to(F32)
    ties = sum(is_midpoint(v, out_dtype) for v in x.long().sum(1).tolist())
    assert ties >= 8, f"only {ties} ties: the data no longer tests tie breaking"
    check("sum", x, 1, dtype=out_dtype)
    if out_dtype != F32:
        check("sum", x.to(out_dtype), 1)  # the same integers in the narrow format itself


@pytest.mark.parametrize("n,bits", [(257, 0x4380), (259, 0x4382), (258, 0x4381), (263, 0x4384)])
def test_sums_of_ones_tie_in_bfloat16(n, bits):
    # 257 = 256 + 1: a tie between 256 and 258 -> 256; 259: between 258 and 260 -> 260; 263: 262|264 -> 264
    x = torch.ones(n, dtype=BF16)
    assert_bits_equal(carbon.sum(x), bits_tensor(bits, BF16), f"{n} ones")
    assert_bits_equal(carbon.sum(x), sum_bits(x))


def test_sum_of_2_pow_24_plus_3_ones():
    """16777219 ones: exact sum 2^24 + 3, a float32 tie between 2^24 + 2 and
    2^24 + 4 -> 2^24 + 4 (0x4B800002). A float32 running sum stops at 2^24."""
    n = 2**24 + 3
    x = torch.ones(n, dtype=F32)
    assert round_bits(n, F32) == 0x4B800002
    assert_bits_equal(carbon.sum(x), bits_tensor(0x4B800002, F32), "2^24+3 ones")
    assert_bits_equal(carbon.sum(x, dtype=BF16), bits_tensor(round_bits(n, BF16), BF16), "to bfloat16")
    assert_bits_equal(carbon.sum(x, dtype=F16), bits_tensor(0x7C00, F16), "to float16: inf")
    assert_bits_equal(carbon.mean(x), bits_tensor(0x3F800000, F32), "mean of 2^24+3 ones")
    x[::2] = -1.0  # 2^23 + 2 elements -1 and 2^23 + 1 elements +1: exact sum -1
    assert_bits_equal(carbon.sum(x), bits_tensor(round_bits(-1, F32), F32), "alternating signs")
    assert_bits_equal(carbon.mean(x), bits_tensor(round_bits(Fraction(-1, n), F32), F32), "mean: -1 / (2^24+3)")
    assert_bits_equal(carbon.mean(x, dtype=BF16), bits_tensor(round_bits(Fraction(-1, n), BF16), BF16), "to bfloat16")


# ---------------------------------------------------------------- wide dynamic range, overflow

@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_values_spanning_the_whole_exponent_range(in_dtype, out_dtype):
    rng = random.Random(f"span{in_dtype}{out_dtype}")
    rows = []
    for r in range(12):
        if in_dtype == F16:
            vals = [math.ldexp(rng.uniform(-2, 2), rng.randint(-24, 14)) for _ in range(64)]
        else:
            vals = finite_bit_patterns(64, rng, 0, 253)
        vals = exact_tensor(vals, F32 if in_dtype != F16 else torch.float64).to(in_dtype).double().tolist()
        if r % 3 == 1:  # cancel everything but the 6 smallest magnitudes: a tiny (often subnormal) sum
            keep = sorted(vals, key=abs)[:6]
            big = [v for v in vals if v not in keep]
            vals = keep + big + [-v for v in big]
        elif r % 3 == 2:  # cancel everything but the largest 2 and smallest 2
            s = sorted(vals, key=abs)
            vals = s[:2] + s[-2:] + s[2:-2] + [-v for v in s[2:-2]]
        rng.shuffle(vals)
        rows.append((vals + [0.0] * 130)[:130])
    x = exact_tensor(rows, torch.float64).to(in_dtype)
    check("sum", x, 1, dtype=out_dtype)
    if out_dtype == in_dtype:
        out = carbon.sum(x, 1)
        if in_dtype != F16:
            assert bool((out[1::3] != 0).any()), "the cancelled rows should leave tiny sums"


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, F32), (BF16, BF16), (F16, F16), (F32, F16), (BF16, F32), (F32, BF16)])
def test_sums_near_overflow(in_dtype, out_dtype):
    g = generator(seed_of("overflow", in_dtype, out_dtype))
    top = {F32: 126, BF16: 126, F16: 14}[out_dtype]
    x = random_values((40, 6), in_dtype, g, spread=1, scale_exp=top if in_dtype != F16 else 13).abs()
    x[::2, :3] = -x[::2, :3]
    out = check("sum", x, 1, dtype=out_dtype)
    assert bool(out.isinf().any()) and bool(out.isfinite().any()), "the data should give both overflows and finite sums"


def test_subnormal_sums():
    g = generator(13)
    for in_dtype, out_dtype, scale in [(F32, F32, -140), (F32, BF16, -128), (BF16, BF16, -128), (F16, F16, -20),
                                       (F32, F16, -20), (BF16, F32, -130)]:
        x = random_values((30, 9), in_dtype, g, spread=3, scale_exp=scale)
        out = check("sum", x, 1, dtype=out_dtype)
        assert bool(((out != 0) & (out.abs() < torch.finfo(out_dtype).tiny)).any()), "should produce subnormal sums"


# ---------------------------------------------------------------- many elements

@pytest.mark.parametrize("in_dtype,out_dtype,tie,extra,bits", [
    (F32, F32, [1.0, 2.0**-24], [], 0x3F800000),
    (F32, F32, [1.0, 2.0**-24], [2.0**-100], 0x3F800001),
    (F32, F32, [1.0 + 2.0**-23, 2.0**-24], [], 0x3F800002),
    (F32, F32, [1.0 + 2.0**-23, 2.0**-24], [-(2.0**-149)], 0x3F800001),
    (BF16, BF16, [1.0, 2.0**-8], [], 0x3F80),
    (BF16, BF16, [1.0, 2.0**-8], [2.0**-120], 0x3F81),
    (BF16, F32, [1.0, 2.0**-24], [2.0**-120], 0x3F800001),
    (F32, BF16, [1.0, 2.0**-8], [-(2.0**-149)], 0x3F80),
    (F16, F16, [1.0, 2.0**-11], [2.0**-24], 0x3C01),
])
def test_100k_elements_with_a_planted_tie(in_dtype, out_dtype, tie, extra, bits):
    """50k random values, their 50k negatives, and a planted tie (plus a tiny
    nudge), shuffled: the exact sum is the tie (+ nudge)."""
    g = generator(seed_of("100k", in_dtype, out_dtype, len(extra)))
    v = random_values((50_000,), in_dtype, g, spread=3 if in_dtype == F16 else 40)
    planted = exact_tensor(tie + extra, in_dtype)
    x = torch.cat([v, -v, planted])
    x = x[torch.randperm(x.numel(), generator=g)]
    expected = bits_tensor(bits, out_dtype)
    assert_bits_equal(sum_bits(x, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    assert_bits_equal(carbon.sum(x, dtype=out_dtype), expected, "1-D")
    # as a few long rows: the planted row and rows of pure cancellation
    rows = torch.stack([x, x.flip(0), torch.cat([v, -v, torch.zeros(len(planted), dtype=in_dtype)])])
    assert_bits_equal(carbon.sum(rows, 1, dtype=out_dtype), bits_tensor([bits, bits, 0], out_dtype), "rows")
    assert_bits_equal(carbon.sum(rows.t(), 0, dtype=out_dtype), bits_tensor([bits, bits, 0], out_dtype), "columns")


@pytest.mark.parametrize("nudge_sign", [1, -1])
@pytest.mark.parametrize("in_dtype,out_dtype,tie,nudge,scale_exp,bits", [
    (F32, F32, [1.0, 2.0**-24], 2.0**-44, 0, (0x3F800001, 0x3F800000)),
    (BF16, F32, [1.0, 2.0**-24], 2.0**-44, 0, (0x3F800001, 0x3F800000)),
    (F32, BF16, [1.0, 2.0**-8], 2.0**-40, 0, (0x3F81, 0x3F80)),
    (F16, F16, [1.0, 2.0**-11], 2.0**-24, 8, (0x3C01, 0x3C00)),
])
def test_long_rows_just_off_a_tie(restore_num_threads, in_dtype, out_dtype, tie, nudge, scale_exp, bits, nudge_sign):
    """A long row (several chunks) whose exact sum is a tie plus a nudge far
    below tier 1's error bound (n max |x| is large: big values that cancel)
    but far above the compensated tier's (~2^-53 of the sum): the compensated
    tier decides it, whichever way the nudge points, at 1 and 2 threads."""
    g = generator(seed_of("offtie", in_dtype, out_dtype))
    v = random_values((40_001,), in_dtype, g, spread=3 if in_dtype == F16 else 40, scale_exp=scale_exp)
    planted = exact_tensor(tie + [nudge_sign * nudge], in_dtype)
    x = torch.cat([v, -v, planted])
    x = x[torch.randperm(x.numel(), generator=g)]
    expected = bits_tensor(bits[0] if nudge_sign > 0 else bits[1], out_dtype)
    assert_bits_equal(sum_bits(x, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert_bits_equal(carbon.sum(x, dtype=out_dtype), expected, f"1-D, {threads} threads")
        assert_bits_equal(carbon.sum(x[None], 1, dtype=out_dtype), bits_tensor([bits[0] if nudge_sign > 0 else bits[1]],
                                                                               out_dtype), f"one row, {threads} threads")


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (BF16, None), (F16, None), (F32, BF16)])
def test_permutation_invariance(in_dtype, out_dtype):
    g = generator(seed_of("perm", in_dtype))
    rng = random.Random(7)
    x = reduction_values((6, 40, 5), in_dtype, g, dim=(1,), spread=spread_for(in_dtype, out_dtype or in_dtype))
    ties = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 6, 40, 2.0**-60, rng), in_dtype)
    x[:, :, 4] = ties  # column 4 of every row: a sum just off a tie
    for dim in [1, (0, 2), None, 2, (0, 1), [-1, -2]]:
        reference = carbon.sum(x, dim, dtype=out_dtype)
        assert_bits_equal(reference, sum_bits(x, dim, dtype=out_dtype), f"oracle, dim {dim}")
        for trial in range(3):
            y = shuffle_reduced(x, dim, g)
            assert not torch.equal(y, x) or x.numel() == 0
            same_bits(carbon.sum(y, dim, dtype=out_dtype), reference, f"shuffled {trial}, dim {dim}")


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (BF16, BF16)])
def test_batch_invariance(in_dtype, out_dtype):
    g = generator(seed_of("batch", in_dtype))
    x = reduction_values((48, 777), in_dtype, g, dim=1, spread=spread_for(in_dtype, out_dtype or in_dtype))
    rng = random.Random(3)
    x[::4, :10] = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 12, 10, 0.0, rng), in_dtype)
    x[::4, 10:] = 0
    full = carbon.sum(x, 1, dtype=out_dtype)
    for rows in (1, 5, 16):
        for start in range(0, 48, rows):
            same_bits(carbon.sum(x[start : start + rows], 1, dtype=out_dtype), full[start : start + rows],
                      f"rows {start}:{start + rows}")
    for i in (0, 4, 17):
        same_bits(carbon.sum(x[i], dtype=out_dtype), full[i], f"row {i} as a 1-D full reduction")
    assert_bits_equal(full[::7], sum_bits(x[::7], 1, dtype=out_dtype), "oracle subset")
    # columns: reduce dim 0 of the transpose-shaped data, one column alone vs all
    xt = x.t().contiguous()  # (777, 48), reduce dim 0
    cols = carbon.sum(xt, 0, dtype=out_dtype)
    same_bits(cols, full, "columns == rows")
    for j in (0, 5, 47):
        same_bits(carbon.sum(xt[:, j : j + 1], 0, dtype=out_dtype), full[j : j + 1], f"column {j} alone")
    # 3-D: a slice of the kept dim alone
    x3 = x[:, :776].reshape(48, 8, 97)
    out3 = carbon.sum(x3, (0, 2), dtype=out_dtype)
    for k in range(8):
        same_bits(carbon.sum(x3[:, k], dtype=out_dtype), out3[k], f"3-D slice {k}")


@pytest.mark.parametrize("out_dtype", [None, BF16, F16])
def test_thread_count_does_not_matter(restore_num_threads, out_dtype):
    g = generator(31)
    x = reduction_values((256, 4096), F32, g, dim=1, spread=30 if out_dtype != F16 else 3)
    flat = reduction_values((1 << 20,), F32, g, dim=0, spread=30 if out_dtype != F16 else 3)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append([carbon.sum(x, 1, dtype=out_dtype), carbon.sum(x, 0, dtype=out_dtype),
                        carbon.sum(x, dtype=out_dtype), carbon.sum(flat, dtype=out_dtype)])
    for name, one, two in zip(["rows", "columns", "all of x", "1M elements"], *results):
        same_bits(one, two, f"{name}: 1 vs 2 threads")
    one_rows, one_cols, one_all, one_flat = results[0]
    assert_bits_equal(one_rows[::61], sum_bits(x[::61], 1, dtype=out_dtype), "rows vs oracle")
    assert_bits_equal(one_cols[::997], sum_bits(x[:, ::997], 0, dtype=out_dtype), "columns vs oracle")
    if out_dtype is None:  # (the oracle's pure-Python pass over 1M elements takes a second)
        assert_bits_equal(one_flat, sum_bits(flat, dtype=out_dtype), "1M elements vs oracle")
    else:
        assert_bits_equal(one_all, sum_bits(x, dtype=out_dtype), "all of x vs oracle")


@pytest.mark.parametrize("in_dtype", DTYPES)
def test_memory_layout_does_not_matter(in_dtype):
    g = generator(seed_of("layout", in_dtype))
    base = reduction_values((12, 10, 8), in_dtype, g, dim=(0, 2), spread=spread_for(in_dtype, in_dtype))
    x4 = reduction_values((2, 3, 5, 4), in_dtype, g, dim=1).contiguous(memory_format=torch.channels_last)
    check_memory_layouts("sum", base, x4)


# ---------------------------------------------------------------- property test

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NICE = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 2.0**-24, 2.0**-14, 2.0**-126, 2.0**-149, 65504.0, 2.0**100, -(2.0**-60),
        2.0**127, -(2.0**127)]


def _element(dtype):
    width = 16 if dtype == F16 else 32
    return st.one_of(
        st.floats(width=width, allow_nan=False, allow_infinity=False, allow_subnormal=True),
        st.floats(min_value=-8.0, max_value=8.0, width=width),
        st.sampled_from(NICE),
    )


@st.composite
def reductions(draw):
    in_dtype = draw(st.sampled_from(DTYPES))
    out_dtype = draw(st.sampled_from((None,) + DTYPES))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 5)) for _ in range(ndim))
    n = math.prod(shape)
    values = draw(st.lists(_element(in_dtype), min_size=n, max_size=n))
    if values and draw(st.integers(0, 3)) == 0:  # a quarter of the examples get special values
        for _ in range(draw(st.integers(1, 2))):
            values[draw(st.integers(0, n - 1))] = draw(st.sampled_from([INF, -INF, NAN]))
    x = torch.tensor(values, dtype=torch.float64).reshape(shape).to(in_dtype)
    dim = draw(st.sampled_from(dim_spellings(ndim) if ndim else [None, 0, -1]))
    keepdim = draw(st.booleans())
    return x, dim, keepdim, out_dtype


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(reductions())
def test_property_matches_oracle(problem):
    x, dim, keepdim, out_dtype = problem
    check("sum", x, dim, keepdim, out_dtype, context=f"x={x.tolist()}")


# ---------------------------------------------------------------- every layout of the work, at 1 and 2 threads

def path_cases(op, in_dtype, out_dtype):
    """Shapes that send the work down different kernel paths: many short rows,
    a few long rows (split into chunks), leading-dim (column) reductions with
    more rows than one chunk, a middle dim, everything; each with ties planted."""
    g = generator(seed_of("paths", op, in_dtype, out_dtype))
    rng = random.Random(f"paths{op}{in_dtype}{out_dtype}")
    spread = spread_for(in_dtype, out_dtype or in_dtype)
    cases = []
    x = reduction_values((100_000, 3), in_dtype, g, dim=1, spread=spread)
    cases.append(("100k rows of 3", x, 1))
    x = reduction_values((1, 150_001), in_dtype, g, dim=1, spread=spread)
    cases.append(("one row of 150001", x, 1))
    x = reduction_values((3000, 600), in_dtype, g, dim=0, spread=spread)
    x[:, :300] = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 300, 3000, 0.0, rng), in_dtype).t()
    cases.append(("columns: 3000 x 600, dim 0", x, 0))
    x = reduction_values((4, 3000, 70), in_dtype, g, dim=1, spread=spread)
    cases.append(("middle dim of (4, 3000, 70)", x, 1))
    cases.append(("(4, 3000, 70) dims (0, 2)", x, (0, 2)))
    cases.append(("all of (4, 3000, 70)", x, None))
    return cases


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (F32, BF16)])
def test_every_kernel_path_at_1_and_2_threads(restore_num_threads, in_dtype, out_dtype):
    for name, x, dim in path_cases("sum", in_dtype, out_dtype):
        torch.set_num_threads(1)
        one = carbon.sum(x, dim, dtype=out_dtype)
        torch.set_num_threads(2)
        two = carbon.sum(x, dim, dtype=out_dtype)
        same_bits(one, two, f"{name}: 1 vs 2 threads")
        flat = one.reshape(-1)
        picks = list(range(0, flat.numel(), max(1, flat.numel() // 7)))[:8]
        assert_bits_equal(flat[picks], sum_bits(to_rows(x, dim)[picks], 1, dtype=out_dtype), f"{name}: oracle subset")


# The float32 groups of the CPU's 16-bit sums (csrc/reduce/groups16_avx512.h):
# per format, the largest exponent-field span they accept, the unit of the
# significand's last bit at exponent 0, and a value far below every lane's.
GROUPS = {BF16: dict(span=13, ulp=2.0**-7, tiny=2.0**-40), F16: dict(span=10, ulp=2.0**-10, tiny=2.0**-24)}


def float32_group_lane(dtype, span: int) -> list:
    """Eight values of `dtype` whose exponent fields lie `span` apart: seven of
    2 - ulp and one of 2^-span (1 + ulp). Their exact sum needs 24 bits at the
    format's accepted span and 25 one above it, where float32 would round it
    (a tie, to even: down)."""
    ulp = GROUPS[dtype]["ulp"]
    return [2 - ulp] * 7 + [2.0**-span * (1 + ulp)]


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_float32_group_lanes_are_what_they_claim(dtype):
    limit = GROUPS[dtype]["span"]
    for span, exact in ((limit, True), (limit + 1, False)):
        values = float32_group_lane(dtype, span)
        assert torch.equal(torch.tensor(values).to(dtype).double(), torch.tensor(values, dtype=torch.float64))
        total = sum(Fraction(v) for v in values)
        as_float32 = Fraction(torch.tensor(float(total), dtype=torch.float64).float().item())
        assert (as_float32 == total) == exact, span


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_16bit_float32_groups_beside_groups_that_are_not(op, dtype):
    """On AVX-512 the CPU adds bfloat16 and float16 values 8 at a time in
    float32 (rows: elements 32 apart within 256; columns: 8 consecutive rows)
    when every lane's exponents lie at most 13 (bfloat16) or 10 (float16)
    apart, which keeps those sums exact; a group with one lane a step further
    apart is added value by value. Each such lane's sum gets a tiny term from
    another lane or group, which breaks the tie that an inexact group sum
    would have rounded away: a test that let the wider span through would
    give the wrong float32 result, decided. Groups whose float32 sums are not
    finite (bfloat16 values near its maximum, exponents close; float16
    infinities of both signs) must leave the exact tiers the answer. Checked
    against the exact oracle for row and column layouts of several lengths."""
    rng = random.Random(seed_of("bf16 groups" if dtype == BF16 else "f16 groups", op))
    g = generator(seed_of("bf16 groups" if dtype == BF16 else "f16 groups", op))
    limit, tiny = GROUPS[dtype]["span"], GROUPS[dtype]["tiny"]
    special_lane = ([BF16_MAX, BF16_MAX, -BF16_MAX, -BF16_MAX, 2.0**120, 0.0, 0.0, 0.0] if dtype == BF16 else
                    [INF, 1.0, -INF, 2.0, 0.0, 0.0, 0.0, 0.0])
    for n in (256, 257, 300, 512, 773):
        x = torch.zeros(9, n, dtype=torch.float64)
        for r in range(9):
            lane = rng.randrange(31)
            kind = r % 4
            if kind == 3:  # ordinary values, a random lane planted in a random group
                x[r] = reduction_values((1, n), dtype, g, dim=1, spread=spread_for(dtype, F32))[0].double()
            group = rng.randrange(n // 256) * 256
            values = special_lane if kind == 2 else float32_group_lane(dtype, limit + kind)
            for q, v in enumerate(values):
                x[r, group + lane + 32 * q] = v
            if kind < 2:
                x[r, group + lane + 1] = tiny  # another lane
        x = x.to(dtype)
        check(op, x, 1, False, F32, f"rows of {n}")
    for rows in (8, 9, 16, 71, 1030):
        x = torch.zeros(rows, 70, dtype=torch.float64)
        for col in range(70):
            kind = col % 4
            if kind == 3:
                x[:, col] = reduction_values((rows, 1), dtype, g, dim=0, spread=spread_for(dtype, F32))[:, 0].double()
            start = rng.randrange(rows // 8) * 8
            values = special_lane if kind == 2 else float32_group_lane(dtype, limit + kind)
            x[start:start + 8, col] = torch.tensor(values, dtype=torch.float64)
            if kind < 2 and rows > 8:
                x[(start + 8) % rows if rows >= 16 else 8, col] = tiny
        x = x.to(dtype)
        check(op, x, 0, False, F32, f"columns of {rows} rows")
        check(op, x, 0, False, None, f"columns of {rows} rows, {dtype} output")


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, None), (F16, F32), (F32, BF16)])
def test_rows_decided_in_blocks_beside_rows_that_are_not(op, in_dtype, out_dtype):
    """The CPU decides many rows' roundings together (blocks of 64) and bounds
    each row's error by n * max|x| on AVX-512: rows that the fast test cannot
    decide -- exact ties, zeros, NaN, infinities, one outlier among small
    values, subnormal sums -- sit at every position of a block among rows it
    decides, with lengths covering every tail of the 32-chain loop; each row
    is checked against the exact oracle, at 130 rows (two full blocks and a
    partial one) and for columns (dim 0) as well."""
    rng = random.Random(seed_of("blocks", op, in_dtype, out_dtype))
    g = generator(seed_of("blocks", op, in_dtype))
    for n in (1, 5, 31, 32, 33, 64, 97):
        x = reduction_values((130, n), in_dtype, g, dim=1, spread=spread_for(in_dtype, out_dtype))
        ties = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 130, n, 0.0, rng), in_dtype) if n >= 16 else None
        for r in range(130):
            kind = (r * 5 + n) % 9
            if kind == 0 and ties is not None:
                x[r] = ties[r]
            elif kind == 1:
                x[r, rng.randrange(n)] = NAN
            elif kind == 2:
                x[r] = 0.0
            elif kind == 3:
                x[r, rng.randrange(n)] = INF if rng.random() < 0.5 else -INF
            elif kind == 4:
                x[r, rng.randrange(n)] = 1e4  # the max-magnitude bound is loose: still decided, or left to tier 2
            elif kind == 5:
                x[r] = x[r] * 2.0**-140 if in_dtype != F16 else x[r] * 2.0**-20
        check(op, x, 1, False, out_dtype, f"rows of {n}")
        check(op, x.t().contiguous().t(), 1, False, out_dtype, f"rows of {n}, transposed layout")
        check(op, x.t().contiguous(), 0, False, out_dtype, f"columns of {n}")
