"""Products with few rows per batch (M <= 32) take the CPU's direct path
(csrc/matmul/matmul_few_rows_cpu.cpp): straight from b, in either of its
contiguous layouts (rows: x @ W; columns: x @ W.T, nn.Linear). Its results
are RN(bias + sum_k a_ik b_kj) like every other path's: checked here against
the exact oracle (tests/oracle.py), against the general path
(CARBON_MATMUL_GENERAL), against the same rows inside a larger product, and
its AVX2 loops against its portable loop in two processes."""

import math
import random

import pytest
import torch

import carbon
from data import BF16, F16, F32, exact_tensor, generator, random_values, tie_rows
from oracle import as_bits, assert_bits_equal, bmm_bits, mm_bits
from portable_paths import assert_portable_gives_the_same_bits

Z = -0.0
LAYOUTS = ["rows", "columns"]
COMBOS = [(F32, F32, None), (BF16, BF16, None), (F16, F16, None), (F32, BF16, F16), (BF16, F32, BF16)]


def laid_out(b: torch.Tensor, layout: str) -> torch.Tensor:
    """b with its rows contiguous (as given) or its columns contiguous (the transpose of a contiguous
    [N, K] weight, as nn.Linear passes it); the same values either way."""
    return b.contiguous() if layout == "rows" else b.t().contiguous().t()


def check(a, b, out_dtype=None, bias=None, context=""):
    out = carbon.mm(a, b, out_dtype=out_dtype) if bias is None else carbon.addmm(bias, a, b, out_dtype=out_dtype)
    assert_bits_equal(out, mm_bits(a, b, bias, out_dtype), context)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 13, 32])
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", COMBOS)
def test_random_products_against_the_oracle(M, layout, a_dtype, b_dtype, out_dtype):
    # K = 70: two chunks of 32 rows of b and a rest, and a k tail of 2 past the
    # vector loops' steps of 4; N = 77: a block of 64 columns and one of 13
    # (an 8-column strip or three 4-column groups, then single columns).
    g = generator(1000 * M + len(layout) + 10 * COMBOS.index((a_dtype, b_dtype, out_dtype)))
    a, b = random_values((M, 70), a_dtype, g), laid_out(random_values((70, 77), b_dtype, g), layout)
    check(a, b, out_dtype, context=f"{M}x70x77 {layout} {a_dtype} x {b_dtype} -> {out_dtype}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bias_shape", [(9,), (3, 9), (3, 1), (1, 1), ()], ids=str)
