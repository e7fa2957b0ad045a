"""carbon.mean(x, dim, keepdim, dtype=...) returns, for each output element,
RN_F(exact sum / n), n the number of reduced elements: ONE rounding of the
exact quotient (never the rounded sum divided, never a double-precision
quotient rounded again). inf / n = inf, NaN rules as for the sum, an exact
zero sum gives the sum's zero, an empty reduction (n = 0) gives NaN.
Compared bit for bit with the exact oracle (tests/oracle.py: mean_bits)."""

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
    BF16, DTYPE_PAIRS, DTYPES, F16, F32, dim_spellings, exact_tensor, finite_bit_patterns,
    generator, midpoint_mean_rows, random_values, reduction_values, shuffle_reduced, to_rows,
)
from oracle import assert_bits_equal, bits_tensor, bits_to_float, exact_value, is_midpoint, mean_bits, round_bits
from reduce_util import SHAPES, check, check_memory_layouts, dims_for, hand_bits, same_bits

pytestmark = pytest.mark.skipif(not hasattr(carbon, "mean"), reason="carbon.mean not built yet")

F32_MAX = (2 - 2.0**-23) * 2.0**127
BF16_MAX = (2 - 2.0**-7) * 2.0**127
BIG = struct.unpack("<f", struct.pack("<f", 3e38))[0]
BIG_HALF_BITS = struct.unpack("<I", struct.pack("<f", BIG / 2))[0]
INF, NAN, Z = math.inf, math.nan, -0.0


def spread_for(in_dtype, out_dtype):
    return 3 if F16 in (in_dtype, out_dtype) else 20


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------- naive alternatives (must differ where targeted)


def naive_double(values, out_dtype) -> int:
    """RN_F(RN64(RN64(sum) / n)): a double-precision sum (here even correctly
    rounded), a double division, then rounding to F."""
    s = float(exact_value(values))  # Fraction -> float is correctly rounded
    return round_bits(s / len(values), out_dtype)


def naive_rounded_sum(values, out_dtype, via=F32) -> int:
    """RN_F(RN_via(sum) / n): the sum rounded to `via` first, then the exact quotient rounded."""
    s = bits_to_float(round_bits(exact_value(values), via), via)
    return round_bits(Fraction(s) / len(values), out_dtype)


# ---------------------------------------------------------------- random data, every shape / dim / dtype

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_mean_random(shape, in_dtype, out_dtype):
    g = generator(seed_of("mean", shape, in_dtype))
    x = reduction_values(shape, in_dtype, g, dim=-1 if shape else None, spread=spread_for(in_dtype, out_dtype))
    for dim in dims_for(len(shape)):
        for keepdim in (False, True):
            check("mean", x, dim, keepdim, out_dtype)


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_every_dim_combination_of_a_3d_tensor(in_dtype, out_dtype):
    g = generator(seed_of("mean3d", in_dtype))
    for dim_layout in (-1, (0, 2)):
        x = reduction_values((3, 5, 7), in_dtype, g, dim=dim_layout, spread=spread_for(in_dtype, out_dtype))
        for dim in dim_spellings(3):
            for keepdim in (False, True):
                check("mean", x, dim, keepdim, out_dtype)


def test_calling_conventions_and_raw_op():
    g = generator(2)
    x = random_values((3, 5, 6), BF16, g)
    full = mean_bits(x)
    assert_bits_equal(carbon.mean(x), full, "carbon.mean(x)", dtype=BF16)
    assert_bits_equal(carbon.mean(x, 1), mean_bits(x, 1), "positional dim")
    assert_bits_equal(carbon.mean(x, (0, 2), True), mean_bits(x, (0, 2), True), "positional keepdim")
    assert_bits_equal(carbon.mean(x, dim=[-1], keepdim=False, dtype=F32), mean_bits(x, -1, False, F32), "keywords")
    raw = torch.ops.carbon.mean
    assert_bits_equal(raw(x), full, "raw op, defaults")
    assert_bits_equal(raw(x, None, False, None), full, "raw op, explicit None")
    assert_bits_equal(raw(x, [], False, None), full, "raw op, dim=[]")
    assert_bits_equal(raw(x, [2, 0], True, F16), mean_bits(x, (0, 2), True, F16), "raw op, dims and dtype", dtype=F16)
    assert_bits_equal(raw.default(x, [1], False, F32), mean_bits(x, 1, False, F32), "raw overload", dtype=F32)
    s = exact_tensor(3.0, F16)
    for dim in (None, 0, -1):
        out = carbon.mean(s, dim) if dim is not None else carbon.mean(s)
        assert out.shape == () and out.dtype == F16
        assert_bits_equal(out, bits_tensor(0x4200, F16), f"0-dim, dim={dim}")


