"""Carbon's CUDA kernels of the reductions, matmuls and normalizations, run on the CPU emulator
(tests/cuda_emulator/, torch.ops.carbon_emu), return the same bits as Carbon's CPU kernels (torch.ops.carbon):
sum, mean, round_to, sum_divided, cumsum_rows, var_mean_rows, mm, addmm, bmm, baddbmm, layer_norm, rms_norm and
norm_backward. This is the emulated twin of test_reduce_cuda.py, test_mm_cuda.py and test_norm_cuda.py, so the
.cu files are checked on machines without a GPU.

Both sides compute the correctly rounded result, but by different code: the CPU's chains and trees against the
GPU's warps (lane-strided fp64 sums, butterfly shuffles, per-lane exact accumulators merged through shared
memory), block-per-chunk splits and grid-stride loops. So the cases target what can go wrong in CUDA code only:
- every dtype and output dtype, empty inputs (no rows: nothing may be launched; empty rows: launched) and
  1-element ones;
- row lengths around the warp (32) and the block (128 / 256 threads), past reduce_cuda.cu's split threshold
  (n > 64 Ki with fewer rows than 4 per SM: chunk blocks of 16 Ki elements, then a warp per row) and just under
  it; more rows / outputs than the emulated grid holds (2 SMs: blocks_for caps grids at 64 blocks), so the
  grid-stride loops take several turns;
- ties, near-ties and cancellation (tier 1 undecided: whole warps run the compensated tier and the exact
  accumulator), also hidden in long rows where only the merged partials cancel; rows whose fp64 sums are off
  by nearly tier 1's error bound for the kernel's own summation tree (a depth bound too small would decide
  wrong bits);
- NaN (payloads), +-inf, inf - inf, signed zeros, rows of only +-0, subnormal and overflowing results;
- norm rows cached in dynamic shared memory (n <= 1536: the default 24 KB; n <= 4096: the opt-in 64 KB) and
  rows re-read from global memory (n > 4096), weight / bias present or absent, the exact tiers of the
  statistics and of the backward's row sums;
- matmul with K = 0, 1, large K, bias of every broadcastable shape, strided / expanded operands.
The emulator shuffles the order of each block's fibers between barriers, so a missing barrier or a race shows
up as a changed result here."""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)
from data import (
    BF16, DTYPE_COMBOS, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, finite_bit_patterns, generator,
    midpoint_mean_rows, random_values, reduction_values, seed_of, tie_rows,
)
from emulated import check_op, emulated_ops, launches
from norm_util import adversarial_norm_rows, norm_data, params
from oracle import assert_bits_equal, bits_tensor, prefix_sum_bits

INF, NAN = math.inf, math.nan
WIDE = {F32: 30, BF16: 30, F16: 3}  # exponent spread of random data that keeps float16 sums finite

NUDGES = {"tie": 0.0, "just-above": 2.0**-60, "just-below": -(2.0**-60), "near-above": 2.0**-30,
          "near-below": -(2.0**-30)}


def spread_for(*dtypes):
    return 3 if F16 in dtypes else 20


def name_of(dtype):
    return "none" if dtype is None else str(dtype).replace("torch.", "")


def param_id(v):
    """Test ids: dtypes by name (None: "none"), anything else as str."""
    return name_of(v) if v is None or isinstance(v, torch.dtype) else str(v)


def rows_of(shape, dim) -> int:
    """The number of outputs of a reduction of `shape` over `dim` (0: no kernel is launched)."""
    ndim = len(shape)
    if dim is None or (isinstance(dim, list) and not dim):
        return 1
    reduced = {d % max(ndim, 1) for d in dim}
    return math.prod(s for d, s in enumerate(shape) if d not in reduced)


def reduce_op(op, x, dim=None, keepdim=False, dtype=None, context=""):
    """carbon.<op> emulated vs CPU; `dim` a list of ints or None."""
    label = f"{tuple(x.shape)} {x.dtype} dim={dim} keepdim={keepdim} dtype={name_of(dtype)} {context}"
    return check_op(op, x, dim, keepdim, dtype, context=label, expect_launch=rows_of(tuple(x.shape), dim) > 0)


# ====================================================================== sum / mean

SHAPES = [(), (1,), (7,), (0,), (1, 1), (5, 33), (3, 0), (0, 4), (4, 1, 6), (2, 0, 3), (3, 2, 1, 40)]


def dims_for(ndim):
    if ndim == 0:
        return [None, [], [0], [-1]]
    out = [None, [], [0], [-1]]
    if ndim >= 2:
        out += [[1], [0, ndim - 1], [-1, 0]]
    if ndim >= 3:
        out += [[0, 2], [1, -1]]
    if ndim == 4:
        out += [[1, 2, 3], [3, 0, 2]]
    return out


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=param_id)
def test_shapes_dims_keepdim_and_dtypes(op, in_dtype, out_dtype):
    """0-D to 4-D inputs with empty and size-1 dimensions, every dim spelling and keepdim."""
    g = generator(seed_of("shapes", op, in_dtype, out_dtype))
    for shape in SHAPES:
        x = reduction_values(shape, in_dtype, g, dim=-1 if shape else None, spread=spread_for(in_dtype, out_dtype))
        for dim in dims_for(len(shape)):
            for keepdim in (False, True):
                reduce_op(op, x, dim, keepdim, out_dtype)


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 127, 128, 129, 255, 256, 257, 1025, 4097])
def test_row_lengths_around_warp_and_block_sizes(op, n):
    g = generator(seed_of("lengths", op, n))
    x = reduction_values((6, n), F32, g, dim=1, spread=30)
    if n >= 2:
        x[2, n // 2 : 2 * (n // 2)] = -x[2, : n // 2]  # exact cancellation: tier 1 cannot decide
    for out_dtype in (None, BF16, F16):
        reduce_op(op, x if out_dtype != F16 else x * 2.0**-20, [1], False, out_dtype)


# n = 64 Ki is the largest row length on the one-kernel path; above it, fewer than sms * 4 = 8 rows (the emulator
# has 2 SMs) take the split path: blocks of 16 Ki elements (the last one partial), then a warp per row (1 Mi
# elements: 64 chunk partials, two per lane of the finishing warp).
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("rows,n", [(3, 65536), (3, 65537), (1, 81920), (2, 100_003), (7, 70_001), (8, 70_001),
                                    (1, 1 << 20)],
                         ids=param_id)
@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (F32, BF16)],
                         ids=param_id)