def test_bias_broadcasts(layout, bias_shape):
    g = generator(31)
    a, b = random_values((3, 21), F32, g, spread=4), laid_out(random_values((21, 9), BF16, g, spread=4), layout)
    bias = random_values(bias_shape, F32, g, spread=4)
    for out_dtype in (None, BF16):
        check(a, b, out_dtype, bias, f"bias {bias_shape} {layout} -> {out_dtype}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batched_products_with_a_bias(layout):
    g = generator(41)
    a = random_values((3, 5, 33), BF16, g)
    b = random_values((3, 33, 19), F32, g)
    b = b if layout == "rows" else b.transpose(1, 2).contiguous().transpose(1, 2)
    bias = random_values((1, 5, 1), F32, g)
    assert_bits_equal(carbon.bmm(a, b), bmm_bits(a, b), f"bmm {layout}")
    assert_bits_equal(carbon.baddbmm(bias, a, b, out_dtype=BF16), bmm_bits(a, b, bias, BF16), f"baddbmm {layout}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", [F32, BF16, F16])
def test_zero_rows_and_columns_keep_the_signed_zero_rule(layout, out_dtype):
    """Rows of a and columns of b made of +0 and -0 (their products are zeros: the sign rule
    decides, from the rows' and columns' signs) among ordinary ones, with and without a -0 bias."""
    K, N = 20, 12
    rng = random.Random(5)
    rows = [[0.0] * K, [Z] * K, [rng.choice([0.0, Z]) for _ in range(K)], [rng.uniform(-2, 2) for _ in range(K)]]
    columns = [[0.0] * K, [Z] * K, [rng.choice([0.0, Z]) for _ in range(K)]]
    columns += [[rng.uniform(-2, 2) for _ in range(K)] for _ in range(N - len(columns))]
    a = exact_tensor([[float(torch.tensor(x).float()) for x in r] for r in rows], F32)
    bt = exact_tensor([[float(torch.tensor(x).float()) for x in c] for c in columns], F32)
    b = bt.t().contiguous() if layout == "rows" else bt.t()
    for bias in (None, torch.tensor(Z), torch.tensor(0.0)):
        check(a, b, out_dtype, bias, f"{layout} bias {bias}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_infinities_nans_and_overflow(layout):
    K, N = 24, 10
    g = generator(7)
    a = random_values((4, K), F32, g, spread=2)
    b = random_values((K, N), F32, g, spread=2)
    a[0, 3] = math.inf  # a row with an infinity: inf, -inf or NaN (inf * 0) by column
    b[5, 1] = 0.0
    a[1, 7] = math.nan  # a NaN row
    b[2, 4] = -math.inf  # a column with an infinity
    a[2] = 2.0**100
    b[:, 6] = 2.0**100  # finite terms whose sum overflows float32 (and its bfloat16 / float16 roundings)
    b[:, 8] = 0.0
    b[3, 8] = math.inf  # inf * finite and inf * 0 in one column
    for out_dtype in (F32, BF16, F16):
        check(a, laid_out(b, layout), out_dtype, context=f"{layout} -> {out_dtype}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype,a_dtype", [(F32, F32), (BF16, F32), (F16, BF16)])
@pytest.mark.parametrize("nudge", [0, 1, -1])
def test_exact_ties_and_near_ties(layout, out_dtype, a_dtype, nudge):
    """Rows whose exact sum is a tie of the output format (or just off one): the fp64 sums cannot
    decide them, so the exact accumulator does, and ties go to even."""
    rng = random.Random(11 + nudge)
    K = 40
    a = exact_tensor(tie_rows(a_dtype, out_dtype, 6, K, nudge, rng, pairs=3), a_dtype)
    # b's column 0 is all ones (the row's plain sum); the others scale it by powers of two and signs.
    scales = [1.0, 2.0, -0.5, 2.0**-3, -(2.0**5), 1.0, -1.0, 0.25, 4.0]
    b = torch.stack([torch.full((K,), s) for s in scales], dim=1).to(a_dtype)
    out = check(a, laid_out(b, layout), out_dtype, context=f"{layout} nudge {nudge}")
    assert out.shape == (6, len(scales))


def test_subnormal_and_tiny_results():
    g = generator(13)
    for layout in LAYOUTS:
        for out_dtype in (F32, BF16, F16):
            a = random_values((3, 30), F32, g, spread=3, scale_exp=-70)
            b = random_values((30, 11), F32, g, spread=3, scale_exp=-70 if out_dtype != F16 else -3)
            check(a, laid_out(b, layout), out_dtype, context=f"{layout} -> {out_dtype}")


@pytest.mark.parametrize("layout", LAYOUTS + ["strided"])
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, None), (BF16, F32), (F16, None)])
def test_same_bits_as_the_general_path_on_larger_products(monkeypatch, layout, dtype, out_dtype):
    """Wide exponent ranges and rows that cancel; K spans several chunks of b and N several blocks.
    'strided' (neither dimension of b contiguous) goes to the general path in both runs."""
    g = generator(17)
    a = random_values((16, 300), dtype, g, spread=30 if dtype != F16 else 4)
    a[3, 150:] = -a[3, :150]  # an exact cancellation of the large terms
    b_full = random_values((300, 2 * 190), dtype, g, spread=30 if dtype != F16 else 4)
    b = b_full[:, ::2] if layout == "strided" else laid_out(b_full[:, :190], layout)
    bias = random_values((190,), dtype, g)
    direct = carbon.addmm(bias, a, b, out_dtype=out_dtype)
    monkeypatch.setenv("CARBON_MATMUL_GENERAL", "1")
    general = carbon.addmm(bias, a, b, out_dtype=out_dtype)
    assert torch.equal(as_bits(direct), as_bits(general))
    assert_bits_equal(direct[3:5], mm_bits(a[3:5], b, bias, out_dtype), "rows 3 and 4 against the oracle")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_row_alone_equals_its_row_in_a_large_batch(layout):
    """A decoding step (one row, the direct path) gives the bits of the same row inside a 64-row
    product (the general path)."""
    g = generator(19)
    a = random_values((64, 200), F32, g, spread=10)
    b = laid_out(random_values((200, 100), F32, g, spread=10), layout)
    full = carbon.mm(a, b)
    for i in range(0, 64, 7):
        assert torch.equal(as_bits(carbon.mm(a[i : i + 1], b)), as_bits(full[i : i + 1])), f"row {i}"
    for rows in (2, 5, 16):
        assert torch.equal(as_bits(carbon.mm(a[:rows], b)), as_bits(full[:rows])), f"first {rows} rows"


SCRIPT = r'''
import sys, torch, carbon
torch.manual_seed(0)
results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for M, K, N in ((1, 70, 77), (3, 130, 40), (6, 9, 200), (16, 65, 9)):
        a = (torch.randn(M, K) * torch.logspace(-3, 3, K)).to(dtype)
        w = (torch.randn(N, K) * 4).to(dtype)
        a[0, 1] = -a[0, 0] if K > 1 else a[0, 0]
        w[1] = 0.0
        results.append(carbon.mm(a, w.t()))                       # columns contiguous
        results.append(carbon.mm(a, w.t().contiguous()))          # rows contiguous
        results.append(carbon.addmm(w[0, :1].float(), a, w.t().contiguous(), out_dtype=torch.bfloat16))
torch.save(results, sys.argv[1])
'''


def test_avx2_and_portable_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX2",), fixed=("CARBON_CPU_NO_AVX512",))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("M", [2, 5])
def test_sums_that_lose_their_small_terms_in_fp64(layout, M):
    """Each row: 2^60 in k = 0..3 (the first term of every vector lane and accumulator set), small
    terms, -2^60 in k = 28..31, then ones: every fp64 evaluation order absorbs the small terms into
    2^60 and cancels it, leaving a sum of ones near 4 that is wrong. Only the error bound (gamma_K
    times the norms) sends these outputs to the exact accumulator."""
    K = 40
    rng = random.Random(23 + M)
    rows = []
    for i in range(M):
        small = [rng.choice([0.75, -0.5, 0.375, 2.0**-20, -(2.0**-30)]) for _ in range(24)]
        rows.append([2.0**60] * 4 + small + [-(2.0**60)] * 4 + [1.0] * 8)
    a = exact_tensor(rows, F32)
    b = laid_out(exact_tensor([[1.0, 2.0, -1.0, 0.5, 1.0, 1.0, 4.0, -2.0, 1.0]] * K, F32), layout)
    for out_dtype in (F32, BF16):
        check(a, b, out_dtype, context=f"{layout} M={M} -> {out_dtype}")
