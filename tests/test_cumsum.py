"""Exact prefix sums (torch.ops.carbon.cumsum_rows; torch.cumsum under
carbon.enable): out[i] = RN(x[0] + ... + x[i]), every prefix exact and rounded
once, against the integer oracle (tests/oracle.prefix_sum_bits: every prefix's exact sum rounded once)."""

from __future__ import annotations

import math
import random

import pytest
import torch

import carbon
from tests.oracle import as_bits, fmt_of, prefix_sum_bits

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_rows(x, out_dtype=None):
    out = torch.ops.carbon.cumsum_rows(x, out_dtype)
    dtype = out_dtype or x.dtype
    assert out.dtype == dtype and out.shape == x.shape
    mask = (1 << fmt_of(dtype).total_bits) - 1
    for r, row in enumerate(x.double().tolist()):
        got = [b & mask for b in as_bits(out)[r].tolist()]
        assert got == prefix_sum_bits(row, dtype), (r, row[:6])


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_rows(dtype):
    rng = random.Random(2)
    rows = [[rng.gauss(0, 1) * 2.0 ** rng.randint(-12, 12) for _ in range(300)] for _ in range(4)]
    check_rows(torch.tensor(rows, dtype=torch.float64).to(dtype))


def test_cancellation_ties_and_signed_zeros_take_the_exact_path():
    rows = [
        [2.0 ** 100, 1.0, -(2.0 ** 100), 2.0 ** -30, 3.0, -1.0, 2.0 ** 60, -(2.0 ** 60)],
        [1.0, 2.0 ** -24, 2.0 ** -24, -1.0, 2.0 ** -60, 1.0, -(2.0 ** -60), 2.0 ** -24],  # midpoints
        [-0.0, -0.0, 0.0, -0.0, 1e-45, -1e-45, -0.0, 3.0],
        [1.0, math.nan, 2.0, 3.0, -math.inf, 1.0, 1.0, 1.0],
        [math.inf, 1.0, -math.inf, 2.0, 0.0, 0.0, 0.0, 0.0],
        [3.4e38, 3.4e38, -3.4e38, -3.4e38, 1.0, 2.0, 3.0, 4.0],
    ]
    check_rows(torch.tensor(rows, dtype=torch.float32))


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_float32_rows_of_every_length_around_eight_prefixes(in_dtype):
    """float32 outputs on an AVX-512 CPU are decided eight prefixes at a time (csrc/reduce/cumsum_cpu.cpp;
    the rest take the exact accumulator): every length 1..19 and 31..33, with a prefix tie, a prefix of zeros
    of both signs, subnormal and overflowing prefixes and a NaN at a different place in each row."""
    rng = random.Random(9)
    specials = [2.0 ** -24, -0.0, 1e-40 if in_dtype == torch.float32 else 2.0 ** -130, 3.0e38, math.nan, -math.inf]
    for n in list(range(1, 20)) + [31, 32, 33]:
        rows = []
        for r in range(6):
            row = [rng.uniform(-2, 2) for _ in range(n)]
            if r == 0:
                row = [1.0] + [0.0] * (n - 1)  # 1, then prefixes 1 + 2^-24 (a tie) and back
                if n > 2:
                    row[1], row[2] = 2.0 ** -24, -(2.0 ** -24)
            elif r == 1:
                row = [rng.choice([0.0, -0.0]) for _ in range(n)]
                row[-1] = -0.0
            else:
                row[rng.randrange(n)] = specials[r]
                if r == 5:
                    row[0] = 3.0e38
            rows.append(row)
        check_rows(torch.tensor(rows, dtype=torch.float64).to(in_dtype), torch.float32)


def test_output_dtype_is_one_rounding_of_the_exact_prefix():
    rng = random.Random(4)
    x = torch.tensor([[rng.uniform(-1, 1) for _ in range(64)] for _ in range(3)])
    check_rows(x, torch.bfloat16)
    check_rows(x.to(torch.float16), torch.float32)


