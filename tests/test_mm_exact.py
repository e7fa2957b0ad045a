"""carbon.mm / addmm / bmm / baddbmm return RN(bias + sum_k a_ik b_kj), the
exact sum rounded once (to nearest, ties to even) into the output dtype.
Every result is compared bit for bit with the exact oracle (tests/oracle.py)."""

import math
import random
import struct
import zlib
from fractions import Fraction

import pytest
import torch

import carbon
from data import BF16, DTYPE_COMBOS, DTYPES, F16, F32, exact_tensor, generator, random_values, tie_rows
from oracle import assert_bits_equal, bits_tensor, bmm_bits, is_midpoint, mm_bits

SHAPES = [(1, 1, 1), (3, 5, 7), (17, 33, 9), (4, 0, 5), (6, 1, 3), (2, 3000, 3), (8, 64, 8)]


@pytest.fixture(autouse=True, params=["direct", "general"])
def matmul_path(request, monkeypatch):
    """Every case runs twice on the CPU: products with K <= 16 and at most 8
    rows per batch take the direct small-K path (csrc/matmul/matmul_small_k_cpu.cpp)
    unless CARBON_MATMUL_GENERAL is set, which sends them through the general
    path (fp64 copies, row statistics, GEMM) as every larger product."""
    if request.param == "general":
        monkeypatch.setenv("CARBON_MATMUL_GENERAL", "1")
    return request.param


def expected_dtype(a, b, out_dtype):
    return out_dtype if out_dtype is not None else torch.promote_types(a.dtype, b.dtype)


def check_mm(a, b, out_dtype=None, bias=None, context=""):
    """carbon.mm / addmm against the oracle."""
    if bias is None:
        out = carbon.mm(a, b, out_dtype=out_dtype)
    else:
        out = carbon.addmm(bias, a, b, out_dtype=out_dtype)
    assert_bits_equal(out, mm_bits(a, b, bias, out_dtype), context, dtype=expected_dtype(a, b, out_dtype))
    return out


# ---------------------------------------------------------------- random data


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", DTYPE_COMBOS)
def test_mm_random(shape, a_dtype, b_dtype, out_dtype):
    M, K, N = shape
    g = generator(zlib.crc32(f"{shape}{a_dtype}{b_dtype}".encode()))  # a fixed seed per case
    a, b = random_values((M, K), a_dtype, g), random_values((K, N), b_dtype, g)
    check_mm(a, b, out_dtype, context=f"mm {shape} {a_dtype} x {b_dtype} -> {out_dtype}")


@pytest.mark.parametrize("bias_shape", [(7,), (5, 7), (5, 1), (1, 7), (1, 1), ()], ids=str)
@pytest.mark.parametrize("bias_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", (None,) + DTYPES)
def test_addmm_bias_broadcast(bias_shape, bias_dtype, out_dtype):
    g = generator(7)
    a, b = random_values((5, 9), F32, g, spread=4), random_values((9, 7), BF16, g, spread=4)
    bias = random_values(bias_shape, bias_dtype, g, spread=4)
    check_mm(a, b, out_dtype, bias, context=f"addmm bias {bias_shape} {bias_dtype}")


def test_addmm_bias_is_inside_the_single_rounding():
    # 1 + 2^-24 alone is a tie (-> 1); the bias 2^-60 breaks it upwards.
    a = torch.tensor([[1.0, 2.0**-24]])
    b = torch.tensor([[1.0], [1.0]])
    out = carbon.addmm(torch.tensor([2.0**-60]), a, b)
    assert_bits_equal(out, bits_tensor([[0x3F800001]], F32))
    # a bias that cancels a huge product exactly
    out = carbon.addmm(torch.tensor([-(2.0**100)]), torch.tensor([[2.0**50, 2.0**-100]]), torch.tensor([[2.0**50], [1.0]]))
    assert_bits_equal(out, bits_tensor([[0x0D800000]], F32))  # 2^-100 = 0x0D800000