def test_long_rows_split_and_unsplit(op, rows, n, in_dtype, out_dtype):
    """Long rows with cancelling halves (tiers 2 and 3 on the warp after the split tier 1) and random ones, also
    as a full reduction of all the rows at once (one long row)."""
    g = generator(seed_of("long", op, rows, n, in_dtype, out_dtype))
    x = reduction_values((rows, n), in_dtype, g, dim=1, spread=WIDE[in_dtype] if out_dtype != F16 else 3)
    x[0, n // 2 : 2 * (n // 2)] = -x[0, : n // 2]
    x[0, 5] += 1.0 if in_dtype != F16 else 0.5  # cancels to (almost) one term
    if rows > 1:
        x[-1, n // 2 : 2 * (n // 2)] = -x[-1, : n // 2]  # cancels exactly (or to the odd last element)
    reduce_op(op, x, [1], False, out_dtype)
    if rows <= 3:
        reduce_op(op, x, None, False, out_dtype, "full reduction")
        reduce_op(op, x.t(), [0], True, out_dtype, "columns of the transpose")


def emulated_sms() -> int:
    """The emulated device's SM count (cuda_emulator.cpp: CARBON_CUDA_EMULATOR_SMS, default 2)."""
    try:
        return max(1, int(os.environ.get("CARBON_CUDA_EMULATOR_SMS", "2")))
    except ValueError:
        return 1


@pytest.mark.parametrize("rows,n,kernels", [(3, 65536, 1), (3, 65537, 2), ("split", 70_001, 2), ("unsplit", 70_001, 1)],
                         ids=param_id)
def test_long_rows_take_the_path_the_cases_assume(rows, n, kernels):
    """The split path (2 kernels: chunk sums, then a warp per row) runs for rows longer than 64 Ki when there
    are fewer rows than 4 per SM, the one-kernel path otherwise: the long-row cases above rely on it."""
    sms = emulated_sms()
    rows = {"split": 4 * sms - 1, "unsplit": 4 * sms}.get(rows, rows)
    x = torch.ones((rows, n), dtype=BF16)
    before = launches()
    reduce_op("sum", x, [1], False, F32)
    assert launches() - before == kernels, f"{rows} rows of {n}: {launches() - before} kernels, expected {kernels}"


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("rows,n", [(600, 5), (300, 40), (1500, 1), (257, 0)], ids=param_id)
def test_many_rows_grid_stride(op, rows, n):
    """More rows than 64 blocks of 4 warps: each warp takes several rows in turn; a third of them cancel."""
    g = generator(seed_of("many", op, rows, n))
    x = reduction_values((rows, n), BF16, g, dim=1)
    for out_dtype in (None, F32):
        reduce_op(op, x, [1], False, out_dtype)
    reduce_op(op, x.t().contiguous(), [0], True, F16 if n else None, "as columns")


@pytest.mark.parametrize("nudge", NUDGES.values(), ids=NUDGES.keys())
@pytest.mark.parametrize("in_dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
def test_sum_ties_and_near_ties(in_dtype, out_dtype, nudge):
    """Every row's sum is a tie of out_dtype (or a hair off one): tier 1 never decides, the warp runs the
    compensated tier and, at exact ties, the exact accumulator."""
    rng = random.Random(seed_of("ties", in_dtype, out_dtype, nudge))
    x = exact_tensor(tie_rows(in_dtype, out_dtype, 95, 24, nudge, rng, pairs=4), in_dtype)
    reduce_op("sum", x, [1], False, out_dtype, "ties")
    reduce_op("sum", x.t(), [0], False, out_dtype, "ties, transposed")


@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("nudge", [0.0, 2.0**-60, -(2.0**-60)], ids=["tie", "just-above", "just-below"])
@pytest.mark.parametrize("n_pairs", [20_000, 50_000], ids=["unsplit-8-rows", "split-4-rows"])
def test_sum_ties_hidden_in_long_rows(out_dtype, nudge, n_pairs):
    """A tie planted in rows of tens of thousands of cancelling pairs, shuffled: the lanes' (or chunks') partial
    sums are large and cancel only when merged. 4 rows of 100k: the split path; 8 rows of 40k: one warp a row."""
    rows = 4 if n_pairs == 50_000 else 8
    rng = random.Random(seed_of("hidden", out_dtype, nudge, n_pairs))
    g = generator(seed_of("hidden", out_dtype, nudge, n_pairs))
    planted = exact_tensor(tie_rows(F32, out_dtype, rows, 16, nudge, rng, pairs=2), F32)
    v = random_values((rows, n_pairs), F32, g, spread=30 if out_dtype != F16 else 3)
    x = torch.cat([planted, v, -v], dim=1)
    x = x.gather(1, torch.rand(x.shape, generator=g).argsort(dim=1))
    reduce_op("sum", x, [1], False, out_dtype, "hidden ties")
    reduce_op("mean", x, [1], False, out_dtype, "hidden ties, mean")


@pytest.mark.parametrize("in_dtype,out_dtype,eps_rel_exp", [(F32, F32, -80), (BF16, BF16, -80), (F32, BF16, -30),
                                                            (F16, F16, -25), (BF16, F32, -80)],
                         ids=param_id)
@pytest.mark.parametrize("toward", ["odd", "even", "tie"])
@pytest.mark.parametrize("n", [7, 100, 3001])
def test_mean_near_midpoints(in_dtype, out_dtype, eps_rel_exp, toward, n):
    """Means exactly at, or a hair off, a midpoint of out_dtype: the exact long division of the accumulator."""
    rng = random.Random(seed_of("mid", in_dtype, out_dtype, toward, n))
    rows, _ = midpoint_mean_rows(in_dtype, out_dtype, 32, n, eps_rel_exp, rng, toward,
                                 pairs=1 if n < 100 else 40, max_tries=5000)
    assert len(rows) >= 8
    x = exact_tensor(rows, in_dtype)
    reduce_op("mean", x, [1], False, out_dtype, "midpoints")


SPECIALS = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 2.0**-149, -(2.0**-149), 2.0**100, -(2.0**100), 3e38, -3e38]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
def test_special_values_and_signed_zeros(op, out_dtype):
    """NaN, +-inf, inf - inf, signed zeros, subnormals, overflow; rows of only +-0 (the warp's all-zero branch);
    NaN payloads (the result is Carbon's one NaN)."""
    rng = random.Random(seed_of("specials", op, out_dtype))
    x = torch.tensor([[rng.choice(SPECIALS) for _ in range(5)] for _ in range(300)], dtype=F32)
    reduce_op(op, x, [1], False, out_dtype, "specials")
    reduce_op(op, x, [0], False, out_dtype, "specials, columns")
    zeros = torch.tensor([[rng.choice([0.0, -0.0]) for _ in range(3)] for _ in range(64)], dtype=F32)
    zeros[:8] = -0.0  # rows of only -0: the result is -0
    for dtype in DTYPES:
        reduce_op(op, zeros.to(dtype), [1], False, out_dtype, "signed zeros")
        reduce_op(op, zeros.to(dtype), None, False, out_dtype, "signed zeros, full")
        reduce_op(op, torch.full((2, 300), -0.0, dtype=dtype), [1], False, out_dtype, "long rows of -0")
    payloads = torch.tensor([0x7FC12345, -1, 0x7F800001, 0x3F800000], dtype=torch.int32).view(F32)
    reduce_op(op, payloads, None, False, out_dtype, "NaN payloads")
    reduce_op(op, payloads.reshape(2, 2), [1], False, out_dtype, "NaN payloads, rows")
    pairs = exact_tensor([[INF, 1.0, -INF], [INF, INF, 2.0], [-INF, -1.0, -INF], [NAN, INF, -INF]], F32)
    reduce_op(op, pairs, [1], False, out_dtype, "infinities")
    m = math.ldexp(1.5, 127)  # sums of two overflow float32 (and every narrower format)
    big = exact_tensor([[m, m, -1.0], [-m, -m, 1.0], [m, -m, 2.0**-149]], F32)
    reduce_op(op, big, [1], False, out_dtype, "overflowing sums")


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("kind", ["-0", "mixed zeros", "nan", "inf", "inf-inf", "huge cancel"])
def test_special_values_in_split_rows(op, kind):
    """The split path (3 rows of 80k) with special rows: all -0 (chunk sums of magnitudes all 0), one NaN or
    infinity hidden in one chunk, inf and -inf in different chunks, near-float32-max terms that cancel across
    chunks."""
    g = generator(seed_of("split specials", op, kind))
    n = 80_000
    x = random_values((3, n), F32, g, spread=10)
    if kind == "-0":
        x[1:] = -0.0
    elif kind == "mixed zeros":
        x[:] = -0.0
        x[1, 70_000] = 0.0
        x[2, 0] = 0.0
    elif kind == "nan":
        x[1, 40_000] = NAN
    elif kind == "inf":
        x[1, 17_000] = INF
        x[2, 79_999] = -INF
    elif kind == "inf-inf":
        x[1, 100] = INF
        x[1, 70_000] = -INF
    else:
        x[:, :n // 2] = 3e38
        x[:, n // 2:] = -3e38
        x[2, 3] = 2.0**-149
    for out_dtype in (None, BF16):
        reduce_op(op, x, [1], False, out_dtype, kind)


def error_bound_row(dtype, stride, per, copies=1):
    """A row on which the fp64 sums of a lane-strided split reach the rounding-error bound the kernel assumes:
    each of `stride` threads (element j * stride + thread) adds +L, then per - 2 copies of t = 1 + 2^(1-p)
    (p: dtype's precision), then -L. Next to L = 2^(54-p) every t loses its lowest bit (a tie, to even: always
    downwards), so each thread's partial is m = per - 2 instead of m t, all in the same direction, while the
    exact sum is stride * m * t: an error of many float32 ulps of the result that tier 1's bound, with the
    kernel's true summation depth, just covers (a depth too small would decide a wrong value)."""
    prec = {F32: 24, BF16: 8}[dtype]
    block = torch.full((per, stride), 1.0 + 2.0 ** (1 - prec), dtype=torch.float64)
    block[0] = 2.0 ** (54 - prec)
    block[-1] = -(2.0 ** (54 - prec))
    return block.reshape(-1).repeat(copies).to(dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=name_of)
def test_sums_at_the_fp64_error_bound(dtype):
    """Tier 1's depth bounds of the warp loops (lanes 32 apart, n / 32 additions each), of the split path's chunk
    blocks (threads 256 apart, 64 additions each) and of the other warp kernels: rows whose fp64 sums are off by
    nearly the bound, so only the exact tiers give the right bits."""
    warp_row = error_bound_row(dtype, 32, 64)  # n = 2048, one warp: 62 lost bits per lane
    chunk_row = error_bound_row(dtype, 256, 64, copies=5)  # 5 chunks of 16 Ki: 62 lost bits per thread
    for name, row in (("warp", warp_row), ("split", chunk_row)):
        for rows in (1, 3):
            x = row.repeat(rows, 1)
            for op in ("sum", "mean"):
                for out_dtype in (None, F32, BF16):
                    reduce_op(op, x, [1], False, out_dtype, f"{name} rows")
    for d in (1, 3, 2048):
        check_op("sum_divided", warp_row, torch.tensor(d), context=f"d={d}")
    for correction in (0, 1):
        check_op("var_mean_rows", warp_row.repeat(3, 1), correction, context=f"correction={correction}")
    w = torch.ones(2048, dtype=dtype)
    check_op("layer_norm", warp_row.repeat(3, 1), [2048], w, None, 0.0, context="mean at the bound")
    check_op("rms_norm", warp_row.repeat(3, 1), [2048], w, None, context="error-bound row")


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype,scale", [(F32, F32, -140), (BF16, BF16, -128), (F16, F16, -20),
                                                      (F32, F16, -20), (F32, F32, 124), (F16, F16, 13),
                                                      (BF16, BF16, 124)], ids=param_id)
def test_subnormal_and_overflowing_results(op, in_dtype, out_dtype, scale):
    g = generator(seed_of("scale", op, in_dtype, out_dtype, scale))
    x = random_values((64, 40), in_dtype, g, spread=2, scale_exp=scale).abs()
    x[::2, :10] = -x[::2, :10]
    reduce_op(op, x, [1], False, out_dtype, f"scale 2^{scale}")


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_strided_and_permuted_inputs(op):
    """Non-contiguous inputs (the op makes rows contiguous before the kernel): any layout, the same bits."""
    g = generator(seed_of("layouts", op))
    base = reduction_values((16, 10, 65), BF16, g, dim=(0, 2))
    for name, v in {"transposed": base.transpose(0, 2), "sliced": base[::2, 1::3],
                    "expanded": base[:, :1].expand(16, 7, 65), "permuted": base.permute(2, 0, 1)}.items():
        for dim in [None, [0], [2], [0, 2], [1, -1]]:
            reduce_op(op, v, dim, False, None, name)


# ====================================================================== round_to


@pytest.mark.parametrize("src", [BF16, F16], ids=name_of)
@pytest.mark.parametrize("dst", DTYPES, ids=name_of)
def test_round_to_every_16_bit_pattern(src, dst):
    """65536 elements: 4 times the emulated grid's 64 blocks of 256 threads (grid-stride loop)."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(src)
    for divisor in (1, 3, 2**32 - 1):
        check_op("round_to", x, dst, divisor, context=f"{src} -> {dst} / {divisor}")


@pytest.mark.parametrize("dst", DTYPES, ids=name_of)
def test_round_to_float32_patterns_and_divisors(dst):
    rng = random.Random(seed_of("round_to", dst))
    vals = finite_bit_patterns(20_000, rng, 0, 255)  # exponent field 255: infinities and NaNs too
    x = torch.tensor(vals, dtype=F32)
    mids = torch.arange(0, 1 << 24, 4099, dtype=torch.int32)  # low 24 bits sweep, at many exponents
    sweep = torch.cat([(mids | (e << 23)) for e in range(0, 256, 9)]
                      + [(mids | (e << 23)) | (1 << 31) for e in (0, 100, 254)])
    for divisor in (1, 2, 3, 10, 2**31 + 1, 2**32 - 1):
        check_op("round_to", x, dst, divisor, context=f"random / {divisor}")
        check_op("round_to", sweep.view(F32), dst, divisor, context=f"sweep / {divisor}")
    check_op("round_to", x.reshape(100, 200).t(), dst, 1, context="2-D strided")
    check_op("round_to", x[:1], dst, 7, context="one element")
    check_op("round_to", x.reshape(100, 200)[:, :0], dst, 1, context="empty", expect_launch=False)


# ====================================================================== sum_divided


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 100, 3000])
def test_sum_divided_random_and_divisors(dtype, n):
    """One warp reduces the vector and reads the divisor from device memory: every kind of divisor (<= 0: NaN,
    above 2^53: the exact tier), random data and data whose sum cancels exactly."""
    g = generator(seed_of("sum_divided", dtype, n))
    x = random_values((n,), dtype, g, spread=spread_for(dtype))
    cancel = x.clone()
    cancel[n // 2 : 2 * (n // 2)] = -cancel[: n // 2]
    for d in (-1, 0, 1, 3, n, 7 * n + 1, 2**31 - 1, 2**53 + 1, 2**62 + 3):
        divisor = torch.tensor(d, dtype=torch.int64)
        check_op("sum_divided", x, divisor, context=f"n={n} d={d}")
        if n >= 2:
            check_op("sum_divided", cancel, divisor, context=f"cancelling n={n} d={d}")
    if n:
        check_op("sum_divided", x.reshape(1, n).expand(3, n), torch.tensor(5), context="2-D expanded")


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_sum_divided_ties_and_specials(dtype):
    rng = random.Random(seed_of("sum_divided ties", dtype))
    rows = tie_rows(dtype, dtype, 12, 40, 0.0, rng, pairs=6) + tie_rows(dtype, dtype, 6, 40, 2.0**-60, rng, pairs=6)
    for i, row in enumerate(rows):
        x = exact_tensor(row, dtype)
        for d in (1, 3, 40):
            check_op("sum_divided", x, torch.tensor(d), context=f"tie row {i} d={d}")
    big = 2.0**100 if dtype != F16 else 2.0**12
    for values in ([-0.0] * 40, [0.0, -0.0] * 20, [-0.0], [1.0, NAN, 2.0], [INF, 1.0], [INF, -INF, 1.0],
                   [big, 3.0, -big, 2.0**-14], [big] * 64 + [-big] * 64 + [1.0]):
        x = torch.tensor(values, dtype=torch.float64).to(dtype)  # exact values
        for d in (1, 2, 2**53 + 1):
            check_op("sum_divided", x, torch.tensor(d), context=f"{values[:4]} d={d}")


# ====================================================================== cumsum_rows


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=param_id)
def test_cumsum_rows_shapes_and_dtypes(in_dtype, out_dtype):
    """One thread per row: few rows, long rows, and more rows (9000) than the emulated grid's 64 blocks of 128
    threads (each thread takes two rows); empty shapes launch nothing."""
    g = generator(seed_of("cumsum", in_dtype, out_dtype))
    for shape in ((1, 1), (3, 7), (9000, 2), (300, 65), (2, 3000), (0, 4), (4, 0)):
        x = random_values(shape, in_dtype, g, spread=spread_for(in_dtype, out_dtype or in_dtype))
        if shape[1] >= 4:
            x[::2, shape[1] // 2 : 2 * (shape[1] // 2)] = -x[::2, : shape[1] // 2].flip(1)  # prefixes back to 0
        check_op("cumsum_rows", x, out_dtype, context=f"{shape}", expect_launch=x.numel() > 0)


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (F32, BF16), (BF16, None), (F16, F32), (BF16, F16)],
                         ids=param_id)
def test_cumsum_rows_ties_specials_and_layouts(in_dtype, out_dtype):
    """Prefixes on ties (the thread's exact accumulator), NaN / inf / signed zeros, strided inputs."""
    rng = random.Random(seed_of("cumsum ties", in_dtype, out_dtype))
    ties = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 32, 48, 0.0, rng), in_dtype)
    check_op("cumsum_rows", ties, out_dtype, context="ties")
    big = 2.0**100 if in_dtype != F16 else 2.0**12
    special = torch.tensor([  # every value exact in each dtype (not exact_tensor: NaN may come out negative)
        [big, 1.0, -big, 3.0, -1.0, 0.5],
        [-0.0, -0.0, 0.0, -0.0, 1.0, -1.0],
        [-0.0, -0.0, -0.0, -0.0, -0.0, -0.0],
        [1.0, NAN, 2.0, 3.0, -INF, 1.0],
        [INF, 1.0, -INF, 2.0, 0.0, 0.0],
        [-INF, -INF, 1.0, 2.0, -0.0, 0.0],
    ], dtype=torch.float64).to(in_dtype)
    check_op("cumsum_rows", special, out_dtype, context="specials")
    wide = random_values((48, 70), in_dtype, generator(seed_of("cumsum wide", in_dtype)))
    for name, view in (("transposed", wide.t()), ("strided", wide[:, ::3]), ("offset", wide[5:, 7:])):
        check_op("cumsum_rows", view, out_dtype, context=name)


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, None), (F16, F32), (F32, BF16)], ids=param_id)
def test_cumsum_rows_long_rows_in_chunks(in_dtype, out_dtype):
    """Rows longer than 256 run in chunks of 64 (cumsum_cuda.cu: chunk sums, a warp's scan of them per row, then
    a thread per chunk from its prefix). The shortest chunked row, rows of 33 / 41 / 313 chunks (one and several
    chunks per lane of the scan), a tie (1 + ulp/2) at every other prefix from the first chunk to the last (each
    chunk's exact accumulator starts from the row's beginning), +inf then -inf then finite values, huge terms
    cancelling, -0 only, and more chunks than the emulated grid's threads: the emulated kernels equal an exact
    oracle (a running integer sum) and the CPU's single thread per row."""
    out = out_dtype or in_dtype
    g = generator(seed_of("cumsum chunks", in_dtype, out_dtype))
    rows = []
    for n in (257, 64 * 33, 64 * 40 + 1, 20000):
        x = random_values((1, n), in_dtype, g, spread=spread_for(in_dtype, out))
        half = n // 2
        x[0, half:2 * half] = -x[0, :half].flip(0)  # the prefixes come back to exactly 0
        rows.append(x[0].double().tolist())
    h = {F32: 2.0**-24, BF16: 2.0**-8, F16: 2.0**-11}[out]  # half an ulp of 1 in the output format
    rows.append([1.0] + [h, -h] * 1300)
    special = random_values((1, 4000), in_dtype, g, spread=spread_for(in_dtype, out))[0].double().tolist()
    special[1000], special[3000] = INF, -INF
    rows.append(special)
    big = 2.0**100 if in_dtype != F16 else 2.0**12
    rows.append([big, -big] * 200 + [1.0] * 7)
    rows.append([-0.0] * 300)
    for values in rows:
        x = torch.tensor([values], dtype=torch.float64).to(in_dtype)
        before = launches()
        got = emulated_ops().cumsum_rows(x, out_dtype)
        assert launches() - before == 3, "the chunked path (3 kernels) should run rows longer than 256"
        assert_bits_equal(got, bits_tensor(prefix_sum_bits(x.double()[0].tolist(), out), out).reshape(1, -1),
                          f"row of {len(values)}: {values[:3]}", dtype=out)
        check_op("cumsum_rows", x, out_dtype, context=f"row of {len(values)}")
    many = random_values((200, 3000), in_dtype, g, spread=spread_for(in_dtype, out))
    check_op("cumsum_rows", many, out_dtype, context="200 rows of 47 chunks (past the grid)")