def test_thread_and_batch_invariance(restore_num_threads):
    x = torch.randn(257, 99, generator=torch.Generator().manual_seed(1)) * 1e3
    torch.set_num_threads(1)
    one = torch.ops.carbon.cumsum_rows(x, None)
    torch.set_num_threads(2)
    two = torch.ops.carbon.cumsum_rows(x, None)
    assert torch.equal(as_bits(one), as_bits(two))
    assert torch.equal(as_bits(one[100:101]), as_bits(torch.ops.carbon.cumsum_rows(x[100:101], None)))


def test_torch_cumsum_under_enable_with_gradient():
    x = (torch.randn(3, 20, 4, generator=torch.Generator().manual_seed(2)) * 10).requires_grad_(True)
    g = torch.randn(3, 20, 4, generator=torch.Generator().manual_seed(3))
    with carbon.enabled():
        y = torch.cumsum(x, dim=1)
        y.backward(g)
        ints = torch.cumsum(torch.arange(6), 0)
    assert ints.tolist() == [0, 1, 3, 6, 10, 15]
    for b, c in [(0, 0), (2, 3), (1, 2)]:
        row = x[b, :, c].tolist()
        assert [v & 0xFFFFFFFF for v in as_bits(y)[b, :, c].tolist()] == prefix_sum_bits(row, torch.float32)
        # d/dx_i sum_j g_j y_j = g_i + ... + g_n: the reverse prefix sums of g, each exact
        rev = g[b, :, c].tolist()[::-1]
        want = prefix_sum_bits(rev, torch.float32)[::-1]
        assert [v & 0xFFFFFFFF for v in as_bits(x.grad)[b, :, c].tolist()] == want


def test_errors_and_opcheck():
    with pytest.raises(ValueError, match="carbon.cumsum_rows: x must be 2-D"):
        torch.ops.carbon.cumsum_rows(torch.ones(3), None)
    with pytest.raises(TypeError, match="carbon.cumsum_rows: x has dtype"):
        torch.ops.carbon.cumsum_rows(torch.ones(2, 3, dtype=torch.float64), None)
    assert torch.ops.carbon.cumsum_rows(torch.ones(0, 5), None).shape == (0, 5)
    assert torch.ops.carbon.cumsum_rows(torch.ones(4, 0), None).shape == (4, 0)
    torch.library.opcheck(torch.ops.carbon.cumsum_rows, (torch.randn(3, 7), None))
    torch.library.opcheck(torch.ops.carbon.cumsum_rows, (torch.randn(3, 7), torch.bfloat16))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_equals_cpu():
    x = torch.randn(300, 1000, generator=torch.Generator().manual_seed(5)) * 2.0 ** 40
    x[7, 10] = float("nan")
    x[8, 3] = float("inf")
    for dtype in (None, torch.bfloat16):
        assert torch.equal(as_bits(torch.ops.carbon.cumsum_rows(x.cuda(), dtype).cpu()),
                           as_bits(torch.ops.carbon.cumsum_rows(x, dtype)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_long_rows_in_chunks_equal_cpu():
    """Rows past 256 run in chunks of 64 on CUDA (cumsum_cuda.cu): top-p's single row of 50257 probabilities,
    64 such rows, a row with a tie (1 + 2^-24) at every other prefix, and a row of -0: the CPU's bits."""
    g = torch.Generator().manual_seed(6)
    probs = torch.rand(64, 50257, generator=g)
    probs = probs / probs.sum(-1, keepdim=True)
    ties = torch.tensor([[1.0] + [2.0**-24, -(2.0**-24)] * 700])
    zeros = torch.full((1, 1000), -0.0)
    for x in (probs[:1], probs, ties, zeros):
        for dtype in (None, torch.bfloat16):
            assert torch.equal(as_bits(torch.ops.carbon.cumsum_rows(x.cuda(), dtype).cpu()),
                               as_bits(torch.ops.carbon.cumsum_rows(x, dtype))), (tuple(x.shape), dtype)