@pytest.mark.parametrize("bias_shape", [None, (3, 4, 6), (6,), (4, 6), (3, 1, 6), (1, 4, 1), ()], ids=str)
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [(F32, F32, None), (BF16, BF16, F32), (F16, F32, F16),
                                                       (BF16, F16, None), (F32, F32, BF16)])
def test_bmm_and_baddbmm_random(bias_shape, a_dtype, b_dtype, out_dtype):
    g = generator(11)
    a, b = random_values((3, 4, 10), a_dtype, g), random_values((3, 10, 6), b_dtype, g)
    if bias_shape is None:
        out = carbon.bmm(a, b, out_dtype=out_dtype)
        expected = bmm_bits(a, b, None, out_dtype)
    else:
        bias = random_values(bias_shape, a_dtype, g)
        out = carbon.baddbmm(bias, a, b, out_dtype=out_dtype)
        expected = bmm_bits(a, b, bias, out_dtype)
    assert_bits_equal(out, expected, f"bmm bias {bias_shape}", dtype=expected_dtype(a, b, out_dtype))


@pytest.mark.parametrize("shape", [(200, 64, 5), (140, 300, 40), (70, 520, 3)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype,out_dtype,spread", [(F32, None, 0), (BF16, F32, 40), (F16, F16, 4)])
def test_tall_narrow_products(shape, dtype, out_dtype, spread):
    """Products with many more rows than columns and K >= 64, whose fp64 GEMM
    runs as its transpose (faster in the BLAS; csrc/matmul/matmul_cpu.cpp
    transposed_gemm_is_faster), with and without a bias: the exact results."""
    M, K, N = shape
    g = generator(zlib.crc32(f"tall{shape}{dtype}".encode()))
    a, b = random_values((M, K), dtype, g, spread=spread), random_values((K, N), dtype, g, spread=spread)
    check_mm(a, b, out_dtype, context=f"mm {shape}")
    check_mm(a, b, out_dtype, bias=random_values((N,), dtype, g), context=f"addmm {shape}")


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype,bias_shape", [(F32, F32, None, None), (BF16, BF16, F32, (4100,)),
                                                                   (F16, F32, F16, (1100, 4100))])
def test_large_outputs_in_row_chunks(a_dtype, b_dtype, out_dtype, bias_shape, restore_num_threads):
    """Products whose fp64 GEMM result would exceed 32 MiB run in chunks of
    rows on the CPU (1100 x 4100 outputs: chunks of 256 rows and a last one of
    76; csrc/matmul/matmul.cpp rows_per_chunk). Rows at and around the chunk
    edges against the exact oracle, and against the same rows multiplied
    alone (a small product, not chunked)."""
    M, K, N = 1100, 7, 4100
    g = generator(zlib.crc32(f"row chunks{a_dtype}{b_dtype}".encode()))
    a, b = random_values((M, K), a_dtype, g, spread=3), random_values((K, N), b_dtype, g, spread=3)
    bias = None if bias_shape is None else random_values(bias_shape, a_dtype, g)

    def rows_of(index):
        return bias if bias is None or bias.dim() == 1 else bias[index]

    out = carbon.mm(a, b, out_dtype=out_dtype) if bias is None else carbon.addmm(bias, a, b, out_dtype=out_dtype)
    rows = [0, 1, 255, 256, 257, 511, 512, 767, 1023, 1024, 1099]
    expected = mm_bits(a[rows], b, rows_of(rows), out_dtype)
    assert_bits_equal(out[rows], expected, "chunked rows", dtype=expected_dtype(a, b, out_dtype))
    alone = [carbon.mm(a[i:i + 1], b, out_dtype=out_dtype) if bias is None else
             carbon.addmm(rows_of(slice(i, i + 1)), a[i:i + 1], b, out_dtype=out_dtype) for i in (3, 300, 700, 1050)]
    bits = torch.int16 if out.element_size() == 2 else torch.int32
    assert torch.equal(out[[3, 300, 700, 1050]].view(bits), torch.cat(alone).view(bits))
    for threads in (1, 2):  # the chunks are tasks of a parallel loop
        torch.set_num_threads(threads)
        again = carbon.mm(a, b, out_dtype=out_dtype) if bias is None else carbon.addmm(bias, a, b, out_dtype=out_dtype)
        assert torch.equal(again.view(bits), out.view(bits)), f"{threads} threads"


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_dynamic_range_in_one_row(dtype):
    """Terms of wildly different magnitudes (2^+-60 for the wide formats) in the same dot product."""
    g = generator(3)
    spread = 8 if dtype == F16 else 60
    a, b = random_values((8, 64), dtype, g, spread=spread), random_values((64, 8), dtype, g, spread=spread)
    check_mm(a, b, F32)
    check_mm(a, b, dtype)


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_integer_matrices_have_many_ties(out_dtype):
    """Integer-valued inputs whose sums need more bits than the output has:
    many outputs are exact ties, all must round to even."""
    g = generator(5)
    bits_needed = {F32: 12, BF16: 4, F16: 6}[out_dtype]
    a = torch.randint(-(2**bits_needed), 2**bits_needed, (12, 6), generator=g).float()
    b = torch.randint(-(2**bits_needed), 2**bits_needed, (6, 12), generator=g).float()
    exact = (a.long() @ b.long()).flatten().tolist()
    ties = sum(is_midpoint(v, out_dtype) for v in exact)
    assert ties >= 10, f"only {ties} ties: the data no longer tests tie breaking"
    check_mm(a, b, out_dtype)