# ---------------------------------------------------------------- hand-derived cases

HAND = [
    # (values, input dtype, output dtype, expected bits) -- derived by hand, checked against the oracle too
    ([1.0, 0.0, 0.0], F32, F32, 0x3EAAAAAB),  # 1/3
    ([1.0, 0.0, 0.0], F32, BF16, 0x3EAB),
    ([1.0, 0.0, 0.0], F32, F16, 0x3555),
    ([1.0, 0.0, 0.0], BF16, F32, 0x3EAAAAAB),
    ([1.0, 2.0, 3.0, 4.0], F16, F16, 0x4100),  # 2.5
    ([1.0, 0.0, 0.0, 0.0, 0.0], F32, F32, 0x3E4CCCCD),  # 1/5 (0.2)
    # the quotient is just above / below a float32 midpoint; a double quotient lands on it
    ([2.0 + 2.0**-22, 1.0 - 2.0**-24, 2.0**-80], F32, F32, 0x3F800001),  # (3 + 3*2^-24 + 2^-80) / 3
    ([2.0 + 3 * 2.0**-22, 1.0 - 3 * 2.0**-24, -(2.0**-80)], F32, F32, 0x3F800001),  # (3 + 9*2^-24 - 2^-80) / 3
    # sums that overflow the format while the mean does not
    ([F32_MAX, F32_MAX], F32, F32, 0x7F7FFFFF),
    ([F32_MAX, F32_MAX, F32_MAX], F32, F32, 0x7F7FFFFF),
    ([-F32_MAX, -F32_MAX], F32, F32, 0xFF7FFFFF),
    ([F32_MAX, F32_MAX, F32_MAX], F32, BF16, 0x7F80),  # F32_MAX itself rounds to bfloat16 inf
    ([F32_MAX, F32_MAX, F32_MAX], F32, F16, 0x7C00),
    ([BF16_MAX, BF16_MAX], BF16, BF16, 0x7F7F),
    ([BIG, BIG, -BIG, BIG], F32, F32, BIG_HALF_BITS),  # 2 * BIG / 4 = BIG / 2
    ([65504.0, 65504.0], F16, F16, 0x7BFF),
    ([65504.0, 65504.0, 65504.0], F16, F16, 0x7BFF),
    ([65504.0, 65504.0, -65504.0], F16, F16, 0x7555),  # 65504 / 3 = 21834.67 -> 21840
    ([65504.0, 65504.0], F16, F32, 0x477FE000),
    ([65504.0, 65520.0], F32, F16, 0x7BFF),  # 65512 < 65520 -> max
    ([65520.0, 65520.0], F32, F16, 0x7C00),  # 65520: the tie with 2^16 -> inf
    ([3 * 65520.0, 0.0, 0.0], F32, F16, 0x7C00),
    ([3 * 65520.0, 2.0**-149, 0.0], F32, F16, 0x7C00),  # just above the overflow threshold
    ([3 * 65520.0, -(2.0**-149), 0.0], F32, F16, 0x7BFF),  # just below it: max (a double quotient says inf)
    ([-3 * 65520.0, 2.0**-149, 0.0], F32, F16, 0xFBFF),
    # subnormal means: one rounding of a quotient of quanta
    ([2.0**-149, 0.0], F32, F32, 0x00000000),  # half a quantum: tie -> even (+0)
    ([2.0**-149, 2.0**-149, 0.0], F32, F32, 0x00000001),  # 2/3 quanta
    ([-(2.0**-149), 0.0], F32, F32, 0x80000000),  # -half a quantum -> -0 (sign kept)
    ([3 * 2.0**-149, 0.0], F32, F32, 0x00000002),  # 1.5 quanta -> 2
    ([5 * 2.0**-149, 0.0, 0.0], F32, F32, 0x00000002),  # 5/3 quanta
    ([2.0**-149, 0.0, 0.0], F32, F32, 0x00000000),
    ([2.0**-24, 0.0], F16, F16, 0x0000),
    ([2.0**-24, 2.0**-24, 2.0**-24, 0.0], F16, F16, 0x0001),  # 0.75 quanta
    ([-(2.0**-24), 0.0, 0.0], F16, F16, 0x8000),
    ([2.0**-133, 2.0**-133, 0.0], BF16, BF16, 0x0001),
    ([2.0**-126, 0.0, 0.0], F32, F32, 0x002AAAAB),  # 2^-126 / 3: a subnormal quotient
]