# ====================================================================== var_mean_rows


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_var_mean_rows(dtype):
    """A warp per row: lengths around the warp size and longer, every kind of correction (divisor 0 and
    n - correction < 0 included), cancelling rows (exact tier of the mean), special rows, empty inputs,
    more rows than the grid holds."""
    for rows, n in ((5, 1), (9, 31), (9, 33), (4, 1000), (3, 5000), (300, 7)):
        x = norm_data(rows, n, dtype, seed_of("var", dtype, n))
        if n >= 2:
            x[::2, n // 2 : 2 * (n // 2)] = -x[::2, : n // 2]  # mean exactly 0 (or the odd last element / n)
        for correction in (0, 1, n, n + 1):
            check_op("var_mean_rows", x, correction, context=f"rows={rows} n={n} correction={correction}")
    x = adversarial_norm_rows(dtype, 64)
    for correction in (0, 1, 64):
        check_op("var_mean_rows", x, correction, context=f"adversarial correction={correction}")
    check_op("var_mean_rows", torch.empty((3, 0), dtype=dtype), 1, context="empty rows")
    check_op("var_mean_rows", torch.empty((0, 5), dtype=dtype), 1, context="no rows", expect_launch=False)
    check_op("var_mean_rows", norm_data(40, 7, dtype, 3).t(), 1, context="strided")


# ====================================================================== mm / addmm / bmm / baddbmm


def tie_matrices(a_dtype, out_dtype, M, K, N, seed, pairs=1, nudge=0.0):
    """a (M, K) whose rows sum to ties of out_dtype, b (K, N) of exact powers of two per column (which keep
    ties ties): every output is undecided by tier 1."""
    rng = random.Random(seed)
    a = exact_tensor(tie_rows(a_dtype, out_dtype, M, K, nudge, rng, pairs=pairs), a_dtype)
    b = exact_tensor([[2.0 ** rng.randint(-2, 2) for _ in range(N)]] * K, rng.choice(DTYPES))
    return a, b


MM_SHAPES = [(1, 1, 1), (3, 5, 7), (2, 1, 40), (8, 0, 5), (0, 4, 3), (5, 4, 0), (17, 33, 9), (33, 257, 65)]


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", DTYPE_COMBOS, ids=param_id)
def test_mm_random_shapes_and_dtypes(a_dtype, b_dtype, out_dtype):
    """K = 0 (the zero-row branch: +0 outputs), K = 1, M or N = 0 (no launch), odd sizes around the warp."""
    g = generator(seed_of("mm", a_dtype, b_dtype, out_dtype))
    for M, K, N in MM_SHAPES:
        a, b = random_values((M, K), a_dtype, g), random_values((K, N), b_dtype, g)
        check_op("mm", a, b, out_dtype, context=f"{M}x{K}x{N}", expect_launch=M * N > 0)


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (BF16, None), (F16, None), (F32, F16)],
                         ids=param_id)