# ---------------------------------------------------------------- exact ties


# 0: exact ties; +-2^-60 half-ulps: off the tie by far less than double
# precision (only an exact method sees it); +-2^-30: by little more than the
# error bound of a double-precision sum (the fast path must decide correctly).
NUDGES = {"tie": 0.0, "just-above": 2.0**-60, "just-below": -(2.0**-60), "near-above": 2.0**-30, "near-below": -(2.0**-30)}


@pytest.mark.parametrize("nudge", NUDGES.values(), ids=NUDGES.keys())
@pytest.mark.parametrize("a_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_exact_ties_in_every_output_format(out_dtype, a_dtype, nudge):
    rng = random.Random(f"{out_dtype}{a_dtype}{nudge}")
    K = 8
    a = exact_tensor(tie_rows(a_dtype, out_dtype, 16, K, nudge, rng), a_dtype)
    scales = [2.0**s for s in (-2, -1, 0, 1, 2)]  # exact scalings keep ties ties
    b = exact_tensor([scales] * K, rng.choice(DTYPES))
    exact = [[sum(Fraction(x) for x in row) * Fraction(s) for s in scales] for row in a.double().tolist()]
    ties = sum(is_midpoint(v, out_dtype) for r in exact for v in r)
    assert ties == (16 * 5 if nudge == 0 else 0)
    check_mm(a, b, out_dtype, context=f"ties {a_dtype} -> {out_dtype} nudge {nudge}")


# ---------------------------------------------------------------- long dot products near ties

# Nudges off a float32 tie, in half-ulps: 2^-20 lies far inside tier 1's bound gamma_K |a| |b| (the large
# cancelling pairs below make |a| large) but far outside the compensated tier's; 2^-60 and 0 only the exact
# accumulator decides.
LONG_NUDGES = {"tie": 0.0, "off-by-2^-20": 2.0**-20, "below-by-2^-20": -(2.0**-20), "off-by-2^-60": 2.0**-60}


def long_tie_rows(K: int, rows: int, nudge: float, rng: random.Random):
    """float32 rows of length K whose exact sum is v + ulp(v)/2 (a float32 tie) plus nudge half-ulps: v, its
    half-ulp, the nudge, and up to 40 pairs +-y with |y| up to 2^20 |v| that cancel exactly, at random places
    among zeros. Every term is a float32 value."""
    out = []
    for _ in range(rows):
        E = rng.randint(-20, 20)
        sign = rng.choice([1.0, -1.0])
        v = sign * math.ldexp(rng.randrange(2**23, 2**24), E - 23)
        half = sign * math.ldexp(1.0, E - 24)
        terms = [v, half] + ([half * nudge] if nudge else [])
        for _ in range(max(0, min(40, (K - len(terms)) // 2))):
            y = rng.choice([1.0, -1.0]) * math.ldexp(rng.randrange(1, 2**24), E + rng.randint(-23, -3))
            terms += [y, -y]
        terms = (terms + [0.0] * K)[:K] if len(terms) > K else terms + [0.0] * (K - len(terms))
        rng.shuffle(terms)
        out.append(terms)
    return out


@pytest.mark.parametrize("K", [5, 15, 16, 17, 31, 33, 100, 1023, 3000])
@pytest.mark.parametrize("nudge", LONG_NUDGES.values(), ids=LONG_NUDGES.keys())
def test_long_dot_products_near_ties(K, nudge):
    """Outputs tier 1 cannot decide, at inner dimensions around the compensated tier's 16 lanes
    (csrc/exact/compensated_dot_avx512.h: chunks of 16, a masked tail, lanes merged in a tree) and beyond;
    with and without a bias (one more term), and the transposed operand layout."""
    rng = random.Random(f"long{K}{nudge}")
    a = exact_tensor(long_tie_rows(K, 6, nudge, rng), F32)
    scales = [1.0, 2.0**-3, 2.0**5]  # powers of two keep ties ties
    b = exact_tensor([scales] * K, F32)
    for out_dtype in (F32, BF16):
        check_mm(a, b, out_dtype, context=f"K={K} nudge={nudge}")
    check_mm(a, b.t().contiguous().t(), F32, context=f"K={K} nudge={nudge}, b transposed")
    check_mm(a, b, F32, bias=exact_tensor([[0.0], [-0.0], [2.0**-30], [0.0], [1.0], [0.0]], F32),
             context=f"K={K} nudge={nudge}, bias")


TRAPS = [
    # terms a_k, b_k, out dtype, expected bits (by hand)
    # 1 + 2^-24 + 2^-80: just above a tie; rounding to double first lands on the tie and then on 1.
    ([1.0, 2.0**-24, 2.0**-40], [1.0, 1.0, 2.0**-40], F32, 0x3F800001),
    # (1 + 2^-23) + 2^-24 - 2^-80: just below a tie that would round up to even.
    ([1.0 + 2.0**-23, 2.0**-24, -(2.0**-40)], [1.0, 1.0, 2.0**-40], F32, 0x3F800001),
    ([1.0, 2.0**-8, 2.0**-40], [1.0, 1.0, 2.0**-40], BF16, 0x3F81),
    ([1.0 + 2.0**-7, 2.0**-8, -(2.0**-40)], [1.0, 1.0, 2.0**-40], BF16, 0x3F81),
    ([1.0, 2.0**-11, 2.0**-20], [1.0, 1.0, 2.0**-20], F16, 0x3C01),
    ([1.0 + 2.0**-10, 2.0**-11, -(2.0**-20)], [1.0, 1.0, 2.0**-20], F16, 0x3C01),
]


@pytest.mark.parametrize("a_terms,b_terms,out_dtype,bits", TRAPS)
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
def test_double_rounding_traps(a_terms, b_terms, out_dtype, bits, order):
    in_dtype = F16 if out_dtype == F16 else F32
    a = exact_tensor([[a_terms[k] for k in order]], in_dtype)
    b = exact_tensor([[b_terms[k]] for k in order], in_dtype)
    out = carbon.mm(a, b, out_dtype=out_dtype)
    assert_bits_equal(out, bits_tensor([[bits]], out_dtype), f"order {order}")
    assert_bits_equal(out, mm_bits(a, b, out_dtype=out_dtype))


# ---------------------------------------------------------------- cancellation, overflow, underflow

F32_MAX = (2 - 2.0**-23) * 2.0**127
BIG = torch.tensor(3e38, dtype=F32).item()  # a float32 near its maximum
BIG_BITS = struct.unpack("<I", struct.pack("<f", BIG))[0]


@pytest.mark.parametrize("a_terms,b_terms,bits", [
    ([2.0**100, 1.5, -(2.0**100)], [1.0, 1.0, 1.0], 0x3FC00000),  # [x, y, -x] -> y
    ([-(2.0**100), 2.0**100, 2.0**-100], [1.0, 1.0, 1.0], 0x0D800000),  # -> 2^-100
    ([BIG, BIG, 1.0], [3.0, -3.0, 1.0], 0x3F800000),  # products overflow float32 but cancel -> 1
    ([BIG, 1.0, BIG], [-3.0, -(2.0**-149), 3.0], 0x80000001),  # -> -2^-149 (subnormal)
    ([2.0**127, 2.0**127], [1.0, 1.0], 0x7F800000),  # 2^128 -> inf
    ([F32_MAX, 2.0**103], [1.0, 1.0], 0x7F800000),  # the overflow threshold is a tie -> inf
    ([F32_MAX, 2.0**102], [1.0, 1.0], 0x7F7FFFFF),  # below it -> max
    ([F32_MAX, 2.0**103], [-1.0, -1.0], 0xFF800000),  # -> -inf
    ([BIG, BIG], [4.0, -3.0], BIG_BITS),  # 4x - 3x = x, though 4x overflows float32
    ([2.0**-100, 2.0**-100], [2.0**-49, 2.0**-50], 0x00000002),  # 1.5 * 2^-149 -> 2^-148 (tie to even)
    ([2.0**-100], [-(2.0**-51)], 0x80000000),  # -2^-151 underflows to -0
])
def test_float32_cancellation_overflow_underflow(a_terms, b_terms, bits):
    a, b = exact_tensor([a_terms], F32), exact_tensor([[x] for x in b_terms], F32)
    assert_bits_equal(carbon.mm(a, b), bits_tensor([[bits]], F32))
    assert_bits_equal(carbon.mm(a, b), mm_bits(a, b))


@pytest.mark.parametrize("a_terms,out_dtype,bits", [
    ([60000.0, 5504.0], F16, 0x7BFF),  # 65504 = max
    ([60000.0, 5519.0], F16, 0x7BFF),  # 65519 -> 65504
    ([60000.0, 5520.0], F16, 0x7C00),  # 65520: tie with 65536 -> inf
    ([-60000.0, -5520.0], F16, 0xFC00),
    ([2.0**-25, 2.0**-26], F16, 0x0001),  # 0.75 quanta -> 2^-24
    ([2.0**-25, -(2.0**-40)], F16, 0x0000),  # just below half a quantum -> +0
    ([-(2.0**-25), -(2.0**-40)], F16, 0x8001),  # just above half a quantum, negative
    ([2.0**-134, 2.0**-135], BF16, 0x0001),  # 0.75 bfloat16 quanta (2^-133)
    ([3.0 * 2.0**-134], BF16, 0x0002),  # 1.5 quanta -> 2 (even)
    ([2.0**127, 2.0**127], BF16, 0x7F80),
    ([2.0**128 - 2.0**120, 2.0**119], BF16, 0x7F80),  # bf16 max + half an ulp: tie -> inf
])
def test_16_bit_outputs_near_overflow_and_underflow(a_terms, out_dtype, bits):
    a = exact_tensor([a_terms], F32)
    b = torch.ones(len(a_terms), 1)
    out = carbon.mm(a, b, out_dtype=out_dtype)
    assert_bits_equal(out, bits_tensor([[bits]], out_dtype))
    assert_bits_equal(out, mm_bits(a, b, out_dtype=out_dtype))


@pytest.mark.parametrize("in_dtype,out_dtype,scale_exp", [
    (F32, F32, -70), (F32, BF16, -64), (BF16, BF16, -64), (F16, F16, -10), (F32, F16, -10), (BF16, F16, -12),
])
def test_subnormal_results(in_dtype, out_dtype, scale_exp):
    g = generator(13)
    a = random_values((6, 12), in_dtype, g, spread=3, scale_exp=scale_exp)
    b = random_values((12, 6), in_dtype, g, spread=3, scale_exp=scale_exp)
    out = check_mm(a, b, out_dtype)
    tiny = torch.finfo(out_dtype).tiny
    finite = out[out != 0]
    assert bool((finite.abs() < tiny).any()), "the data should produce subnormal results"


def test_near_float16_max():
    g = generator(17)
    a = random_values((6, 16), F16, g, spread=1, scale_exp=6)  # products near 2^12, sums near 2^15-2^16
    b = random_values((16, 6), F16, g, spread=1, scale_exp=6).abs()
    check_mm(a.abs(), b, F16)
    check_mm(a.abs(), b, F32)


# ---------------------------------------------------------------- signed zeros and special values

Z = -0.0


@pytest.mark.parametrize("a_terms,b_terms,bias,value", [
    ([Z, 0.0], [1.0, -1.0], None, Z),  # -0 and -0 -> -0
    ([Z, 0.0], [1.0, 1.0], None, 0.0),  # -0 and +0 -> +0
    ([Z, Z], [Z, Z], None, 0.0),  # (-0)(-0) = +0
    ([Z], [5.0], None, Z),
    ([1.0, -1.0], [1.0, 1.0], None, 0.0),  # cancellation -> +0
    ([-1.0, 1.0], [1.0, 1.0], None, 0.0),
    ([-3.0, 3.0], [1.0, 1.0], Z, 0.0),  # cancellation with a -0 bias -> +0
    ([Z, 0.0], [1.0, -1.0], Z, Z),  # all terms -0, bias included
    ([Z, 0.0], [1.0, -1.0], 0.0, 0.0),  # a +0 bias
    ([0.0], [1.0], Z, 0.0),  # a +0 product
    ([], [], Z, Z),  # K = 0: RN(bias)
    ([], [], 0.0, 0.0),
    ([], [], None, 0.0),  # K = 0, no bias: +0
    ([Z], [5.0], 2.5, 2.5),  # a zero product and a bias: the bias
])
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_signed_zero_rules(a_terms, b_terms, bias, value, out_dtype):
    a = exact_tensor([a_terms], F32).reshape(1, len(a_terms))
    b = exact_tensor([[x] for x in b_terms], F32).reshape(len(b_terms), 1)
    bias_t = None if bias is None else exact_tensor([bias], F32)
    out = check_mm(a, b, out_dtype, bias_t)
    got = out.item()
    assert got == value and math.copysign(1.0, got) == math.copysign(1.0, value), f"got {got!r}, expected {value!r}"


def test_all_signed_zero_combinations_of_a_matrix():
    """Every row of signed zeros against every column of signed zeros / ones."""
    patterns = [[0.0, 0.0], [0.0, Z], [Z, 0.0], [Z, Z]]
    a = exact_tensor(patterns, F32)
    b = exact_tensor([[0.0, 0.0, Z, Z, 1.0, -1.0, 1.0], [0.0, Z, 0.0, Z, -1.0, -1.0, 1.0]], F32)
    for bias in (None, torch.tensor(Z), torch.tensor(0.0)):
        for out_dtype in DTYPES:
            check_mm(a, b, out_dtype, bias, context=f"bias {bias}")


INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("a_terms,b_terms,bias,expected", [
    ([INF, 1.0], [1.0, 1.0], None, "+inf"),
    ([INF, 2.0**90], [-2.0, 2.0**90], None, "-inf"),
    ([INF, -INF], [1.0, 1.0], None, "nan"),  # inf - inf
    ([INF, 1.0], [0.0, 1.0], None, "nan"),  # inf * 0
    ([Z, 1.0], [-INF, 1.0], None, "nan"),
    ([NAN, 1.0], [1.0, 1.0], None, "nan"),
    ([NAN], [0.0], None, "nan"),
    ([1.0, 2.0], [1.0, 1.0], INF, "+inf"),  # an infinite bias
    ([INF, 2.0], [1.0, 1.0], -INF, "nan"),
    ([1.0], [1.0], NAN, "nan"),
    ([0.0, 0.0], [0.0, 0.0], NAN, "nan"),  # a zero row with a NaN bias
    ([0.0, 0.0], [1.0, 2.0], -INF, "-inf"),
    ([BIG, BIG], [BIG, BIG], None, "+inf"),  # finite, but the sum overflows
])
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_infinities_and_nans(a_terms, b_terms, bias, expected, out_dtype):
    a = exact_tensor([a_terms], F32)
    b = exact_tensor([[x] for x in b_terms], F32)
    bias_t = None if bias is None else exact_tensor([bias], F32)
    out = check_mm(a, b, out_dtype, bias_t)
    hand = {F32: {"+inf": 0x7F800000, "-inf": 0xFF800000, "nan": 0x7FC00000},
            BF16: {"+inf": 0x7F80, "-inf": 0xFF80, "nan": 0x7FC0},
            F16: {"+inf": 0x7C00, "-inf": 0xFC00, "nan": 0x7E00}}[out_dtype][expected]
    assert_bits_equal(out, bits_tensor([[hand]], out_dtype))


@pytest.mark.parametrize("dtype,nan_bits", [(F32, [0x7FC12345, 0xFFC00000, 0x7F800001]),
                                            (BF16, [0x7FC1, 0xFFC0, 0x7F81]), (F16, [0x7E01, 0xFE00, 0x7C01])])
def test_nan_payloads_become_the_canonical_nan(dtype, nan_bits):
    int_dtype = torch.int32 if dtype == F32 else torch.int16
    nans = torch.tensor([b - (1 << (32 if dtype == F32 else 16)) if b >= (1 << (31 if dtype == F32 else 15)) else b
                         for b in nan_bits], dtype=int_dtype).view(dtype)
    a = torch.stack([nans, torch.ones(3, dtype=dtype)], dim=1)  # rows [nan_i, 1]
    b = torch.ones(2, 2, dtype=dtype)
    for out_dtype in DTYPES:
        check_mm(a, b, out_dtype)
        check_mm(a.t().contiguous().t(), b, out_dtype, bias=torch.tensor(1.0, dtype=dtype))
    check_mm(torch.ones(3, 2, dtype=dtype), b, None, bias=nans.reshape(3, 1))


def test_a_mixture_of_special_values_in_a_matrix():
    vals = [0.0, Z, 1.0, -1.0, INF, -INF, NAN, 2.0**-149, -(2.0**100)]
    rng = random.Random(0)
    a = exact_tensor([[rng.choice(vals) for _ in range(3)] for _ in range(12)], F32)
    b = exact_tensor([[rng.choice(vals) for _ in range(12)] for _ in range(3)], F32)
    bias = exact_tensor([rng.choice(vals) for _ in range(12)], F32)
    for out_dtype in DTYPES:
        check_mm(a, b, out_dtype)
        check_mm(a, b, out_dtype, bias)


# ---------------------------------------------------------------- property test

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NICE = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 2.0**-24, 2.0**-14, 2.0**-126, 2.0**-149, 65504.0, 2.0**100, -(2.0**-60)]


def _element(dtype):
    width = 16 if dtype == F16 else 32  # bfloat16: a float32, rounded when the tensor is made
    return st.one_of(
        st.floats(width=width, allow_nan=False, allow_infinity=False, allow_subnormal=True),
        st.floats(min_value=-8.0, max_value=8.0, width=width),
        st.sampled_from(NICE),
    )


@st.composite
def problems(draw):
    a_dtype, b_dtype, bias_dtype = (draw(st.sampled_from(DTYPES)) for _ in range(3))
    out_dtype = draw(st.sampled_from((None,) + DTYPES))
    M, K, N = draw(st.integers(0, 4)), draw(st.integers(0, 6)), draw(st.integers(0, 4))
    with_specials = draw(st.integers(0, 3)) == 0  # a quarter of the examples

    def matrix(rows, cols, dtype):
        values = draw(st.lists(_element(dtype), min_size=rows * cols, max_size=rows * cols))
        if with_specials and values:
            for _ in range(draw(st.integers(1, 2))):
                values[draw(st.integers(0, len(values) - 1))] = draw(st.sampled_from([INF, -INF, NAN]))
        return torch.tensor(values, dtype=torch.float64).reshape(rows, cols).to(dtype)

    a, b = matrix(M, K, a_dtype), matrix(K, N, b_dtype)
    bias_shape = draw(st.sampled_from([None, (N,), (M, N), (M, 1), ()]))
    bias = None
    if bias_shape is not None:
        bias = matrix(1, math.prod(bias_shape), bias_dtype).reshape(bias_shape)
    return a, b, bias, out_dtype


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_property_matches_oracle(problem):
    a, b, bias, out_dtype = problem
    check_mm(a, b, out_dtype, bias, context=f"a={a.tolist()} b={b.tolist()} bias={bias} out={out_dtype}")


# ------------------------------------------- operands with zero ends of rows
# The CPU's fp64 GEMM skips blocks of products that the rows' nonzero spans
# show to be exact zeros (triangular operands, as in causal attention); the
# bits must be the oracle's, NaNs, infinities and signed zeros included.


@pytest.mark.parametrize("a_dtype,out_dtype", [(F32, F32), (BF16, F32), (F16, F16)])
def test_bmm_triangular_operands(a_dtype, out_dtype):
    g = generator(21)
    a = random_values((1, 256, 250), a_dtype, g).tril()  # rows end in zeros
    b = random_values((1, 250, 16), a_dtype, g)
    assert_bits_equal(carbon.bmm(a, b, out_dtype=out_dtype), bmm_bits(a, b, None, out_dtype), "tril a")
    at = a.transpose(1, 2)  # strided rows that start with zeros
    c = random_values((1, 256, 17), a_dtype, g)
    assert_bits_equal(carbon.bmm(at, c, out_dtype=out_dtype), bmm_bits(at, c, None, out_dtype), "triu a^T")
    d = random_values((1, 15, 250), a_dtype, g)
    assert_bits_equal(carbon.bmm(d, a.transpose(1, 2), out_dtype=out_dtype),
                      bmm_bits(d, a.transpose(1, 2), None, out_dtype), "triangular b")


def test_bmm_skipped_blocks_with_special_values():
    # Infinities and NaNs in one operand meet the other's zero blocks: the
    # products 0 * inf are NaN even where the GEMM skips them.
    g = generator(22)
    a = random_values((1, 256, 255), F32, g).tril()
    b = random_values((1, 255, 20), F32, g)
    b[0, 200, 3], b[0, 240, 7], b[0, 250, 9] = INF, NAN, -INF  # rows of b that low rows of a never reach
    a[0, 5, 0] = Z  # -0 in a row with nonzeros
    a[0, 70] = 0.0  # a zero row, and one of -0s
    a[0, 71] = Z
    for bias in (None, random_values((256, 20), F32, g)):
        expected = bmm_bits(a, b, bias, F32)
        out = carbon.bmm(a, b) if bias is None else carbon.baddbmm(bias, a, b)
        assert_bits_equal(out, expected, f"specials, bias {bias is not None}")


def test_scratch_reuse_across_calls_of_different_sizes():
    # The CPU path reuses its fp64 scratch blocks from call to call (a block
    # larger than needed is handed out again): results must not depend on
    # what an earlier call left there.
    g = generator(23)
    for shape in [(2, 40, 50, 30), (1, 3, 4, 5), (2, 40, 50, 30), (3, 60, 7, 9), (1, 1, 1, 1), (2, 8, 70, 8)]:
        B, M, K, N = shape
        a, b = random_values((B, M, K), F32, g), random_values((B, K, N), F32, g)
        assert_bits_equal(carbon.bmm(a, b), bmm_bits(a, b, None, None), f"bmm {shape}")
        assert_bits_equal(carbon.bmm(a, b.transpose(1, 2).contiguous().transpose(1, 2)), bmm_bits(a, b, None, None),
                          f"bmm {shape}, b column-major")