@pytest.mark.parametrize("values,in_dtype,out_dtype,bits", HAND, ids=[f"{i}" for i in range(len(HAND))])
def test_hand_derived_means_in_every_order(values, in_dtype, out_dtype, bits):
    perms = list(itertools.permutations(values))
    x = exact_tensor([list(p) for p in perms], in_dtype)
    expected = bits_tensor([bits] * len(perms), out_dtype)
    assert_bits_equal(mean_bits(x, 1, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    assert_bits_equal(carbon.mean(x, 1, dtype=out_dtype), expected, f"{values} -> {out_dtype}")
    assert_bits_equal(carbon.mean(x.t(), 0, dtype=out_dtype), expected, "over dim 0 of the transpose")
    assert_bits_equal(carbon.mean(x[0], dtype=out_dtype), bits_tensor(bits, out_dtype), "full reduction")


def test_the_hand_quotient_traps_defeat_the_naive_methods():
    """The quotient traps above: a double quotient gives the wrong bits."""
    assert naive_double([2.0 + 2.0**-22, 1.0 - 2.0**-24, 2.0**-80], F32) == 0x3F800000
    assert naive_double([2.0 + 3 * 2.0**-22, 1.0 - 3 * 2.0**-24, -(2.0**-80)], F32) == 0x3F800002
    assert naive_double([3 * 65520.0, -(2.0**-149), 0.0], F16) == 0x7C00


@pytest.mark.parametrize("eps,bf16_bits,f32_bits", [(0.0, 0x7F80, 0x7F7F8000), (2.0**-149, 0x7F80, 0x7F7F8000),
                                                     (-(2.0**-149), 0x7F7F, 0x7F7F8000)])
def test_mean_at_the_bfloat16_overflow_threshold(eps, bf16_bits, f32_bits):
    """n = 1024 float32 values (1022 x float32 max, 1022 * 2^104, eps)
    whose exact mean is T + eps/1024, T = 2^128 - 2^119 the bfloat16
    overflow threshold (a tie between bfloat16 max and inf): eps decides."""
    T = 2.0**128 - 2.0**119
    big = (2 - 2.0**-23) * 2.0**127
    values = [big] * 1022 + [1022 * 2.0**104, eps]
    assert len(values) == 1024 and exact_value(values) == 1024 * Fraction(T) + Fraction(eps)
    rng = random.Random(5)
    rows = []
    for _ in range(3):
        rng.shuffle(values)
        rows.append(list(values))
    x = exact_tensor(rows, F32)
    assert_bits_equal(carbon.mean(x, 1, dtype=BF16), bits_tensor([bf16_bits] * 3, BF16), "bfloat16")
    assert_bits_equal(carbon.mean(x, 1, dtype=BF16), mean_bits(x, 1, dtype=BF16), "bfloat16, oracle")
    assert_bits_equal(carbon.mean(x, 1), bits_tensor([f32_bits] * 3, F32), "float32")
    assert_bits_equal(carbon.mean(x.t(), 0, dtype=F16), bits_tensor([0x7C00] * 3, F16), "float16")
    if eps < 0:
        assert naive_double(rows[0], BF16) == 0x7F80, "a double quotient would say inf"


SPECIAL = [
    ([INF, 1.0, 2.0], "+inf"),
    ([INF, -(2.0**100), 2.0**100], "+inf"),
    ([-INF, 0.0], "-inf"),
    ([-INF, 5.0, BIG, BIG], "-inf"),
    ([INF, -INF], "nan"),
    ([1.0, -INF, 2.0, INF], "nan"),
    ([NAN], "nan"),
    ([NAN, INF, 1.0], "nan"),
    ([Z], "-0"),
    ([Z, Z, Z], "-0"),
    ([Z, 0.0], "+0"),
    ([0.0, 0.0, 0.0], "+0"),
    ([1.0, -1.0], "+0"),
    ([-1.0, 1.0, Z], "+0"),
    ([-(2.0**-100), Z, 2.0**-100], "+0"),
    ([], "nan"),  # n = 0
]


def fit(v, dtype):
    if abs(v) == BIG and dtype != F32:
        return math.copysign(BF16_MAX if dtype == BF16 else 65504.0, v)
    if dtype == F16 and abs(v) in (2.0**100, 2.0**-100):
        return math.copysign(2.0**10 if abs(v) > 1 else 2.0**-20, v)
    return v


@pytest.mark.parametrize("values,kind", SPECIAL, ids=[f"{i}" for i in range(len(SPECIAL))])
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_special_values_signed_zeros_and_empty(values, kind, in_dtype, out_dtype):
    values = [fit(v, in_dtype) for v in values]
    x = exact_tensor([values], in_dtype).reshape(1, len(values))
    expected = bits_tensor([hand_bits(kind, out_dtype)], out_dtype)
    assert_bits_equal(mean_bits(x, 1, dtype=out_dtype).view(out_dtype), expected, "oracle vs hand")
    assert_bits_equal(carbon.mean(x, 1, dtype=out_dtype), expected, f"{values}")
    assert_bits_equal(carbon.mean(x.flip(1), -1, dtype=out_dtype), expected, f"{values} reversed")
    assert_bits_equal(carbon.mean(x[0], dtype=out_dtype), expected[0], f"{values} full reduction")


@pytest.mark.parametrize("dtype,nan_bits", [(F32, [0x7FC12345, 0xFFC00000, 0x7F800001]),
                                            (BF16, [0x7FC1, 0xFFC0, 0x7F81]), (F16, [0x7E01, 0xFE00, 0x7C01])])
def test_nan_payloads_become_the_canonical_nan(dtype, nan_bits):
    width = 32 if dtype == F32 else 16
    int_dtype = torch.int32 if dtype == F32 else torch.int16
    nans = torch.tensor([b - (1 << width) if b >> (width - 1) else b for b in nan_bits], dtype=int_dtype).view(dtype)
    x = torch.stack([nans, torch.ones(3, dtype=dtype), -nans], dim=1)
    for out_dtype in DTYPES:
        check("mean", x, 1, dtype=out_dtype)
        check("mean", x[:, :1], 1, dtype=out_dtype)
        check("mean", x, 0, dtype=out_dtype)


def test_empty_reductions_give_nan():
    for shape, dim, out_shape in [((0,), None, ()), ((0,), 0, ()), ((3, 0), 1, (3,)), ((0, 4), 0, (4,)),
                                  ((2, 0, 3), 1, (2, 3)), ((2, 0, 3), (0, 1), (3,)), ((2, 0, 3), None, ()),
                                  ((0, 0), [], ()), ((2, 0, 3), (0, 2), (0,))]:
        for in_dtype, out_dtype in DTYPE_PAIRS:
            x = torch.zeros(shape, dtype=in_dtype)
            for keepdim in (False, True):
                out = check("mean", x, dim, keepdim, out_dtype)
                if not keepdim:
                    assert tuple(out.shape) == out_shape
                f = out_dtype or in_dtype
                nan = hand_bits("nan", f)
                assert all((b & ((1 << (32 if f == F32 else 16)) - 1)) == nan for b in out.reshape(-1).view(
                    torch.int32 if f == F32 else torch.int16).tolist()), f"{shape} {dim}: {out}"


# ---------------------------------------------------------------- quotients near midpoints

# A midpoint M of the output format is planted as the exact mean: the row holds
# pieces (in the input format) summing to n*M, plus one tiny term eps, plus
# cancelling pairs, plus zeros up to n. The exact mean M + eps/n rounds the way
# eps points; a method that loses eps (a double sum / quotient, or a sum first
# rounded to float32) lands exactly on the tie and rounds to even instead.

def midpoint_rows(in_dtype, out_dtype, count, n, eps_rel_exp, rng, toward, pairs=1, max_tries=100_000):
    """data.midpoint_mean_rows, with the expected results as bits of out_dtype."""
    rows, values = midpoint_mean_rows(in_dtype, out_dtype, count, n, eps_rel_exp, rng, toward, pairs, max_tries)
    return rows, [round_bits(v, out_dtype) for v in values]


# (input, output, eps exponent relative to M, toward, naive methods that must fail on every row)
MIDPOINT_CASES = [
    (F32, F32, -80, "odd", ["double"]),
    (F32, BF16, -80, "odd", ["double", "float32 sum"]),
    (F32, F16, -60, "odd", ["double", "float32 sum"]),
    (BF16, BF16, -80, "odd", ["double", "float32 sum"]),
    (BF16, F32, -80, "odd", ["double"]),
    (BF16, F16, -60, "odd", ["double", "float32 sum"]),
    (F32, BF16, -30, "odd", ["float32 sum"]),
    (BF16, BF16, -30, "odd", ["float32 sum"]),
    (F16, F16, -25, "odd", ["float32 sum"]),
    (F32, F32, -80, "even", []),
    (BF16, BF16, -30, "even", []),
    (F16, F16, -25, "even", []),
    (F32, F32, 0, "tie", []),
    (BF16, BF16, 0, "tie", []),
    (F16, F16, 0, "tie", []),
    (F32, F16, 0, "tie", []),
]


@pytest.mark.parametrize("in_dtype,out_dtype,eps_rel_exp,toward,must_fail", MIDPOINT_CASES,
                         ids=[f"{a}-{b}-{e}-{t}".replace("torch.", "") for a, b, e, t, _ in MIDPOINT_CASES])
@pytest.mark.parametrize("n", [3, 7, 12, 100])
def test_quotients_near_midpoints(in_dtype, out_dtype, eps_rel_exp, toward, must_fail, n):
    rng = random.Random(f"mid{in_dtype}{out_dtype}{eps_rel_exp}{toward}{n}")
    # (a row fits when its pieces + eps (+ a cancelling pair) number at most n)
    rows, expected = midpoint_rows(in_dtype, out_dtype, 16, n, eps_rel_exp, rng, toward,
                                   pairs=1 if n >= 12 else 0, max_tries=3000)
    if len(rows) < 4:
        pytest.skip(f"n = {n} is too small for the pieces of this format pair")
    x = exact_tensor(rows, in_dtype)
    for row, bits in zip(x.double().tolist(), expected):
        exact = exact_value(row) / n
        assert is_midpoint(exact, out_dtype) == (toward == "tie")
        if "double" in must_fail:
            assert naive_double(row, out_dtype) != bits, f"{row}: a double quotient would be right"
        if "float32 sum" in must_fail:
            assert naive_rounded_sum(row, out_dtype) != bits, f"{row}: RN(RN32(sum)/n) would be right"
    want = bits_tensor(expected, out_dtype)
    assert_bits_equal(mean_bits(x, 1, dtype=out_dtype).view(out_dtype), want, "oracle vs construction")
    assert_bits_equal(carbon.mean(x, 1, dtype=out_dtype), want, f"n={n}")
    assert_bits_equal(carbon.mean(x.t(), 0, dtype=out_dtype), want, f"n={n}, transposed")


def test_rounded_sum_then_divided_is_wrong_for_float32_outputs():
    """Random float32 rows near 1 (n = 3, 5, 6, 7), kept only when
    RN32(RN32(sum) / n) differs from RN32(sum / n): the test finds 12 per n."""
    rng = random.Random(11)
    for n in (3, 5, 6, 7):
        rows = []
        for _ in range(5000):
            row = [(1.0 + rng.getrandbits(23) * 2.0**-23) * rng.choice([1.0, 2.0, 0.5]) for _ in range(n)]
            if naive_rounded_sum(row, F32) != round_bits(exact_value(row) / n, F32):
                rows.append(row)
                if len(rows) == 12:
                    break
        assert len(rows) == 12, f"n = {n}: only {len(rows)} rows where the rounded sum fails"
        x = exact_tensor(rows, F32)
        check("mean", x, 1)
        check("mean", x.t(), 0)


def test_near_midpoints_with_100k_elements():
    """n = 100003: a planted midpoint of the output format as the exact mean,
    eps = 2^-90 relative pointing to the odd neighbour, and 49990 cancelling
    pairs of random values in the row's zero slots."""
    for in_dtype, out_dtype in ((F32, F32), (BF16, BF16), (F32, BF16)):
        rng = random.Random(f"100k{in_dtype}{out_dtype}")
        n = 100_003
        rows, expected = midpoint_rows(in_dtype, out_dtype, 2, n, -90, rng, "odd", pairs=0)
        g = generator(17)
        x = exact_tensor(rows, in_dtype)
        for r in range(2):
            v = random_values((49_990,), in_dtype, g, spread=30)
            zeros = (x[r] == 0).nonzero().flatten()
            x[r, zeros[: 2 * 49_990]] = torch.cat([v, -v])
        want = bits_tensor(expected, out_dtype)
        assert_bits_equal(mean_bits(x, 1, dtype=out_dtype).view(out_dtype), want, "oracle vs construction")
        assert_bits_equal(carbon.mean(x, 1, dtype=out_dtype), want, f"{in_dtype} -> {out_dtype}")
        assert_bits_equal(carbon.mean(x[1], dtype=out_dtype), want[1], "1-D")
        assert_bits_equal(carbon.mean(x.t(), 0, dtype=out_dtype), want, "columns")
        assert all(naive_double(r, out_dtype) != b for r, b in zip(x.double().tolist(), expected))


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, F32), (BF16, BF16), (F16, F16), (F32, F16), (BF16, F32)])
def test_means_of_huge_values(in_dtype, out_dtype):
    """Rows whose sums overflow the input (and output) format but whose means do not."""
    g = generator(seed_of("huge", in_dtype, out_dtype))
    top = {F32: 127, BF16: 127, F16: 15}[in_dtype]
    x = random_values((24, 9), in_dtype, g, spread=0, scale_exp=top - 1).abs()
    x[x.isinf()] = torch.finfo(in_dtype).max
    x[::3, :2] = -x[::3, :2]
    out = check("mean", x, 1, dtype=out_dtype)
    if in_dtype == out_dtype:
        assert bool(out.isfinite().all()), "every mean is finite"


