"""Carbon's CUDA column kernels (csrc/reduce/column_sums.cuh), run on the CPU emulator (torch.ops.carbon_emu),
return the bits of Carbon's CPU kernels (torch.ops.carbon): carbon.sum / carbon.mean over the leading
dimensions of a contiguous tensor (a bias gradient's reduction, read in place) and the weight / bias gradients
of layer_norm / rms_norm (the same kernels over the terms dy * xhat and dy).

The kernels: pass 1 gives a thread to each (column, chunk of rows) and adds the chunk in row order in fp64;
pass 2 gives a thread to each column, adds its chunks' partials and decides by tier 1; a column of only +-0
terms is decided from pass 1's flags; the warp finishes each undecided column with tiers 2 and 3, reading the
column (strided) again. On the emulated device (2 SMs, CARBON_CUDA_EMULATOR_SMS) pass 1 aims at 2 * 2048
threads: C columns in blocks of min(256, C rounded up to 32) threads, ceil(4096 / threads in all) chunks of at
least 32 rows (at most 1024 chunks). The cases cover one and many chunks, columns in several blocks and warps,
undecided columns beside decided ones in a warp (ties, near-ties, exact cancellation), sums off by nearly
tier 1's error bound for the kernels' own chain (chunk_rows + chunks additions), +-0 columns, NaN, +-inf and
overflow. Each reduction asserts the column path ran (two launches; the row path launches one)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)
from data import (
    BF16, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, generator, midpoint_mean_rows, random_values,
    reduction_values, seed_of, tie_rows,
)
from emulated import check_op, emulated_ops, launches
from norm_util import norm_data, params

INF, NAN = math.inf, math.nan


def name_of(dtype):
    return "none" if dtype is None else str(dtype).replace("torch.", "")


def param_id(v):
    return name_of(v) if v is None or isinstance(v, torch.dtype) else str(v)


def column_op(op, x, dim=(0,), keepdim=False, out_dtype=None, context=""):
    """carbon.<op> over the leading dims `dim` of a contiguous x, emulated vs CPU; asserts the column kernels
    ran (two launches)."""
    label = f"{tuple(x.shape)} {x.dtype} dim={list(dim)} keepdim={keepdim} dtype={name_of(out_dtype)} {context}"
    before = launches()
    check_op(op, x, list(dim), keepdim, out_dtype, context=label)
    assert launches() - before == 2, f"{op} {label}: {launches() - before} launches, the column path takes 2"


def cancel_columns(x, columns):
    """Makes the given columns' lower halves the negated upper halves: exact sums of 0 (or of the odd last
    element) that tier 1 cannot decide."""
    n = x.shape[0]
    for c in columns:
        x[n // 2 : 2 * (n // 2), c] = -x[: n // 2, c]
    return x


# ====================================================================== carbon.sum / carbon.mean

# (rows, columns): one chunk (2, 33 rows), many chunks of few columns (1000 x 31, 5000 x 3), columns in
# several pass-1 blocks (257, 600) and pass-2 warps.
SHAPES = [(2, 2), (33, 5), (1000, 31), (64, 257), (5000, 3), (300, 600)]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=param_id)
def test_columns_shapes_and_dtypes(op, in_dtype, out_dtype):
    g = generator(seed_of("columns", op, in_dtype, out_dtype))
    spread = 3 if F16 in (in_dtype, out_dtype) else 20
    for rows, cols in SHAPES:
        x = cancel_columns(random_values((rows, cols), in_dtype, g, spread=spread), range(0, cols, 3))
        column_op(op, x, out_dtype=out_dtype, context="random, every third column cancelling")


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_leading_dims_of_3d_tensors_and_keepdim(op):
    g = generator(seed_of("3d", op))
    x = reduction_values((7, 60, 45), BF16, g, dim=(0, 1))
    for dim in ((0, 1), (1, 0), (0,)):
        for keepdim in (False, True):
            column_op(op, x, dim, keepdim, None, "3-D")
    column_op(op, x, (0, 1), False, F32, "3-D into float32")


@pytest.mark.parametrize("nudge", [0.0, 2.0**-60, -(2.0**-60), 2.0**-30], ids=["tie", "above", "below", "near"])
@pytest.mark.parametrize("in_dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
def test_column_ties_beside_decided_columns(in_dtype, out_dtype, nudge):
    """70 columns whose sums are ties of out_dtype (or a hair off), shuffled among 70 random ones, 200 rows (7
    chunks): several undecided lanes in one warp, each finished by the whole warp in turn."""
    rng = random.Random(seed_of("column ties", in_dtype, out_dtype, nudge))
    g = generator(seed_of("column ties", in_dtype, out_dtype, nudge))
    ties = exact_tensor(tie_rows(in_dtype, out_dtype, 70, 200, nudge, rng, pairs=6), in_dtype).t()
    spread = 3 if F16 in (in_dtype, out_dtype) else 20
    x = torch.cat([ties, random_values((200, 70), in_dtype, g, spread=spread)], dim=1)
    x = x[:, torch.randperm(140, generator=g)].contiguous()
    column_op("sum", x, out_dtype=out_dtype, context="ties")


def bound_column(dtype, chunk_rows, chunks):
    """A column whose fp64 chains lose, in every chunk, one bit of each of chunk_rows - 2 terms: +L, then
    chunk_rows - 2 copies of t = 1 + 2^(1-p), then -L, with L = 2^(54-p) (next to L each t is a tie that rounds
    down). The exact sum is chunks * (chunk_rows - 2) * t; the fp64 chain gives chunks * (chunk_rows - 2)."""
    prec = {F32: 24, BF16: 8}[dtype]
    block = torch.full((chunk_rows,), 1.0 + 2.0 ** (1 - prec), dtype=torch.float64)
    block[0], block[-1] = 2.0 ** (54 - prec), -(2.0 ** (54 - prec))
    return block.repeat(chunks).to(dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=name_of)
def test_column_sums_at_the_fp64_error_bound(dtype):
    """32 columns of 8192 rows: on 2 SMs pass 1 takes 128 chunks of 64 rows, each losing 62 low bits in the
    same direction. Tier 1's bound with the true depth (64 + 128 additions) covers the error, so the exact tiers
    decide; a smaller depth would decide the fp64 value, a wrong one. The sum is checked against the exact
    value too (Fractions), not only against the CPU."""
    prec = {F32: 24, BF16: 8}[dtype]
    col = bound_column(dtype, 64, 128)
    x = col.unsqueeze(1).repeat(1, 32).contiguous()
    x[:, 1::2] = -x[:, 1::2]
    for op in ("sum", "mean"):
        for out_dtype in (None, F32, BF16):
            column_op(op, x, out_dtype=out_dtype, context="error bound")
    exact = Fraction(128 * 62) * (1 + Fraction(1, 2 ** (prec - 1)))
    assert Fraction(float(exact)) == exact  # a binary64 value: one rounding to float32 below
    want = torch.tensor([float(exact), -float(exact)] * 16, dtype=torch.float64).to(F32)
    got = emulated_ops().sum(x, [0], False, F32)
    assert torch.equal(got, want), (got[:2], want[:2])
    assert float(want[0]) != float(128 * 62), "the fp64 chain's value must round differently from the exact sum"


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_column_special_values_and_signed_zeros(op, dtype):
    """2000 rows (many chunks): columns of only -0, of -0 with one +0 in the last chunk, of +0; NaN (payloads)
    in one chunk, +inf and -inf in different chunks, +inf alone, float32-max terms that cancel across chunks,
    subnormal terms; beside random columns."""
    g = generator(seed_of("column specials", op, dtype))
    x = random_values((2000, 40), F32, g, spread=3 if dtype == F16 else 20)
    x[:, 0] = -0.0
    x[:, 1] = -0.0
    x[1999, 1] = 0.0
    x[:, 2] = 0.0
    x[1000, 3] = NAN
    x[5, 4], x[1900, 4] = INF, -INF
    x[700, 5] = INF
    x[3, 6] = torch.tensor(0x7FC12345, dtype=torch.int32).view(F32)
    x[:1000, 7], x[1000:, 7] = 3e38, -3e38
    x[:, 8] = 2.0**-149
    x[::2, 9], x[1::2, 9] = 0.0, -0.0
    x = x.to(dtype)
    for out_dtype in (None, BF16, F16):
        column_op(op, x, out_dtype=out_dtype, context="specials")


@pytest.mark.parametrize("in_dtype,out_dtype,eps_rel_exp", [(F32, F32, -80), (BF16, BF16, -80), (F16, F16, -25)],
                         ids=param_id)
@pytest.mark.parametrize("toward", ["odd", "even", "tie"])
def test_column_means_near_midpoints(in_dtype, out_dtype, eps_rel_exp, toward):
    """Column means exactly at, or a hair off, a midpoint of out_dtype: the exact long division."""
    rng = random.Random(seed_of("column midpoints", in_dtype, out_dtype, toward))
    rows, _ = midpoint_mean_rows(in_dtype, out_dtype, 24, 300, eps_rel_exp, rng, toward, pairs=20, max_tries=5000)
    assert len(rows) >= 8
    column_op("mean", exact_tensor(rows, in_dtype).t().contiguous(), out_dtype=out_dtype, context="midpoints")


# ====================================================================== layer_norm / rms_norm parameter gradients

MASKS = ([False, True, True], [False, True, False], [False, False, True], [True, True, True])


def check_param_grads(x, w, dy, context):
    """norm_backward of layer_norm and of rms_norm for every mask with a parameter gradient, emulated vs CPU;
    the statistics from carbon's CPU forward."""
    n = x.shape[-1]
    _, mean, rstd = torch.ops.carbon.layer_norm(x, [n], w, None, 1e-5)
    _, rrstd = torch.ops.carbon.rms_norm(x, [n], w, None)
    for mask in MASKS:
        check_op("norm_backward", dy, x, [n], mean, rstd, w, mask, context=f"layer_norm {context} {mask}")
        check_op("norm_backward", dy, x, [n], None, rrstd, w, mask, context=f"rms_norm {context} {mask}")