def test_mm_large_k_with_cancellation(dtype, out_dtype):
    """K = 4096 and K = 20000: some rows of a cancel exactly against matching columns of b (tiers 2 and 3,
    split over the warp's lanes)."""
    g = generator(seed_of("bigk", dtype, out_dtype))
    spread = 6 if F16 in (dtype, out_dtype) else 30
    for M, K, N in ((64, 4096, 40), (6, 20_000, 5)):
        a, b = random_values((M, K), dtype, g, spread=spread), random_values((K, N), dtype, g, spread=spread)
        a[::7, K // 2 :] = -a[::7, : K // 2]
        b[K // 2 :, ::2] = b[: K // 2, ::2]
        check_op("mm", a, b, out_dtype, context=f"{M}x{K}x{N}")


@pytest.mark.parametrize("a_dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
@pytest.mark.parametrize("nudge", NUDGES.values(), ids=NUDGES.keys())
def test_mm_all_outputs_ties(a_dtype, out_dtype, nudge):
    """Every output undecided by tier 1: the warps take each pending output in turn (ballot loop)."""
    a, b = tie_matrices(a_dtype, out_dtype, 95, 16, 41, seed=seed_of("mmties", a_dtype, out_dtype, nudge),
                        nudge=nudge)
    check_op("mm", a, b, out_dtype, context="ties")


@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
def test_mm_ties_hidden_in_large_k(out_dtype):
    """K = 4096: a tie spread over a row with ~2000 cancelling pairs."""
    a, b = tie_matrices(F32, out_dtype, 16, 4096, 24, seed=seed_of("mmbigk", out_dtype), pairs=2040)
    check_op("mm", a, b, out_dtype, context="large-K ties")


@pytest.mark.parametrize("out_dtype", DTYPES, ids=name_of)
def test_mm_many_outputs_and_mixed_pending(out_dtype):
    """More outputs (10000) than 64 blocks of 128 threads; integer matrices whose products are often ties, so
    warps mix decided and pending lanes; some outputs of a bias-free row exact zeros."""
    g = generator(seed_of("mmmany", out_dtype))
    bits = {F32: 12, BF16: 4, F16: 6}[out_dtype]
    a = torch.randint(-(2**bits), 2**bits, (100, 6), generator=g).float()
    b = torch.randint(-(2**bits), 2**bits, (6, 100), generator=g).float()
    a[3] = 0.0
    check_op("mm", a, b, out_dtype, context="integer ties")
    check_op("mm", a.to(BF16) if out_dtype != F32 else a, b, out_dtype, context="integer ties, bf16 a")


def test_mm_special_values_and_signed_zeros():
    rng = random.Random(seed_of("mm specials"))
    a = torch.tensor([[rng.choice(SPECIALS) for _ in range(5)] for _ in range(40)], dtype=F32)
    b = torch.tensor([[rng.choice(SPECIALS) for _ in range(33)] for _ in range(5)], dtype=F32)
    bias = torch.tensor([rng.choice(SPECIALS) for _ in range(33)], dtype=F32)
    zeros_a = torch.tensor([[rng.choice([0.0, -0.0]) for _ in range(3)] for _ in range(40)])
    zeros_a[:4] = -0.0
    zeros_a[4:8] = 0.0
    zeros_b = torch.tensor([[rng.choice([0.0, -0.0, 1.0, -1.0]) for _ in range(33)] for _ in range(3)])
    zeros_b[:, :4] = -1.0
    zeros_b[:, 4:8] = torch.tensor([1.0, -0.0, 1.0])[:, None]
    for out_dtype in DTYPES:
        check_op("mm", a, b, out_dtype, context="specials")
        check_op("addmm", bias, a, b, out_dtype, context="specials + bias")
        check_op("mm", zeros_a, zeros_b, out_dtype, context="signed zeros")
        for z in (torch.tensor(-0.0), torch.tensor(0.0), torch.full((40, 1), -0.0)):
            check_op("addmm", z, zeros_a, zeros_b, out_dtype, context=f"signed zeros + bias {tuple(z.shape)}")
        check_op("addmm", torch.full((33,), -0.0), torch.zeros(40, 0), torch.zeros(0, 33), out_dtype,
                 context="K = 0, bias -0")


@pytest.mark.parametrize("in_dtype,out_dtype,scale_exp", [(F32, F32, -70), (BF16, BF16, -64), (F16, F16, -10),
                                                          (F32, F16, -10), (F32, BF16, -75)],
                         ids=param_id)
def test_mm_subnormal_and_overflowing_results(in_dtype, out_dtype, scale_exp):
    g = generator(seed_of("mmscale", in_dtype, out_dtype, scale_exp))
    tiny_a = random_values((40, 24), in_dtype, g, spread=3, scale_exp=scale_exp)
    tiny_b = random_values((24, 40), in_dtype, g, spread=3, scale_exp=scale_exp)
    big_exp = {F32: 63, BF16: 63, F16: 7}[in_dtype]
    big_a = random_values((40, 24), in_dtype, g, spread=1, scale_exp=big_exp)
    big_b = random_values((24, 40), in_dtype, g, spread=1, scale_exp=big_exp)
    check_op("mm", tiny_a, tiny_b, out_dtype, context="tiny")
    check_op("mm", big_a, big_b, out_dtype, context="big")


@pytest.mark.parametrize("bias_shape", [None, (6,), (4, 6), (4, 1), (1, 6), (), (3, 1, 6), (1, 4, 1), (3, 4, 6)],
                         ids=str)
@pytest.mark.parametrize("dtype,bias_dtype,out_dtype", [(F32, F32, None), (BF16, F32, F32), (F16, BF16, BF16),
                                                        (BF16, BF16, F16)], ids=param_id)
def test_bmm_baddbmm_addmm_bias_shapes(bias_shape, dtype, bias_dtype, out_dtype):
    """Every broadcastable bias shape (expanded with stride 0 in the kernel's view); one batch cancels exactly,
    so its outputs are the bias (or exact zeros) through the exact tier."""
    g = generator(seed_of("bmm", bias_shape, dtype, out_dtype))
    a, b = random_values((3, 4, 300), dtype, g), random_values((3, 300, 6), dtype, g)
    a[1, :, 150:] = -a[1, :, :150]
    b[1, 150:] = b[1, :150]
    if bias_shape is None:
        check_op("bmm", a, b, out_dtype, context="bmm")
        check_op("mm", a[0], b[0], out_dtype, context="mm of batch 0")
        check_op("bmm", a[:, :, :0], b[:, :0, :], out_dtype, context="bmm K = 0")
        check_op("bmm", a[:0], b[:0], out_dtype, context="bmm B = 0", expect_launch=False)
        return
    bias = random_values(bias_shape, bias_dtype, g)
    check_op("baddbmm", bias, a, b, out_dtype, context="baddbmm")
    check_op("baddbmm", bias, a[:, :, :1], b[:, :1], out_dtype, context="baddbmm K = 1")
    check_op("baddbmm", bias, a[:, :, :0], b[:, :0], out_dtype, context="baddbmm K = 0: the bias")
    if len(bias_shape) <= 2:
        check_op("addmm", bias, a[1], b[1], out_dtype, context="addmm, cancelling batch")
        check_op("addmm", bias, a[2], b[2], out_dtype, context="addmm")


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None)], ids=param_id)
def test_bmm_layouts_and_many_batches(dtype, out_dtype):
    """Transposed and expanded (stride 0, a broadcast b) operands; 300 batches of small products (more outputs
    than the grid: the batch index of the grid-stride loop); ties in batches with a bias."""
    g = generator(seed_of("bmm layouts", dtype, out_dtype))
    A = random_values((240, 64), dtype, g)
    Bm = random_values((64, 48), dtype, g)
    a3, b3 = A.reshape(5, 48, 64), Bm[None].expand(5, -1, -1)
    check_op("bmm", a3, b3, out_dtype, context="expanded b")
    check_op("bmm", a3.transpose(1, 2).contiguous().transpose(1, 2), b3.transpose(1, 2).contiguous().transpose(1, 2),
             out_dtype, context="transposed layouts")
    check_op("mm", A.t().contiguous().t(), Bm, out_dtype, context="mm transposed a")
    many_a, many_b = random_values((300, 7, 5), dtype, g), random_values((300, 5, 9), dtype, g)
    check_op("bmm", many_a, many_b, out_dtype, context="300 batches")
    check_op("baddbmm", random_values((9,), dtype, g), many_a, many_b, out_dtype, context="300 batches + bias")
    wide_a, wide_b = random_values((3, 20, 90), dtype, g), random_values((3, 90, 50), dtype, g)
    check_op("bmm", wide_a[:, ::2, ::3], wide_b[:, ::3, ::2], out_dtype,
             context="strided slices (neither rows nor k contiguous: the general widening)")
    check_op("bmm", wide_a.transpose(1, 2), wide_b[:, :20, :], out_dtype,
             context="column-major a and b's columns (the tiled widening; 90 and 50 rows, k = 20)")
    ta, tb = tie_matrices(dtype, out_dtype or dtype, 40, 16, 10, seed=seed_of("bmm ties", dtype), nudge=0.0)
    check_op("baddbmm", torch.zeros(4, 1, 10, dtype=dtype), ta.reshape(4, 10, 16), tb[None].expand(4, -1, -1),
             out_dtype, context="ties + zero bias")