@pytest.mark.parametrize("in_dtype,out_dtype,scale", [(F32, F32, -140), (F32, BF16, -128), (BF16, BF16, -128),
                                                     (F16, F16, -20), (F32, F16, -20), (BF16, F32, -131)])
def test_subnormal_means(in_dtype, out_dtype, scale):
    g = generator(seed_of("subn", in_dtype, out_dtype))
    x = random_values((30, 7), in_dtype, g, spread=3, scale_exp=scale)
    out = check("mean", x, 1, dtype=out_dtype)
    check("mean", x, 0, dtype=out_dtype)
    assert bool(((out != 0) & (out.abs() < torch.finfo(out_dtype).tiny)).any()), "should produce subnormal means"


@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_values_spanning_the_whole_exponent_range(in_dtype, out_dtype):
    rng = random.Random(f"mspan{in_dtype}{out_dtype}")
    rows = []
    for r in range(9):
        if in_dtype == F16:
            vals = [math.ldexp(rng.uniform(-2, 2), rng.randint(-24, 14)) for _ in range(40)]
        else:
            vals = finite_bit_patterns(40, rng, 0, 253)
        vals = exact_tensor(vals, torch.float64).to(in_dtype).double().tolist()
        if r % 3 == 1:
            keep = sorted(vals, key=abs)[:5]
            big = [v for v in vals if v not in keep]
            vals = keep + big + [-v for v in big]
        rng.shuffle(vals)
        rows.append((vals + [0.0] * 81)[: 75 + r])  # n = 75..83, never a power of two
    for r, row in enumerate(rows):
        x = exact_tensor(row, torch.float64).to(in_dtype)
        check("mean", x, dtype=out_dtype, context=f"row {r}")


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (F32, BF16)])
def test_permutation_invariance(in_dtype, out_dtype):
    g = generator(seed_of("mperm", in_dtype))
    rng = random.Random(8)
    x = reduction_values((6, 12, 5), in_dtype, g, dim=(1,), spread=spread_for(in_dtype, out_dtype or in_dtype))
    rows, _ = midpoint_rows(in_dtype, out_dtype or in_dtype, 5, 12, -60 if in_dtype != F16 else -25, rng, "odd")
    x[:5, :, 0] = exact_tensor(rows, in_dtype)
    for dim in [1, (0, 2), None, 2, (0, 1), [-1, -2]]:
        reference = carbon.mean(x, dim, dtype=out_dtype)
        assert_bits_equal(reference, mean_bits(x, dim, dtype=out_dtype), f"oracle, dim {dim}")
        for trial in range(3):
            same_bits(carbon.mean(shuffle_reduced(x, dim, g), dim, dtype=out_dtype), reference, f"shuffled {trial}, dim {dim}")


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None)])
def test_batch_invariance(in_dtype, out_dtype):
    g = generator(seed_of("mbatch", in_dtype))
    x = reduction_values((48, 777), in_dtype, g, dim=1, spread=spread_for(in_dtype, out_dtype or in_dtype))
    full = carbon.mean(x, 1, dtype=out_dtype)
    for rows in (1, 5, 16):
        for start in range(0, 48, rows):
            same_bits(carbon.mean(x[start : start + rows], 1, dtype=out_dtype), full[start : start + rows],
                      f"rows {start}:{start + rows}")
    for i in (0, 4, 17):
        same_bits(carbon.mean(x[i], dtype=out_dtype), full[i], f"row {i} alone")
    assert_bits_equal(full[::7], mean_bits(x[::7], 1, dtype=out_dtype), "oracle subset")
    xt = x.t().contiguous()
    same_bits(carbon.mean(xt, 0, dtype=out_dtype), full, "columns == rows")
    for j in (0, 5, 47):
        same_bits(carbon.mean(xt[:, j : j + 1], 0, dtype=out_dtype), full[j : j + 1], f"column {j} alone")