@pytest.mark.parametrize("rows,n", [(1, 5), (2, 3), (33, 40), (700, 40), (3000, 7), (90, 257)], ids=param_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_param_grads_shapes(dtype, rows, n):
    x = norm_data(rows, n, dtype, seed_of("param grads", rows, n))
    w, _ = params((n,), dtype, "weight", seed_of("param grads", n))
    dy = random_values((rows, n), dtype, generator(seed_of("param grads dy", rows, n)), spread=2)
    for weight in (None, w):
        check_param_grads(x, weight, dy, f"rows={rows} n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_param_grads_cancelling_and_zero_columns(dtype):
    """Rows in equal pairs with opposite upstream gradients: every dweight and dbias term cancels exactly (sums
    of 0 from nonzero terms: the warp's exact tiers, recomputing dy * xhat); in half the columns one row is left
    out so a single term remains. Columns of dy that are all -0 (dbias -0; dweight the signs of -0 * xhat) or
    +-0 mixed, and a NaN and an inf in dy."""
    rows, n = 600, 48
    half = norm_data(rows // 2, n, dtype, seed_of("pairs", dtype))
    x = torch.stack([half, half], dim=1).reshape(rows, n)
    g = generator(seed_of("pairs dy", dtype))
    dh = random_values((rows // 2, n), dtype, g, spread=2)
    dy = torch.stack([dh, -dh], dim=1).reshape(rows, n)
    dy[7, ::2] = 0.0  # one term left in the even columns
    dy[:, 40] = -0.0
    dy[:, 41] = -0.0
    dy[599, 41] = 0.0
    dy[::3, 42] = 0.0
    dy[1::3, 42] = -0.0
    dy[2::3, 42] = -0.0
    dy[100, 43] = NAN
    dy[200, 44] = INF
    w, _ = params((n,), dtype, "weight", seed_of("pairs w", dtype))
    for weight in (None, w):
        check_param_grads(x, weight, dy, "cancelling pairs")