def matmul_launches(B, M, N, K, budget_doubles):
    """Kernels the device matmul launches with CARBON_CUDA_MATMUL_SCRATCH_BYTES = 8 * budget_doubles, derived
    from the slicing rule of matmul_into (csrc/matmul/matmul.cpp): whole batches while batch's fp64 scratch
    (M N + M K + N K doubles) fits, else one batch's rows, enough for (N + K) doubles each beside N K; per chunk
    one widening launch (fp64 copy and row statistics) for b, per slice one for a and one rounding launch."""
    per_batch = M * N + M * K + N * K
    batches = min(max(budget_doubles // per_batch, 1), B)
    rows = M if batches > 1 or per_batch <= budget_doubles else min(max((budget_doubles - N * K) // (N + K), 1), M)
    chunks, slices = -(-B // batches), -(-M // rows)
    return chunks * (1 + 2 * slices)


@pytest.mark.parametrize("budget", ["2 batches", "5 rows", "1 row", "unsliced"])
@pytest.mark.parametrize("bias_shape", [None, (19,), (37, 1), (5, 1, 19), (5, 37, 19)], ids=str)
def test_bmm_in_bounded_device_scratch(monkeypatch, budget, bias_shape):
    """The device path holds at most CARBON_CUDA_MATMUL_SCRATCH_BYTES of fp64 scratch (2 GiB by default): whole
    batches at a time, or one batch's rows in slices. Tiny budgets slice these small products the way a large
    one is sliced on a GPU: same bits as the CPU (which slices by its own rule), and the launches the rule
    predicts (so the slicing really happened). Ties in some rows send outputs of several slices to the exact
    tier."""
    B, M, N, K = 5, 37, 19, 23
    per_batch = M * N + M * K + N * K
    doubles = {"2 batches": 2 * per_batch + 5, "5 rows": N * K + 5 * (N + K), "1 row": 1,
               "unsliced": B * per_batch}[budget]
    monkeypatch.setenv("CARBON_CUDA_MATMUL_SCRATCH_BYTES", str(8 * doubles))
    g = generator(seed_of("bmm scratch", budget, bias_shape))
    a, b = random_values((B, M, K), F32, g), random_values((B, K, N), F32, g)
    a[2, 10:20, 12:] = -a[2, 10:20, 1:12]  # cancelling rows: their outputs are the bias through the exact tier
    b[2, 12:] = b[2, 1:12]
    before = launches()
    if bias_shape is None:
        check_op("bmm", a, b, None, context=budget)
    else:
        check_op("baddbmm", random_values(bias_shape, F32, g), a, b, BF16, context=budget)
    assert launches() - before == matmul_launches(B, M, N, K, doubles), "the slicing the budget implies"
    check_op("mm", a[3], b[3], F16, context=f"mm, {budget}")


# ====================================================================== layer_norm / rms_norm / norm_backward

# dx alone (norm_backward_kernel), the parameter gradients alone (on the device: the column kernels of
# column_sums.cuh over dy * xhat and dy; test_cuda_emulated_columns.py has their own cases), all three (on the
# CPU: the fused pass), dw alone.
ALL_MASKS = ([True, False, False], [False, True, True], [True, True, True], [False, True, False])


def check_norm_case(x, ns, w, b, dy, eps_list=(1e-5, 0.0), masks=None, context=""):
    """layer_norm and rms_norm forward, and norm_backward of each, emulated vs CPU."""
    rows = x.numel() // max(1, math.prod(ns))
    launched = rows > 0 and math.prod(ns) > 0  # no rows or empty rows: nothing to launch
    masks = ALL_MASKS if masks is None else masks
    for eps in eps_list:
        y, mean, rstd = check_op("layer_norm", x, list(ns), w, b, eps, context=f"{context} eps={eps}",
                                 expect_launch=launched)
        for mask in masks:
            check_op("norm_backward", dy, x, list(ns), mean, rstd, w, mask,
                     context=f"layer_norm {context} eps={eps} mask={mask}", expect_launch=launched)
        _, rrstd = check_op("rms_norm", x, list(ns), w, eps, context=f"{context} eps={eps}", expect_launch=launched)
        for mask in masks:
            check_op("norm_backward", dy, x, list(ns), None, rrstd, w, mask,
                     context=f"rms_norm {context} eps={eps} mask={mask}", expect_launch=launched)
    check_op("rms_norm", x, list(ns), w, None, context=f"{context} default eps", expect_launch=launched)


# The row cache (dynamic shared memory) holds 4 rows of n floats: n <= 1536 within the default 24 KB, n <= 4096
# with the opt-in 64 KB, longer rows re-read from global memory.
@pytest.mark.parametrize("n", (1, 2, 7, 33, 64, 768, 1536, 1537, 4096, 4097, 6000))
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_forward_and_backward_row_lengths(dtype, n):
    rows = 33 if n <= 1000 else 6
    x = norm_data(rows, n, dtype, seed_of("norm", n))
    w, b = params((n,), dtype, "both", seed_of("norm", n))
    dy = random_values((rows, n), dtype, generator(seed_of("norm dy", n)), spread=2)
    check_norm_case(x, (n,), w, b, dy, context=f"n={n}")


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_affine_and_many_rows(dtype, affine):
    """Weight / bias present or absent; 300 rows (more than 64 blocks of 4 warps: grid-stride loop), a cached
    and (without or with both parameters) an uncached row length."""
    for rows, n in ((300, 24), (260, 4500)) if affine in ("none", "both") else ((300, 24),):
        x = norm_data(rows, n, dtype, seed_of("affine", n))
        w, b = params((n,), dtype, affine, seed_of("affine", n))
        dy = random_values((rows, n), dtype, generator(seed_of("affine dy", n)), spread=2)
        check_norm_case(x, (n,), w, b, dy, eps_list=(1e-5,), masks=ALL_MASKS[:3],
                        context=f"{affine} n={n}")


@pytest.mark.parametrize("n", (8, 64, 2048, 8192))
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_adversarial_rows(dtype, n):
    """The exact tiers of the mean, the variance and the mean of squares, and special values, in rows cached in
    the default and the opt-in shared memory and in uncached rows; the backward with an upstream gradient whose
    row sums cancel exactly (exact tiers of both row sums)."""
    x = adversarial_norm_rows(dtype, n)
    dy = random_values(tuple(x.shape), dtype, generator(seed_of("adv dy", dtype, n)), spread=1)
    dy[::2, n // 2 : 2 * (n // 2)] = -dy[::2, : n // 2]
    for affine in ("none", "both"):
        w, b = params((n,), dtype, affine, seed_of("adv", n))
        check_norm_case(x, (n,), w, b, dy, masks=ALL_MASKS[:3],
                        context=f"adversarial {affine}")


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_backward_cancelling_gradients(dtype):
    """Upstream gradients that are constant along each row (sum(g * xhat) cancels to nearly 0) or cancel
    exactly (sum g = 0): A and B through the warp's exact accumulator, cached and long rows."""
    for rows, n in ((9, 40), (5, 1700), (3, 4200)):
        x = norm_data(rows, n, dtype, seed_of("bwd", dtype, n))
        w, _ = params((n,), dtype, "weight", seed_of("bwd", n))
        dy = random_values((rows, n), dtype, generator(seed_of("bwd dy", dtype, n)), spread=1)
        dy[0] = 1.0
        dy[1, n // 2 : 2 * (n // 2)] = -dy[1, : n // 2]
        dy[2] = 0.0
        for weight in (None, w):
            _, mean, rstd = torch.ops.carbon.layer_norm(x, [n], weight, None, 1e-5)
            _, rrstd = torch.ops.carbon.rms_norm(x, [n], weight, None)
            for mask in ALL_MASKS:
                check_op("norm_backward", dy, x, [n], mean, rstd, weight, mask, context=f"ln n={n} {mask}")
                check_op("norm_backward", dy, x, [n], None, rrstd, weight, mask, context=f"rms n={n} {mask}")


@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_norm_empty_one_element_strided_and_multi_dim(dtype):
    """No rows and empty rows (nothing launched), one element, strided x / dy / weight / bias, a normalized
    shape of two dimensions, leading batch dimensions."""
    for rows, n in ((0, 16), (4, 0), (0, 0)):
        x = torch.empty((rows, n), dtype=dtype)
        w, b = params((n,), dtype, "both", 1)
        check_norm_case(x, (n,), w, b, torch.empty((rows, n), dtype=dtype), eps_list=(1e-5,),
                        context=f"empty rows={rows} n={n}")
    one = exact_tensor([[1.5]], dtype)
    check_norm_case(one, (1,), exact_tensor([2.0], dtype), exact_tensor([-1.0], dtype), exact_tensor([[3.0]], dtype),
                    context="one element")
    x = norm_data(96, 6, dtype, 21).t()  # (6, 96), not contiguous
    dy = random_values((96, 6), dtype, generator(22), spread=2).t()
    w2, b2 = params((192,), dtype, "both", 23)
    check_norm_case(x, (96,), w2[::2], b2[1::2], dy, eps_list=(1e-5,), context="strided")
    x4 = norm_data(12, 40, dtype, 24).reshape(2, 6, 8, 5)
    w4, b4 = params((8, 5), dtype, "both", 25)
    dy4 = random_values((2, 6, 8, 5), dtype, generator(26), spread=2)
    check_norm_case(x4, (8, 5), w4, b4, dy4, eps_list=(1e-5,), context="two normalized dims")