@pytest.mark.parametrize("out_dtype", [None, BF16])
def test_thread_count_does_not_matter(restore_num_threads, out_dtype):
    g = generator(32)
    x = reduction_values((256, 4096), F32, g, dim=1, spread=30)
    flat = reduction_values((3 * 333_333,), F32, g, dim=0, spread=30)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append([carbon.mean(x, 1, dtype=out_dtype), carbon.mean(x, 0, dtype=out_dtype),
                        carbon.mean(x, dtype=out_dtype), carbon.mean(flat, dtype=out_dtype)])
    for name, one, two in zip(["rows", "columns", "all of x", "~1M elements"], *results):
        same_bits(one, two, f"{name}: 1 vs 2 threads")
    rows, cols, _, whole = results[0]
    assert_bits_equal(rows[::61], mean_bits(x[::61], 1, dtype=out_dtype), "rows vs oracle")
    assert_bits_equal(cols[::997], mean_bits(x[:, ::997], 0, dtype=out_dtype), "columns vs oracle")
    if out_dtype is None:
        assert_bits_equal(whole, mean_bits(flat, dtype=out_dtype), "~1M elements vs oracle")


@pytest.mark.parametrize("in_dtype", DTYPES)
def test_memory_layout_does_not_matter(in_dtype):
    g = generator(seed_of("mlayout", in_dtype))
    base = reduction_values((12, 10, 9), in_dtype, g, dim=(0, 2), spread=spread_for(in_dtype, in_dtype))
    x4 = reduction_values((2, 3, 5, 6), in_dtype, g, dim=1).contiguous(memory_format=torch.channels_last)
    check_memory_layouts("mean", base, x4)


# ---------------------------------------------------------------- property test

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NICE = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 2.0**-24, 2.0**-14, 2.0**-126, 2.0**-149, 65504.0, 2.0**100, -(2.0**-60),
        2.0**127, -(2.0**127), 1.0 + 2.0**-23, 1.0 - 2.0**-24]


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
    shape = tuple(draw(st.integers(0, 7)) for _ in range(ndim))
    n = math.prod(shape)
    values = draw(st.lists(_element(in_dtype), min_size=n, max_size=n))
    if values and draw(st.integers(0, 3)) == 0:
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
    check("mean", x, dim, keepdim, out_dtype, context=f"x={x.tolist()}")


# ---------------------------------------------------------------- every layout of the work, at 1 and 2 threads

def path_cases(in_dtype, out_dtype):
    """Shapes that send the work down different kernel paths: many short rows,
    a few long rows (split into chunks), leading-dim (column) reductions with
    more rows than one chunk, a middle dim, everything; near-midpoint means planted."""
    g = generator(seed_of("mpaths", in_dtype, out_dtype))
    rng = random.Random(f"mpaths{in_dtype}{out_dtype}")
    spread = spread_for(in_dtype, out_dtype or in_dtype)
    eps = -25 if F16 in (in_dtype, out_dtype or in_dtype) else -60
    cases = []
    x = reduction_values((100_000, 3), in_dtype, g, dim=1, spread=spread)
    cases.append(("100k rows of 3", x, 1))
    x = reduction_values((1, 150_001), in_dtype, g, dim=1, spread=spread)
    cases.append(("one row of 150001", x, 1))
    x = reduction_values((3000, 600), in_dtype, g, dim=0, spread=spread)
    rows, _ = midpoint_rows(in_dtype, out_dtype or in_dtype, 300, 3000, eps, rng, "odd", pairs=3)
    x[:, :300] = exact_tensor(rows, in_dtype).t()
    cases.append(("columns: 3000 x 600, dim 0", x, 0))
    x = reduction_values((4, 3000, 70), in_dtype, g, dim=1, spread=spread)
    cases.append(("middle dim of (4, 3000, 70)", x, 1))
    cases.append(("(4, 3000, 70) dims (0, 2)", x, (0, 2)))
    cases.append(("all of (4, 3000, 70)", x, None))
    return cases


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (F32, BF16)])
def test_every_kernel_path_at_1_and_2_threads(restore_num_threads, in_dtype, out_dtype):
    for name, x, dim in path_cases(in_dtype, out_dtype):
        torch.set_num_threads(1)
        one = carbon.mean(x, dim, dtype=out_dtype)
        torch.set_num_threads(2)
        two = carbon.mean(x, dim, dtype=out_dtype)
        same_bits(one, two, f"{name}: 1 vs 2 threads")
        flat = one.reshape(-1)
        picks = list(range(0, flat.numel(), max(1, flat.numel() // 7)))[:8]
        assert_bits_equal(flat[picks], mean_bits(to_rows(x, dim)[picks], 1, dtype=out_dtype), f"{name}: oracle subset")
