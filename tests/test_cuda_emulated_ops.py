"""Carbon's CUDA kernels of softmax / log_softmax / cross-entropy, attention, the elementwise math (float32,
bfloat16, float16 and the float64 kernels), pow and the two-argument functions, the random draws, the indexed
accumulations and the optimizers, run on the CPU emulator (tests/cuda_emulator/, torch.ops.carbon_emu), return
the same bits as Carbon's CPU kernels (torch.ops.carbon). This is the emulated twin of test_softmax_cuda.py,
test_attention_cuda.py, test_elementwise*_cuda.py, test_two_argument_cuda.py, test_random_cuda.py,
test_scatter_cuda.py and test_optim_cuda.py, so the .cu files are checked on machines without a GPU.

Both sides compute the contract's one result, but by different code: the CPU's vectorized loops, chains and
fast roundings against the GPU's block-per-row kernels (shared-memory trees, a block-wide barrier-OR, thread 0
finishing undecided rows exactly), grid-stride loops, per-element kernels over the shared cores, and device
reads of state that the CPU reads on the host. So the cases target what can go wrong in CUDA code only:
- every dtype (and output dtype), empty inputs (nothing launched) and one-element ones;
- rows short (1..64) and long (past a 256-thread block, up to 50257 classes), and more rows / elements than
  the emulated grid holds (2 SMs: blocks_for caps grids at 64 blocks, so > 64 rows or > 16384 elements make
  the grid-stride loops take several turns, each block reusing its shared scratch row after row);
- rows whose exact sum is a float32 (or output-format) tie, so tier 1 stays undecided and thread 0 finishes
  the row with the exact tiers while the block waits; rows of +-0 gradients (the barrier-OR zero path);
- NaN, +-inf, -inf masks, fully masked rows, signed zeros, subnormal and overflowing results;
- every bit pattern of float16 / bfloat16 and random float32 patterns for the elementwise cores; float64;
- random draws at several seeds, offsets and sizes that cut Philox's 4-word (2 for normal) blocks, trunc_normal's
  clamping fallback, the .state overloads (the state read by the kernel from device memory);
- heavily duplicated and skewed indices (thousands of contributions to one destination), padding_idx, int32
  and strided indices, and the CUDA-only contract of out-of-range indices (ignored) and targets (NaN);
- optimizer steps with weight decay (L2 / decoupled), maximize, AMSGrad, momentum / dampening / nesterov,
  capturable steps with t and lr read on the device, several tensors of different sizes and dtypes, the sum
  of squares over many chunks and its exact tier, clipping above / below the maximum norm.
The emulator shuffles the order of each block's fibers between barriers, so a missing barrier or a race shows
up as a changed result here."""

from __future__ import annotations

import functools
import math
import random
import struct

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)
from data import BF16, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, generator, random_values, seed_of, softmax_tie_rows
from emulated import assert_same, check_op, emulated_ops, launches
from optim_util import wide_values
from oracle import assert_bits_equal
from philox_reference import words as philox_words
from scatter_reference import index_add_bits

INF, NAN = math.inf, math.nan
CPU = torch.device("cpu")  # the emulated library treats CPU tensors as device tensors
BITS = {F32: torch.int32, BF16: torch.int16, F16: torch.int16}


def name_of(dtype):
    return "none" if dtype is None else str(dtype).replace("torch.", "")


def values(shape, dtype, g, wide=False):
    """Random values, of a wide exponent range (not for float16) or a narrow one."""
    return random_values(shape, dtype, g, spread=20 if wide and dtype != F16 else 3)


# NaNs other than the canonical one (negative, signalling, other payloads), as bit patterns: every result
# that is NaN must come out as the format's one NaN on both sides.
NAN_PATTERNS = {F32: [-1, 0x7F800001, -(1 << 32) + 0xFFC00000, 0x7FC12345],
                BF16: [-1, 0x7F81, -(1 << 16) + 0xFFC0, 0x7FC5], F16: [-1, 0x7C01, -(1 << 16) + 0xFE00, 0x7E05]}


def put_nans(t: torch.Tensor, positions) -> torch.Tensor:
    """t with NaNs of other payloads written at the given flat positions (in place; t contiguous)."""
    flat = t.view(-1).view(BITS[t.dtype])
    patterns = NAN_PATTERNS[t.dtype]
    for k, pos in enumerate(positions):
        flat[pos] = patterns[k % len(patterns)]
    return t


def as_int(t):
    """The bit patterns of t as nonnegative int64."""
    return t.contiguous().view(BITS[t.dtype]).to(torch.int64) & ((1 << (8 * t.element_size())) - 1)


def ulp(x: float, dtype) -> float:
    """The spacing of `dtype`'s values at x (x a normal value of dtype)."""
    precision = {F32: 24, BF16: 8, F16: 11}[dtype]
    return math.ldexp(1.0, math.frexp(x)[1] - precision)


# ====================================================================== softmax, log_softmax, their gradients

SOFTMAX_OPS = ("softmax", "log_softmax")
BACKWARD_OF = {"softmax": "softmax_backward", "log_softmax": "log_softmax_backward"}


def softmax_both(op, x, dim, out_dtype, grad, context):
    """The forward emulated vs CPU, then the backward of the CPU's output with `grad` (of the output's dtype)."""
    ctx = f"{tuple(x.shape)} dim={dim} {name_of(x.dtype)}->{name_of(out_dtype)} {context}"
    y = check_op(op, x, dim, out_dtype, context=ctx, expect_launch=x.numel() > 0)
    check_op(BACKWARD_OF[op], grad, y, dim, x.dtype, context="backward " + ctx, expect_launch=x.numel() > 0)
    return y


# Row lengths around the warp and the 256-thread block, long rows (GPT-2's 50257 classes), more rows than the
# 64 blocks of the emulated grid (so each block loops over rows), other dims, empty tensors. The costly ones
# (the emulator's time goes with rows x block barriers) for the default output dtype only.
SHAPES = [((1, 1), 1), ((3, 7), 1), ((2, 33), -1), ((4, 256), 1), ((3, 257), 1), ((2, 1000), 1), ((1, 4099), 1),
          ((2, 3, 4), 0), ((5, 6, 7), 1), ((0, 5), 1), ((5, 0), 1), ((), 0)]
COSTLY_SHAPES = [((2, 50257), 1), ((70, 33), 1), ((33, 70), 0)]


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_softmax_rows_every_length_and_dtype(op, in_dtype, out_dtype):
    """Random rows of every length class and both value ranges, forward into every output dtype, and the
    gradient of the CPU's output (float32 / bfloat16 / float16 gradients into the input's dtype)."""
    g = generator(seed_of("softmax rows", op, in_dtype, out_dtype))
    for shape, dim in SHAPES + (COSTLY_SHAPES if out_dtype is None else []):
        for wide in (False, True):
            if wide and (shape, dim) in COSTLY_SHAPES:
                continue
            x = values(shape, in_dtype, g, wide)
            grad = values(shape, out_dtype or in_dtype, g)
            softmax_both(op, x, dim, out_dtype, grad, f"wide={wide}")


def special_rows(dtype):
    sub = 2.0**-130 if dtype != F16 else 2.0**-24  # a subnormal of the dtype
    rows = [
        [sub, -sub, 0.0, -INF], [sub, 3 * sub, -0.0, 0.0],
        [1.0, 2.0, -INF, 0.5], [-INF] * 4, [-INF, 3.0, -INF, -INF], [1.0, NAN, 2.0, 3.0], [INF, 1.0, 2.0, 3.0],
        [-INF, INF, -INF, 0.0], [NAN, -INF, -INF, -INF], [0.0, -0.0, 0.0, -0.0], [49152.0, -49152.0, 1.0, -INF],
        [2.0**-24, -(2.0**-24), 2.0**-14, -INF], [-INF, -INF, -INF, 2.0**-24], [-0.0, -INF, -INF, -INF],
    ]
    nan = torch.tensor(rows).isnan()
    return exact_tensor([[0.0 if v != v else v for v in r] for r in rows], dtype).masked_fill(nan, NAN)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_masked_and_special_rows(op, dtype):
    """Masked (-inf), NaN and +inf entries, fully masked rows, signed zeros, in short rows and in long rows
    spread over many blocks' grid-stride turns (the early return of non-normal rows, row after row)."""
    g = generator(seed_of("softmax specials", op, dtype))
    x = special_rows(dtype)
    big = values((130, 600), dtype, g)
    big[::3, 300:] = -INF  # half-masked long rows
    big[7] = -INF  # fully masked long rows between normal ones
    big[8] = -INF
    big[11, 5] = NAN
    big[13, 599] = INF
    big[17, :599] = -INF  # one entry left
    big[64:66] = -INF  # masked rows at the first grid-stride turn
    put_nans(big, [19 * 600 + 7, 67 * 600 + 500])  # NaNs of other payloads: canonical NaN rows
    for t, dim, outs in ((x, 1, (None, F32, BF16)), (x.t(), 0, (None,)), (big, 1, (None,))):
        for out_dtype in outs:
            grad = values(t.shape, out_dtype or dtype, g)
            grad.view(-1)[0] = INF
            grad.view(-1)[5] = NAN
            softmax_both(op, t, dim, out_dtype, grad, "specials")


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_sums_on_float32_ties(op, dtype):
    """Rows whose sum S is exactly a float32 tie (thread 0's exact tiers), more of them than blocks."""
    x = torch.cat([softmax_tie_rows(dtype), softmax_tie_rows(dtype).flip(0)])
    assert x.shape[0] > 64  # several rows per block
    check_op(op, x, 1, None, context=f"ties {name_of(dtype)}")
    half = x[::5]
    check_op(op, half, 1, F32, context=f"ties {name_of(dtype)}->float32")
    # the same rows shuffled within each row (the tie's terms held by other threads)
    g = generator(seed_of("tie shuffle", op, dtype))
    perm = torch.rand(half.shape, generator=g).argsort(dim=1)
    check_op(op, half.gather(1, perm), 1, None, context="shuffled ties")


def backward_tie_rows(dtype, n):
    """(grad, y) rows of n entries whose gradient sum (G = sum g, D = sum g y) is exactly a float32 tie, or
    a tie hidden under cancelling terms (tier 1's bound then spans many ulps), or just off a tie."""
    big = 2.0**14 if dtype == F16 else 2.0**40
    tiny = 2.0**-24
    half = tiny / 2 if dtype != F16 else tiny  # (float16's least subnormal is 2^-24)
    patterns = [
        [1.0, tiny], [1.0, tiny, big, -big], [1.0, -half, -half, big, -big, big, -big],
        [-1.0, -tiny], [3.0, 3 * tiny], [1.0, tiny, 2.0**-20 if dtype != F16 else 2.0**-14],
        [big, -big], [1.0, -1.0], [tiny, -tiny],
    ]
    rng = random.Random(seed_of("backward ties", dtype, n))
    g_rows = []
    for p in patterns:
        row = p + [0.0] * (n - len(p))
        rng.shuffle(row)
        g_rows.append(row)
    grad = exact_tensor(g_rows, dtype)
    y = torch.ones(grad.shape, dtype=dtype)
    return grad, y


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward_sums_on_ties(op, dtype):
    """The gradient's row sum on a float32 tie (tier 1 undecided, thread 0 exact) in short and long rows."""
    for n in (7, 300, 3000):
        grad, y = backward_tie_rows(dtype, n)
        for out_dtype in (dtype, F32):
            check_op(BACKWARD_OF[op], grad, y, 1, out_dtype, context=f"ties n={n} -> {name_of(out_dtype)}")


# Many short rows (n <= 1024, at least 32 rows per SM: 64 on the emulated 2 SMs) take a warp per row
# (softmax_cuda.cu's warp kernels); fewer or longer rows a block per row.
@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_warp_rows_and_their_boundaries(op, dtype):
    """The same rows on both sides of the kernels' boundaries -- 63 and 64 rows, n = 1024 and 1025 -- with
    masked, special and random rows; float32 ties (S and the gradient sums undecided by tier 1: the warp's exact
    tiers) in 72 rows."""
    g = generator(seed_of("warp rows", op, dtype))
    for n in (1, 31, 32, 33, 100, 1024, 1025):
        x = values((64, n), dtype, g, wide=n % 2 == 1)
        x[3] = -INF
        x[5, n // 2] = NAN
        x[6, 0] = INF
        x[7, : n - 1] = -INF
        for rows in (63, 64):
            grad = values((rows, n), dtype, g)
            grad[2] = -0.0
            softmax_both(op, x[:rows], 1, None, grad, f"{rows} rows of {n}")
    ties = softmax_tie_rows(dtype)
    ties = ties.repeat(-(-72 // ties.shape[0]), 1)[:72]
    check_op(op, ties, 1, None, context=f"72 tie rows {name_of(dtype)}")
    for n in (7, 300):
        grad, y = backward_tie_rows(dtype, n)
        reps = -(-72 // grad.shape[0])
        check_op(BACKWARD_OF[op], grad.repeat(reps, 1), y.repeat(reps, 1), 1, F32, context=f"72 tie rows n={n}")


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", (F32, BF16))
def test_softmax_backward_rows_without_gradient(op, dtype):
    """Rows of +-0 gradient (padded positions) take the block-wide barrier-OR zero test: the CPU's bits,
    signs of zero too (-0 iff every term is -0), also for more rows than blocks."""
    g = generator(seed_of("zero rows", op, dtype))
    for rows, n in ((6, 3000), (70, 40)):
        x = values((rows, n), dtype, g)
        y = torch.ops.carbon.softmax(x, 1, None) if op == "softmax" else torch.ops.carbon.log_softmax(x, 1, None)
        grad = values((rows, n), dtype, g)
        grad[1:5] = 0.0
        grad[2] = -0.0
        grad[3, ::3] = -0.0
        grad[4] = -grad[4]  # -(+0) = -0
        grad[5, 0] = -(2.0**-24)  # one nonzero term among zeros
        grad[66:69] = -0.0
        check_op(BACKWARD_OF[op], grad, y, 1, dtype, context=f"zero rows {rows}x{n}")
        neg = torch.full((rows, n), -0.0, dtype=dtype)
        check_op(BACKWARD_OF[op], neg, -y if op == "softmax" else y, 1, dtype, context="every term -0")


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_masked_rows_nan(op, dtype):
    """masked_rows_nan=True (carbon.enable's _softmax / _log_softmax): fully masked rows are NaN in the warp
    kernel (64 rows on the emulated 2 SMs) and in the block kernel (63 rows, and rows of 1025)."""
    g = generator(seed_of("masked nan", op, dtype))
    for rows, n in ((64, 40), (63, 40), (3, 1025)):
        x = values((rows, n), dtype, g)
        x[1] = -INF
        x[2, 1:] = -INF
        x[0, 3] = NAN
        check_op(op, x, 1, None, True, context=f"{rows} rows of {n}")


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_values_of_every_magnitude_and_subnormal_outputs(op):
    """Rows spanning float32's whole range (exp underflows to subnormals and zero), outputs into float16 /
    bfloat16 (subnormal and zero results of the final rounding)."""
    rng = random.Random(seed_of("magnitudes", op))
    rows = []
    for _ in range(40):
        rows.append([rng.uniform(-120.0, 0.0) for _ in range(50)])
    x = torch.tensor(rows, dtype=F32)
    x[::4, 0] = 80.0
    for out_dtype in (None, BF16, F16):
        grad = random_values(x.shape, out_dtype or F32, generator(3), spread=10 if out_dtype != F16 else 3)
        softmax_both(op, x, 1, out_dtype, grad, "magnitudes")


# ====================================================================== cross-entropy

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def ce_both(x, t, reduction, ignore_index, eps, grad_seed, out_dtype=None, context=""):
    """cross_entropy emulated vs CPU (loss, log_probs, count), then its backward from the CPU's outputs."""
    ctx = f"{tuple(x.shape)} {name_of(x.dtype)} red={reduction} ignore={ignore_index} eps={eps} {context}"
    loss, log_probs, count = check_op("cross_entropy", x, t, reduction, ignore_index, eps, context=ctx)
    grad = random_values(loss.shape, loss.dtype, generator(grad_seed), spread=2)
    check_op("cross_entropy_backward", grad, log_probs, t, count, reduction, ignore_index, eps,
             out_dtype or x.dtype, context="backward " + ctx, expect_launch=log_probs.numel() > 0)
    return loss


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_rows_classes_and_smoothing(dtype, reduction):
    """One class to 50257 classes, more rows than blocks and than the reduction's 256 threads, ignored rows,
    fully masked rows and masked entries, label smoothing 0 / 0.1 / 1; forward and backward."""
    g = generator(seed_of("cross_entropy", dtype, reduction))
    red = REDUCTIONS[reduction]
    for N, C in ((1, 1), (7, 13), (70, 257), (3, 50257), (300, 10)):
        x = values((N, C), dtype, g)
        t = torch.randint(0, C, (N,), generator=g)
        t[:: max(1, N // 3)] = -100
        if N > 1:
            x[1, :] = -INF if C > 1 else 0.0  # a fully masked row: loss +inf (short batches), ignored (long ones)
            t[1] = -100 if N > 7 else t[1]
            x[N - 1, 0] = -INF
        for eps in ((0.0, 0.1, 1.0) if N < 50 else (0.1,)):
            ce_both(x, t, red, -100, eps, seed_of(N, C, eps), context=f"N={N} C={C}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_ignore_index_specials_and_empty(dtype):
    """NaN (any payload) and +inf rows, masked targets, ignore_index -100 / 0 / 8 / -1, every row ignored
    (mean NaN, count 0), incoming gradients 0, -0, inf, NaN, no rows at all, one element."""
    g = generator(seed_of("ce specials", dtype))
    N, C = 12, 9
    x = values((N, C), dtype, g)
    x[2, 3] = NAN  # a NaN row
    x[3, 0] = INF  # a +inf row (NaN too)
    x[4, :] = -INF  # fully masked, target in it: +inf loss
    x[5, 1:] = -INF  # only the target left: loss +0
    x[6, 2] = -INF  # the target masked: +inf loss
    x[7] = 0.0
    put_nans(x, [2 * C + 3, 3 * C + 5])  # NaN rows with other payloads
    t = torch.tensor([0, 1, 2, 3, 4, 0, 2, 5, 8, 8, 0, 7])
    for red in (0, 1, 2):
        for eps in (0.0, 0.3):
            for ignore in (-100, 0, 8, -1):
                ce_both(x, t, red, ignore, eps, seed_of("s", red, eps, ignore), context="specials")
            finite = x[8:]  # without the NaN / inf rows
            ce_both(finite, t[8:], red, 8, eps, 5, context="finite rows")
            ce_both(finite, torch.full((4,), 8), red, 8, eps, 6, context="all ignored")  # mean: NaN, count 0
    loss, log_probs, count = check_op("cross_entropy", x, t, 0, 8, 0.3, context="for special gradients")
    grad = exact_tensor([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 2.0**-14, 0.5, -0.0, 3.0, 0.0], dtype)
    for out_dtype in DTYPES:
        check_op("cross_entropy_backward", grad, log_probs, t, count, 0, 8, 0.3, out_dtype,
                 context=f"special incoming gradients -> {name_of(out_dtype)}")
    for g0 in (0.0, -0.0, INF, NAN, -3.0):
        for red in (1, 2):
            loss, log_probs, count = check_op("cross_entropy", x[8:], t[8:], red, 8, 0.0, context="scalar loss")
            check_op("cross_entropy_backward", torch.tensor(g0, dtype=dtype), log_probs, t[8:], count, red, 8, 0.0,
                     dtype, context=f"incoming gradient {g0} reduction {red}")
    for red in (0, 1, 2):  # no rows: only the reduction kernel runs (sum +0, mean NaN)
        loss, lp, count = check_op("cross_entropy", torch.empty((0, 5), dtype=dtype), torch.empty(0, dtype=torch.long),
                                   red, -100, 0.1, context="N=0")
        check_op("cross_entropy_backward", torch.ones(loss.shape, dtype=dtype), lp, torch.empty(0, dtype=torch.long),
                 count, red, -100, 0.1, dtype, context="N=0 backward", expect_launch=False)
    ce_both(values((1, 1), dtype, g), torch.tensor([0]), 1, -100, 0.5, 7, context="one element")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_reduction_on_exact_ties(dtype):
    """Row losses built exact (rows [0, -a]: S = 1, L = 0, loss a): their sum and mean are exactly midpoints of
    the output format, so the reduction kernel's thread 0 runs the exact tiers; an ignored row in between."""
    u = ulp(256.0, dtype)
    a = [256.0, 256.0 + u, 300.0]
    x = exact_tensor([[0.0, -a[0]], [0.0, -a[1]], [0.0, -a[2]]], dtype)
    t = torch.tensor([1, 1, -100])  # losses 256, 256 + u, (ignored): sum 512 + u, a midpoint; mean 256 + u/2 too
    losses = {red: ce_both(x, t, red, -100, 0.0, seed_of("tie", red), context="exact ties") for red in (0, 1, 2)}
    assert losses[0].tolist() == [256.0, 256.0 + u, 0.0]
    assert losses[2].item() == 512.0 and losses[1].item() == 256.0  # the ties, to even: the case is what it claims
    # Ties over more rows than the block's 256 threads (each thread's strided partial sum, then the tree), with
    # ignored rows in between. sum: 512 rows of A (2^9 A) and one of B, a midpoint of the format above 2^9 A;
    # mean: 511 rows of A and one of A + 256 ulp(A), whose mean A + ulp(A) / 2 is a midpoint.
    A = 256.0 if dtype != F16 else 32.0
    w = ulp(512 * A, dtype)
    B = math.ceil(18 / w) * w + w / 2  # >= 18: exp(-B) leaves S = 1
    for red, losses in ((2, [A] * 512 + [B]), (1, [A] * 511 + [A + 256 * ulp(A, dtype)])):
        rows = [[0.0, -v] for v in losses]
        t = torch.ones(len(rows), dtype=torch.long)
        for k in range(0, len(rows), 25):  # ignored rows (loss +0) in between
            rows.insert(k, [0.0, -1.0])
            t = torch.cat([t[:k], torch.tensor([-100]), t[k:]])
        loss = ce_both(exact_tensor(rows, dtype), t, red, -100, 0.0, seed_of("long tie", red), context="many-row ties")
        exact = sum(losses) / (len(losses) if red == 1 else 1)
        half = (w if red == 2 else ulp(A, dtype)) / 2
        assert loss.item() in (exact - half, exact + half)  # a tie, rounded to one side


def test_cross_entropy_label_smoothing_mean_on_a_tie():
    """A row whose log-probabilities' mean is exactly a float32 midpoint (label smoothing's sm, RN32 of an exact
    mean): thread 0's exact tier for the row, with and without padding to a long row."""
    a = [64.0 + 2.0**-15, 75.0, 75.0, 75.0, 75.0, 75.0, 73.0]  # sum 512 + 2^-15: mean/8 = 64 + 2^-18, a midpoint
    row = [0.0] + [-v for v in a]
    x = exact_tensor([row, row[::-1], [0.0, -20.0, -21.0, -22.0, -23.0, -24.0, -25.0, -26.0]], F32)
    t = torch.tensor([0, 3, 1])
    for red in (0, 1, 2):
        for eps in (0.1, 1.0):
            loss = ce_both(x, t, red, -100, eps, seed_of("smooth tie", red, eps), context="smoothing tie")
            if red == 0 and eps == 1.0:  # loss = sm = -RN32(mean): the tie 64 + 2^-18 went to even
                assert loss[:2].tolist() == [64.0, 64.0]


def test_cross_entropy_backward_into_other_dtypes():
    """The gradient of bfloat16 logits written as float32 and float16."""
    g = generator(11)
    x = values((70, 300), BF16, g)
    t = torch.randint(0, 300, (70,), generator=g)
    t[::5] = -100
    for red in (0, 1, 2):
        for out_dtype in (F32, F16):
            ce_both(x, t, red, -100, 0.2, seed_of(red, out_dtype), out_dtype=out_dtype, context="other out dtype")


def test_cross_entropy_out_of_range_target_is_nan_on_cuda():
    """Documented (docs/contract.md §8, softmax_cuda.cu): checking the targets would need a host
    synchronization, so on CUDA an out-of-range target gives a NaN loss (and NaN gradient row) where the CPU
    raises IndexError. Every other row, log_probs and count are the CPU's bits for the same rows."""
    emu = emulated_ops()
    g = generator(12)
    x = values((6, 9), F32, g)
    t = torch.tensor([0, 9, 3, -100, -1, 2])
    bad = torch.tensor([False, True, False, False, True, False])
    t_ok = torch.where(bad, torch.zeros_like(t), t)
    with pytest.raises(IndexError):
        torch.ops.carbon.cross_entropy(x, t, 0, -100, 0.1)
    for eps in (0.0, 0.1):
        loss, lp, count = emu.cross_entropy(x, t, 0, -100, eps)
        want, want_lp, want_count = torch.ops.carbon.cross_entropy(x, t_ok, 0, -100, eps)
        assert loss[bad].isnan().all() and as_int(loss[bad]).eq(0x7FC00000).all()
        assert_same(loss[~bad], want[~bad], "other rows")
        assert_same(lp, want_lp, "log_probs")
        assert_same(count, want_count, "count")
        for red in (1, 2):
            assert math.isnan(emu.cross_entropy(x, t, red, -100, eps)[0].item())
        grad = torch.full((6,), 0.75)
        back = emu.cross_entropy_backward(grad, lp, t, count, 0, -100, eps, F32)
        want_back = torch.ops.carbon.cross_entropy_backward(grad, want_lp, t_ok, want_count, 0, -100, eps, F32)
        assert back[bad].isnan().all()
        assert_same(back[~bad], want_back[~bad], "gradient of the other rows")


# ====================================================================== attention


def logits_scores(shape, g):
    s = torch.randn(shape, generator=g)
    flat = s.view(-1)
    if flat.numel() >= 8:
        flat[0], flat[1], flat[2], flat[3] = -0.0, NAN, INF, -INF
        flat[4], flat[5], flat[6], flat[7] = 1e-40, 3e38, -3e38, 2.0**-126
    if flat.numel() >= 12:
        put_nans(s, [8, 11])
    return s


@pytest.mark.parametrize("mask_dtype", [None, F32, BF16, F16])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_logits(mask_dtype, causal):
    """Shapes short and past the grid (B * Tq * Tk > 16384 elements), Tq > Tk and Tq < Tk (causal), specials
    in the scores and the mask (NaN, inf + -inf, -0 + -0), scales giving subnormal and overflowing logits,
    strided / expanded masks."""
    g = generator(seed_of("logits", mask_dtype, causal))
    for shape in ((1, 1, 1), (3, 17, 19), (2, 9, 4), (2, 4, 9), (3, 100, 70)):
        s = logits_scores(shape, g)
        mask = None
        if mask_dtype is not None:
            mask = torch.randn(shape, generator=g).to(mask_dtype)
            mflat = mask.view(-1)
            if mflat.numel() >= 12:
                mflat[0], mflat[1], mflat[2], mflat[3] = -0.0, -INF, INF, NAN
                mflat[8], mflat[9], mflat[10], mflat[11] = -INF, INF, -INF, 0.0
                put_nans(mask, [5, 6])
        for scale in (0.125, 1.0, 1e-30, 1e30, -0.5):
            check_op("attention_logits", s, scale, mask, causal, context=f"{shape} scale={scale}")
    if mask_dtype is not None:
        base = torch.randn(3, 20, 30, generator=g).to(mask_dtype)
        s = torch.randn(4, 9, 13, generator=g)
        check_op("attention_logits", s, 0.3, base[1:2, 2:11, 5:18].expand(4, 9, 13), causal, context="expanded mask")
        check_op("attention_logits", s, 0.3, base[:, :13, :9].transpose(1, 2)[:1].expand(4, 9, 13), causal,
                 context="transposed mask")
    for shape in ((0, 3, 4), (2, 0, 4), (2, 3, 0)):
        check_op("attention_logits", torch.empty(shape), 0.5, None, causal, context=f"empty {shape}",
                 expect_launch=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_probs_and_backward(dtype, causal):
    """attention_probs (fused on the CPU; bmm, attention_logits and softmax on CUDA) and its backward
    (softmax_backward then attention_logits): L > S, L < S, more rows than blocks, masks of every dtype with
    fully masked rows."""
    g = generator(seed_of("probs", dtype, causal))
    for (B, L, S, E) in ((1, 1, 1, 1), (1, 70, 75, 16), (3, 9, 5, 8), (1, 5, 300, 4)):
        q, k = torch.randn(B, L, E, generator=g).to(dtype), torch.randn(B, S, E, generator=g).to(dtype)
        if L > 4:
            q[0, L - 1, 0] = INF  # an infinite score row (NaN probabilities: inf - inf, or a +inf logit)
        masks = [None, torch.randn(B, L, S, generator=g)]
        if L > 1:
            bool_like = torch.where(torch.rand(L, S, generator=g) > 0.5, 0.0, -INF)
            bool_like[L // 2] = -INF  # a fully masked row: probabilities +0
            masks.append(bool_like.to(BF16).expand(B, L, S))
        if L > 4 and S > 4:
            special = torch.randn(B, L, S, generator=g).to(F16)
            special[0, 3, 1] = NAN  # a NaN row
            special[0, 2, 4] = NAN  # a NaN above the diagonal: masked out when causal
            special[0, 4, 0] = INF  # +inf logit: a NaN row
            special[0, 0, 0] = -INF  # causal: row 0 fully masked
            masks.append(special)
        if L > 64:
            masks = masks[::3]  # the many-rows shape (its cost goes with rows): no mask, and the special one
        for mask in masks:
            ctx = f"{(B, L, S, E)} mask={None if mask is None else mask.dtype} causal={causal}"
            probs = check_op("attention_probs", q, k, 0.25, mask, causal, context=ctx)
            grad = torch.randn(B, L, S, generator=g)
            if L > 2:
                grad[:, 1] = 0.0  # rows without gradient
                grad[:, 2] = -0.0
            check_op("attention_probs_backward", grad, probs, 0.25, context="backward " + ctx)
    for shape_q, shape_k in (((0, 3, 4), (0, 5, 4)), ((2, 0, 4), (2, 5, 4)), ((2, 3, 4), (2, 0, 4))):
        q, k = torch.randn(shape_q).to(dtype), torch.randn(shape_k).to(dtype)
        probs = check_op("attention_probs", q, k, 0.5, None, causal, context=f"empty {shape_q} {shape_k}",
                         expect_launch=False)
        check_op("attention_probs_backward", torch.ones(probs.shape), probs, 0.5, context="empty backward",
                 expect_launch=False)


# ====================================================================== elementwise math

FORWARD = ("exp", "log", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "sin", "cos", "log1p", "softplus",
           "log_sigmoid", "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos",
           "erfinv", "asinh", "acosh", "atanh", "lgamma", "digamma", "trigamma")
# The roots of the derivatives next to which the CPU's vector loops take the series (tests/test_elementwise_roots.py).
ROOTS = {"gelu": -0.751791524693564457, "gelu_tanh": -0.752461422071016258, "silu": -1.278464542761073795}
# Thresholds and branch points of the functions (tests/test_elementwise.py's POINTS), and the gamma family's.
POINTS = [
    0.0, 1.0, 0.5, 0.55, 0.7071067811865476, 1.4142135623730951, 2.125, 3.0052038200428273, 10.625,
    15.026019100214136, 88.72283935546875, 88.7228317, 89.0, 103.97208, 103.279, 87.33654, 104.0, 150.0,
    3.9192059, 3.92, 4.0, 6.0, 9.010913, 9.02, 14.5, 16.0, 20.0, 36.0, 40.0, 1e10, 1e30, 3.4028234663852886e38,
    1.1754943508222875e-38, 1e-10, 2.0**-60, 2.0**-40, 0.75179, 1.2785, 2.0**-24, 2.0**-25, 2.0**-10,
    0.7853981633974483, 1.5707963267948966, 3.141592653589793, 4.71238898038469, 6.283185307179586, 2.0**25,
    16367173 * 2.0**72, 1e20, 1.4616321, 2.4570248, 2.7476826, 2.0, 3.0, 1e-30,
]


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


@functools.lru_cache(maxsize=None)
def float32_inputs(seed: int, random_count: int = 1 << 14) -> torch.Tensor:
    """Special float32 values (zeros, subnormals, extremes, NaN payloads, the points above and their
    neighbours, both signs), values next to the derivatives' roots and the gamma family's poles, moderate
    values and random bit patterns over all exponents."""
    bits = {0x00000001, 0x00000002, 0x00000003, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F800000,
            0x7FC00000, 0x7FA00001, 0x7FFFFFFF, 0x3F800000, 0x3F7FFFFF, 0x3F800001}
    for p in POINTS:
        b = f32_bits(p) if abs(p) < 3.5e38 else 0x7F7FFFFF
        for d in (-2, -1, 0, 1, 2):
            if 0 <= b + d < 0x7F800000:
                bits.add(b + d)
    for r in list(ROOTS.values()) + [-float(k) for k in range(1, 12)]:
        b = f32_bits(r) & 0x7FFFFFFF
        bits.update(b + d for d in range(-40, 41))
    bits |= {b | 0x80000000 for b in bits}
    special = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in sorted(bits)], dtype=torch.int64)
    g = generator(seed)
    rand = torch.randint(-(2**31), 2**31, (random_count,), generator=g, dtype=torch.int64)
    moderate = (torch.rand(4096, generator=g, dtype=torch.float64) * 60 - 30).to(F32)
    return torch.cat([special.to(torch.int32).view(F32), moderate, rand.to(torch.int32).view(F32)])


@functools.lru_cache(maxsize=None)
def every_pattern(dtype) -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def elementwise_inputs(dtype):
    return every_pattern(dtype) if dtype != F32 else float32_inputs(seed_of("elementwise float32"))


def forward_call(name, x, context, expect_launch=True):
    if name in ("gelu", "gelu_tanh"):
        return check_op("gelu", x, "tanh" if name == "gelu_tanh" else "none", context=context,
                        expect_launch=expect_launch)
    return check_op(name, x, context=context, expect_launch=expect_launch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FORWARD)
def test_elementwise_forward_and_backward_every_pattern(name, dtype):
    """Every float16 / bfloat16 bit pattern, float32 specials and random patterns (over 16384 elements: the
    grid-stride loop); the gradient by elementwise_backward with random, zero, infinite and NaN gradients."""
    x = elementwise_inputs(dtype)
    forward_call(name, x, f"{name} {name_of(dtype)}")
    g = torch.randn(x.shape, generator=generator(seed_of("grad", name, dtype))).to(dtype)
    g[:: 97] = 0.0
    g[1:: 97] = -0.0
    g[2:: 389] = INF
    g[3:: 389] = NAN
    check_op("elementwise_backward", g, x, name, context=f"d{name} {name_of(dtype)}")


def test_elementwise_empty_one_element_and_strided():
    """Every function (and its gradient) on an empty tensor (no launch), one element, a strided view."""
    g = generator(21)
    x = torch.randn(300, 200, generator=g)
    for name in FORWARD:
        for dtype in DTYPES:
            forward_call(name, torch.empty((0, 3), dtype=dtype), f"{name} empty", expect_launch=False)
            forward_call(name, torch.tensor([0.75], dtype=dtype), f"{name} one element")
        forward_call(name, x.t()[::3], f"{name} strided")
        check_op("elementwise_backward", x[:1, :1], x[:1, :1].t(), name, context=f"d{name} 1x1")
        check_op("elementwise_backward", x.t()[:0], x.t()[:0], name, context=f"d{name} empty", expect_launch=False)


BINARY64 = ("exp", "log", "sin", "cos")


def float64_inputs(seed: int, count: int = 8000) -> torch.Tensor:
    """Random values over every binary64 exponent (both signs), values next to multiples of pi/2 (the
    argument reduction's hard cases), the overflow / underflow thresholds, specials and random patterns."""
    rng = random.Random(seed)
    xs = [math.copysign(rng.random() + 0.5, rng.random() - 0.5) * 2.0 ** rng.randint(-1074, 1023) for _ in range(count)]
    for k in range(1, 200):
        q = k * rng.choice([1, 3, 7, 1001, 123457, 2**20 + 1]) * math.pi / 2
        xs += [q, math.nextafter(q, INF), math.nextafter(q, -INF)]
    xs += [INF, -INF, NAN, 0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -745.14, -745.13, 709.78, 709.79,
           1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0, 2.0**-30, 1e22, 2.0**1023]
    g = generator(seed)
    patterns = torch.randint(-(2**62), 2**62, (1 << 13,), generator=g, dtype=torch.int64).view(torch.float64)
    return torch.cat([torch.tensor(xs, dtype=torch.float64), patterns])


@pytest.mark.parametrize("name", BINARY64)
def test_float64_functions_and_gradients(name):
    """float64 exp, log, sin, cos (the double-double binary64 kernel, 128-thread blocks) and their gradients."""
    x = float64_inputs(seed_of("float64", name))
    check_op(name, x, context=f"float64 {name}")
    rng = random.Random(seed_of("float64 grad", name))
    g = torch.tensor([math.ldexp(rng.random() + 0.5, rng.randint(-30, 30)) for _ in range(x.numel())],
                     dtype=torch.float64)
    g[::101] = 0.0
    g[1::101] = NAN
    g[2::101] = -INF
    check_op("elementwise_backward", g, x, name, context=f"float64 d{name}")
    check_op(name, x[:1], context="one element")
    check_op(name, x[:0], context="empty", expect_launch=False)


def pow_inputs(dtype, seed):
    g = generator(seed)
    x = torch.cat([torch.randn(4096, generator=g, dtype=torch.float64).exp() ** 8,
                   -torch.randn(512, generator=g, dtype=torch.float64).exp(),
                   torch.tensor([0.0, -0.0, 1.0, -1.0, -2.0, 2.0, 0.5, INF, -INF, NAN, 1e-45, 3e38, -3.0],
                                dtype=torch.float64)]).to(dtype)
    return x


EXPONENTS = (1.5, -0.5, 3.0, -100.25, 0.0, -0.0, 1.0, 2.0, -1.0, 0.5, 1e10, -1e10, INF, -INF, NAN, 1.0 / 3.0)
BASES = (10000.0, 0.5, 2.0, -2.0, 0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-300, 2.718281828459045)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
def test_pow_tensor_scalar_and_scalar_tensor(dtype):
    """x ** p and b ** y with C's special exponents and bases (0, -0, +-1, +-inf, NaN, negative bases with
    fractional exponents, huge ones), every 16-bit pattern, float64 (the double-double kernel)."""
    if dtype == torch.float64:
        x = torch.cat([float64_inputs(seed_of("pow64"), count=2000).abs(), float64_inputs(7, count=500)])
        e = torch.cat([torch.tensor([i / 32 for i in range(-64, 64)], dtype=torch.float64), float64_inputs(8, 1000)])
    else:
        x = pow_inputs(dtype, seed_of("pow", dtype))
        e = x
    for p in EXPONENTS:
        check_op("pow_tensor_scalar", x, p, context=f"{name_of(dtype)} x^{p}")
    for base in BASES:
        check_op("pow_scalar_tensor", base, e, context=f"{name_of(dtype)} {base}^y")
    if dtype in (BF16, F16):  # every bit pattern, as base and as exponent
        for p in (1.5, -0.5, 1.0 / 3.0):
            check_op("pow_tensor_scalar", every_pattern(dtype), p, context=f"every pattern ^{p}")
        for base in (10000.0, 0.5):
            check_op("pow_scalar_tensor", base, every_pattern(dtype), context=f"{base}^every pattern")
    check_op("pow_tensor_scalar", x[:0], 2.0, context="empty", expect_launch=False)
    check_op("pow_scalar_tensor", 2.0, e[:1].reshape(()), context="0-dim")


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
def test_sqrt(dtype):
    """The square root (IEEE binary64 root, rounded once; NaN canonical): random patterns of every kind, every
    16-bit pattern, float64 patterns, strided and empty inputs."""
    x = float64_inputs(seed_of("sqrt64"), count=4000) if dtype == torch.float64 else pow_inputs(dtype, seed_of("sqrt", dtype))
    check_op("sqrt", x, context=name_of(dtype))
    if dtype in (BF16, F16):
        check_op("sqrt", every_pattern(dtype), context="every pattern")
    check_op("sqrt", x[: (x.numel() // 8) * 8].reshape(-1, 8).t(), context="strided")
    check_op("sqrt", x[:0], context="empty", expect_launch=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["atan2", "hypot", "pow_tensor_tensor"])
def test_two_argument_functions(name, dtype):
    """Random bit-pattern pairs (every kind of value), C's special values against each other, moderate values."""
    g = generator(seed_of("two argument", name, dtype))
    n = 1 << 15
    if dtype == F32:
        patterns = torch.randint(-(2**31), 2**31 - 1, (2, n), generator=g, dtype=torch.int64).to(torch.int32)
    else:
        patterns = torch.randint(-(2**15), 2**15 - 1, (2, n), generator=g, dtype=torch.int64).to(torch.int16)
    a, b = patterns.view(dtype)
    specials = torch.tensor([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -2.0, 2.0, 1e-40, 3e38], dtype=dtype)
    k = specials.numel()
    moderate = (torch.randn(2, 4096, generator=g) * 4).to(dtype)
    a = torch.cat([a, specials.repeat_interleave(k), moderate[0]])
    b = torch.cat([b, specials.repeat(k), moderate[1]])
    check_op(name, a, b, context=f"{name} {name_of(dtype)}")
    check_op(name, a.reshape(-1, 8).t(), b.reshape(-1, 8).t(), context="strided")
    check_op(name, a[:1], b[:1], context="one element")
    check_op(name, a[:0], b[:0], context="empty", expect_launch=False)


# ====================================================================== random draws

SEEDS_OFFSETS = [(0, 0), (12345, 7), (-(2**63) + 99, 2**32 + 3), (2**62 + 5, 2**62 + 1)]
SIZES = [[0], [1], [3], [4], [5], [7], [9], [257], [3, 5, 7], [4099]]
BIG_SIZE = {"uniform": [70001], "normal": [40001], "trunc_normal": [20001]}  # past the 64 x 256 threads


def state_of(seed, offset):
    return torch.tensor([seed, offset], dtype=torch.long)


def draw_both_forms(op, size, seed, offset, *params, dtype, context):
    """The (seed, offset) overload and the .state overload (the emulated kernel reads the state from device
    memory), each emulated vs CPU, and the two forms the same bits."""
    launch = math.prod(size) > 0
    a = check_op(op, size, seed, offset, *params, dtype, CPU, context=context, expect_launch=launch)
    b = check_op(op, size, state_of(seed, offset), *params, dtype, CPU, context=context + " .state",
                 expect_launch=launch)
    assert_same(b, a, context + ": .state vs ints")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["uniform", "normal", "trunc_normal"])
def test_factory_draws(kind, dtype):
    """Sizes that cut Philox's blocks (4 words per uniform block, 2 values per normal block), past the grid
    (> 16384 blocks or elements), several seeds / offsets; trunc_normal's accepted and clamped (64 rejections)
    draws."""
    params = {"uniform": [(-2.5, 7.0), (0.0, 1.0), (1e-3, 1e-3), (-3e38, 3e38)],
              "normal": [(0.5, 3.0), (0.0, 1.0), (-1.0, 0.0), (1e30, 1e-30)],
              "trunc_normal": [(0.0, 1.0, -1.0, 0.5), (0.0, 1.0, 5.0, 6.0), (2.0, 0.5, 2.0, 2.0),
                               (0.0, 3.0, -1e-3, 1e-3)]}
    for i, p in enumerate(params[kind]):
        for j, size in enumerate(SIZES + ([BIG_SIZE[kind]] if i == 0 else [])):
            seed, offset = SEEDS_OFFSETS[(i + j) % len(SEEDS_OFFSETS)]
            draw_both_forms(kind, size, seed, offset, *p, dtype=dtype, context=f"{kind}{p} {size} {seed},{offset}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_bernoulli_and_dropout(dtype):
    """Tensor and scalar probabilities (0, 1, NaN, subnormal), dropout's p = 0 / 0.3 / 1 of NaN, inf, -0 and
    subnormal inputs, both overloads, sizes that cut the 4-word blocks and span the grid."""
    g = generator(seed_of("bernoulli", dtype))
    for n in (1, 3, 5, 4099, 70001):
        seeds_offsets = SEEDS_OFFSETS[1:3] if n < 70001 else SEEDS_OFFSETS[2:3]
        probs = torch.rand(n, generator=g).to(dtype)
        x = torch.randn(n, generator=g).to(dtype)
        specials = torch.tensor([0.0, 1.0, NAN, 1e-40, -0.5, 2.0, INF, -0.0], dtype=dtype)[:n]
        probs[: specials.numel()] = specials
        x[: specials.numel()] = torch.tensor([NAN, INF, -INF, -0.0, 1e-40, 65504.0, 3.0, -7.0], dtype=dtype)[:n]
        if n > 100:
            put_nans(x, range(50, 58))
            put_nans(probs, range(60, 64))
        for seed, offset in seeds_offsets:
            ctx = f"n={n} {seed},{offset}"
            for p in (None, 0.0, 0.3, 1.0):
                a = check_op("bernoulli", probs, seed, offset, p, context=f"bernoulli p={p} {ctx}")
                b = check_op("bernoulli", probs, state_of(seed, offset), p, context=f"bernoulli.state p={p} {ctx}")
                assert_same(b, a, "bernoulli .state vs ints")
            for p in (0.0, 0.3, 1.0, 2.0**-24):
                a = check_op("dropout", x, p, seed, offset, context=f"dropout p={p} {ctx}")
                b = check_op("dropout", x, p, state_of(seed, offset), context=f"dropout.state p={p} {ctx}")
                assert_same(b, a, "dropout .state vs ints")
    check_op("dropout", torch.empty((2, 0), dtype=dtype), 0.5, 1, 2, context="empty", expect_launch=False)
    check_op("bernoulli", torch.empty(0, dtype=dtype), 1, 2, None, context="empty", expect_launch=False)
    check_op("dropout", torch.randn(40, 30, generator=g).to(dtype).t(), 0.5, 1, 2, context="strided")


def test_random_prefix_property_on_the_device():
    """Element i depends on (seed, offset, i) only: a short draw is the prefix of a long one on the emulated
    GPU (whatever the grid), for n around the blocks of 4 and 2 values."""
    emu = emulated_ops()
    long = {"uniform": emu.uniform([4 * 1031], 5, 9, 0.0, 1.0, F32, CPU),
            "normal": emu.normal([4 * 1031], 5, 9, 0.0, 1.0, F32, CPU)}
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 255, 256, 257, 1023, 1024, 1025):
        assert_same(emu.uniform([n], 5, 9, 0.0, 1.0, F32, CPU), long["uniform"][:n], f"uniform prefix {n}")
        assert_same(emu.normal([n], 5, 9, 0.0, 1.0, F32, CPU), long["normal"][:n], f"normal prefix {n}")


def test_device_state_contract():
    """docs/contract.md §10: a state tensor on the draw's device is read by the kernel, unchecked -- its
    offset taken as its uint64 bits (the CPU refuses a negative offset); a non-contiguous one there is a
    RuntimeError. Checked against the independent Philox of tests/philox_reference.py: uniform(0, 1) in
    float32 is exactly (w >> 8) 2^-24."""
    emu = emulated_ops()
    seed, n = 77, 11
    got = emu.uniform([n], state_of(seed, -1), 0.0, 1.0, F32, CPU)
    want = torch.tensor([(w >> 8) * 2.0**-24 for w in philox_words(seed, 2**64 - 1, n)], dtype=F32)
    assert_same(got, want, "offset -1 read as 2^64 - 1")
    with pytest.raises(ValueError, match="offset"):
        torch.ops.carbon.uniform([n], state_of(seed, -1), 0.0, 1.0, F32, CPU)
    strided = torch.tensor([seed, 0, 5, 0], dtype=torch.long)[::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        emu.uniform([n], strided, 0.0, 1.0, F32, CPU)
    want = torch.tensor([(w >> 8) * 2.0**-24 for w in philox_words(seed, 5, n)], dtype=F32)
    assert_same(torch.ops.carbon.uniform([n], strided, 0.0, 1.0, F32, CPU), want, "CPU reads a strided state")


# ====================================================================== indexed accumulation


def heavy(n, size, g, hot=3):
    """Indices in [0, size) with ~70% of them on `hot` destinations (thousands of contributions to one)."""
    hot_idx = torch.randint(0, size, (n,), generator=g) % hot
    return torch.where(torch.rand(n, generator=g) < 0.7, hot_idx, torch.randint(0, size, (n,), generator=g))


def source_spread(dtype):
    return 40 if dtype != F16 else 6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_add_heavy_duplicates(dtype, dim):
    """Skewed indices, a wide spread of magnitudes (cancellation: tier 1 undecided for many destinations),
    int32 and int64 indices, destinations past the grid (> 16384 elements)."""
    g = generator(seed_of("index_add", dtype, dim))
    if dim == 0:
        self_shape, n = (64, 300), 3000
    elif dim == 1:
        self_shape, n = (7, 64, 40), 2000
    else:
        self_shape, n = (6, 5, 64), 4000
    self = random_values(self_shape, dtype, g)
    src_shape = list(self_shape)
    src_shape[dim] = n
    source = random_values(src_shape, dtype, g, spread=source_spread(dtype))
    index = heavy(n, self_shape[dim], g)
    for idx in (index, index.to(torch.int32)):
        check_op("index_add", self, dim, idx, source, context=f"{self_shape} dim={dim} {idx.dtype}")
    check_op("index_add", self, dim - len(self_shape), index, source, context="negative dim")
    check_op("index_add", self, dim, torch.full((n,), self_shape[dim] - 1), source, context="one destination")
    # strided self / source / index (made contiguous by the op)
    check_op("index_add", self.transpose(0, -1).contiguous().transpose(0, -1), dim,
             torch.stack([index, index], 1).reshape(-1)[::2], source.transpose(0, -1).contiguous().transpose(0, -1),
             context="strided")


def half_ulp_among_pairs(rng, pairs, big, u, dtype):
    """u/2 and `pairs` pairs y, -y (random values of dtype below big), shuffled: added to 1 they make the tie
    1 + u/2, hidden among cancelling terms that keep tier 1 from deciding."""
    terms = [u / 2]
    for _ in range(pairs):
        y = float(torch.tensor(rng.uniform(-big, big), dtype=torch.float64).to(dtype))
        terms += [y, -y]
    rng.shuffle(terms)
    return terms


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_ties_specials_and_signed_zeros(dtype):
    """Huge terms cancelling around tiny ones, NaN, +-inf (and inf - inf), signed zeros (-0 + -0 = -0, an
    untouched -0 stays -0), and a tie 1 + ulp/2 hidden among hundreds of cancelling pairs in one long segment
    (tier 1 undecided: each thread's compensated and exact tiers)."""
    big = {F32: 2.0**100, BF16: 2.0**100, F16: 2.0**14}[dtype]
    tiny = {F32: 2.0**-140, BF16: 2.0**-130, F16: 2.0**-24}[dtype]
    u = ulp(1.0, dtype)
    self = exact_tensor([[1.0], [-0.0], [NAN], [1.0], [-0.0], [0.0], [1.0], [big], [tiny], [-0.0]], dtype)
    src = exact_tensor([[big], [u / 2], [-big], [tiny], [-0.0], [INF], [-INF], [1.0], [-1.0], [-0.0], [-0.0],
                        [u / 2], [-u / 2], [big], [big], [-tiny], [-0.0], [NAN], [0.0]], dtype)
    index = torch.tensor([0, 0, 0, 0, 1, 3, 3, 4, 4, 5, 9, 6, 6, 7, 7, 8, 9, 2, 9])
    check_op("index_add", self, 0, index, src, context="specials")
    check_op("index_add", put_nans(self.clone(), [2, 5]), 0, index, put_nans(src.clone(), [3, 17]),
             context="NaNs of other payloads")
    # 1 + u/2 (a tie) hidden among cancelling pairs, spread over a long segment
    rng = random.Random(seed_of("ties", dtype))
    terms = half_ulp_among_pairs(rng, 300, big, u, dtype)
    src = exact_tensor([[t, -t] for t in terms], dtype)  # column 1: the tie's mirror
    self = exact_tensor([[1.0, -1.0], [1.0 + 2 * u, -1.0 - 2 * u]], dtype)
    index = torch.tensor([rng.randrange(2) for _ in terms])
    check_op("index_add", self, 0, index, src, context="hidden ties")
    check_op("index_add", self, 0, torch.zeros(len(terms), dtype=torch.long), src, context="one segment of ties")


def test_index_add_empty_index_and_tensors():
    """An empty index (each destination RN(self), NaN canonical), an empty self (no launch), a 0-d index."""
    self = exact_tensor([[1.0, NAN], [-0.0, 2.0]], F32)
    none = torch.empty(0, dtype=torch.long)
    check_op("index_add", self, 0, none, torch.empty(0, 2), context="empty index: RN(self), NaN canonical")
    check_op("index_add", torch.empty(0, 5), 0, none, torch.empty(0, 5), context="empty self", expect_launch=False)
    check_op("index_add", self, 1, torch.tensor(1), torch.ones(2, 1), context="0-d index")
    check_op("index_add", torch.zeros(1), 0, torch.tensor([0]), torch.ones(1), context="one element")


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add(dtype):
    """Heavily duplicated destinations along dim 0 and dim 1, an index smaller than src (int32), more
    destinations than the grid's threads, empty index and empty self."""
    g = generator(seed_of("scatter_add", dtype))
    self = random_values((50, 8), dtype, g)
    src = random_values((300, 8), dtype, g, spread=source_spread(dtype))
    index = heavy(300 * 8, 50, g).reshape(300, 8)
    check_op("scatter_add", self, 0, index, src, context="dim 0")
    check_op("scatter_add", self.t().contiguous(), 1, index.t().contiguous(), src.t().contiguous(), context="dim 1")
    check_op("scatter_add", self, 0, index[:40, :6].to(torch.int32), src, context="smaller int32 index")
    big_self = random_values((130, 160), dtype, g)  # 20800 destinations: the grid-stride loop
    big_index = heavy(260 * 160, 130, g, hot=2).reshape(260, 160)
    check_op("scatter_add", big_self, 0, big_index, random_values((260, 160), dtype, g), context="past the grid")
    check_op("scatter_add", self, 1, torch.empty((50, 0), dtype=torch.long), src, context="empty index")
    check_op("scatter_add", torch.empty((0, 3), dtype=dtype), 0, torch.empty((0, 3), dtype=torch.long),
             torch.empty((0, 3), dtype=dtype), context="empty self", expect_launch=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_forward_and_backward(dtype):
    """The gather (index_select, then round_to's kernel rewriting NaNs canonical) with padding_idx, int32 and
    strided tokens; the gradient (one exact sum per row over skewed tokens) with padding_idx, 2-D int32 tokens,
    rows of -0 only (-0) and unused rows (+0), no tokens."""
    g = generator(seed_of("embedding", dtype))
    vocab, dim = 1000, 130
    weight = random_values((vocab, dim), dtype, g)
    weight[3, 0], weight[4, 1], weight[5, 2], weight[6, 3] = NAN, INF, -0.0, 1e-40 if dtype != F16 else 1e-7
    weight.view(BITS[dtype])[7, 4] = -1  # a NaN with another payload: written canonical
    tok = heavy(4096, vocab, g).reshape(64, 64)
    for pad in (-1, 0, 3):
        check_op("embedding", weight, tok, pad, context=f"forward pad {pad}")
        check_op("embedding", weight, tok.to(torch.int32)[::2], pad, context="int32 strided tokens")
    grad = random_values((64, 64, dim), dtype, g, spread=source_spread(dtype))
    grad[0, :5] = -0.0
    for pad in (-1, 2):
        check_op("embedding_backward", grad, tok, vocab, pad, context=f"backward pad {pad}")
    small_tok = heavy(100, 30, g).reshape(4, 25)
    check_op("embedding_backward", random_values((4, 25, 16), dtype, g), small_tok.to(torch.int32), 30, 3,
             context="2-D int32 tokens")
    zeros = torch.full((6, 16), -0.0, dtype=dtype)
    check_op("embedding_backward", zeros, torch.tensor([1, 1, 2, 4, 4, 4]), 6, -1,
             context="rows of -0 (-0), unused (+0)")
    none = torch.empty(0, dtype=torch.long)
    check_op("embedding_backward", torch.empty((0, 16), dtype=dtype), none, 7, 2, context="no tokens")
    check_op("embedding_backward", torch.empty((0, 16), dtype=dtype), none, 0, -1, context="no rows",
             expect_launch=False)
    check_op("embedding", weight, none, -1, context="no tokens", expect_launch=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_chunk_sums_around_chunk_boundaries(dtype):
    """On CUDA a run of 64 sorted contributions going to one destination is added first (a chunk sum), and the
    destination adds the chunks lying wholly inside its segment in place of their terms (scatter_kernel.h).
    Segments of every length around the chunk (63, 64, 65, 127, 128, 129, 327), starting on and off chunk
    boundaries (out-of-range indices, ignored on CUDA, sort before and after them and shift them), over a middle
    dim (several outer slices, each with its own chunk sums), with cancelling pairs of huge terms around a tiny
    one and a tie 1 + ulp/2 spread over several chunks (tier 1 undecided: the exact tiers), NaN from +inf - inf,
    one inf, and -0 only: the emulated kernels equal an exact oracle (fractions) and the CPU."""
    g = generator(seed_of("chunk boundaries", dtype))
    counts = [0, 63, 64, 65, 1, 127, 128, 129, 2, 327, 64, 70]
    S = len(counts)
    dest = torch.cat([torch.full((k,), j, dtype=torch.long) for j, k in enumerate(counts)])
    index = dest[torch.randperm(len(dest), generator=g)]
    N = len(index)
    source = random_values((2, N, 3), dtype, g, spread=source_spread(dtype))
    self = random_values((2, S, 3), dtype, g)
    big = {F32: 2.0**100, BF16: 2.0**100, F16: 2.0**14}[dtype]
    tiny = {F32: 2.0**-140, BF16: 2.0**-130, F16: 2.0**-24}[dtype]
    u = ulp(1.0, dtype)

    def put(j, o, c, values):
        positions = (index == j).nonzero().flatten()
        assert len(values) == len(positions)
        source[o, positions, c] = exact_tensor(values, dtype)

    put(7, 0, 0, [big, -big] * 64 + [tiny])  # the exact sum is self + tiny
    put(9, 1, 1, half_ulp_among_pairs(random.Random(seed_of("chunk ties", dtype)), 163, big, u, dtype))
    self[1, 9, 1] = 1.0  # 1 + u/2: a tie, to even
    put(5, 1, 2, [INF] + [1.0] * 125 + [-INF])
    put(6, 0, 2, [1.0] * 100 + [INF] + [1.0] * 27)
    put(3, 0, 1, [-0.0] * 65)
    self[0, 3, 1] = -0.0
    want = index_add_bits(self, 1, index, source)
    check_op("index_add", self, 1, index, source, context="in-range indices")
    emu = emulated_ops()
    for before, after in ((5, 0), (64, 3), (70, 64)):
        extended = torch.cat([torch.full((before,), -1), index, torch.full((after,), S)])
        pad = random_values((2, before + N + after, 3), dtype, g)
        pad[:, before:before + N] = source
        assert_bits_equal(emu.index_add(self, 1, extended, pad), want,
                          f"{before} indices sorted before the segments, {after} after", dtype=dtype)


def test_out_of_range_indices_are_ignored_on_cuda():
    """docs/contract.md §11: on CUDA an out-of-range index of index_add, scatter_add or embedding_backward
    contributes nothing (checking would synchronize the host); the CPU raises IndexError. The emulated result
    equals the CPU's for the same call without those contributions."""
    emu = emulated_ops()
    g = generator(31)
    self = random_values((20, 6), BF16, g)
    source = random_values((50, 6), BF16, g)
    index = heavy(50, 20, g)
    bad = index.clone()
    bad[[0, 7, 49]] = torch.tensor([20, -1, 1000])
    keep = (bad >= 0) & (bad < 20)
    with pytest.raises(IndexError):
        torch.ops.carbon.index_add(self, 0, bad, source)
    assert_same(emu.index_add(self, 0, bad, source), torch.ops.carbon.index_add(self, 0, bad[keep], source[keep]),
                "index_add")
    src = random_values((30, 6), BF16, g)
    sidx = heavy(30 * 6, 20, g).reshape(30, 6)
    sbad = sidx.clone()
    sbad[0, 0], sbad[5, 3], sbad[29, 5] = 20, -3, 99
    padded = torch.cat([self, torch.zeros(1, 6, dtype=BF16)])  # the dropped contributions go to an extra row
    want = torch.ops.carbon.scatter_add(padded, 0, torch.where((sbad >= 0) & (sbad < 20), sbad, 20), src)[:20]
    assert_same(emu.scatter_add(self, 0, sbad, src), want.contiguous(), "scatter_add")
    grad = random_values((50, 6), F32, g)
    assert_same(emu.embedding_backward(grad, bad, 20, 4),
                torch.ops.carbon.embedding_backward(grad[keep], bad[keep], 20, 4), "embedding_backward")


# ====================================================================== optimizers, sum of squares, clipping

SHAPES_OPTIM = ((0,), (1,), (5,), (257,), (70, 33), (20000,))


def optim_tensors(dtypes, seed):
    """Parameters, gradients (with NaN / inf in the largest), and float32 states (v, v_max >= 0) of
    SHAPES_OPTIM, the i-th parameter of dtypes[i % len(dtypes)]."""
    params, grads, ms, vs, ws = [], [], [], [], []
    for i, shape in enumerate(SHAPES_OPTIM):
        dtype = dtypes[i % len(dtypes)]
        params.append(wide_values(shape, dtype, seed + 10 * i))
        g = wide_values(shape, dtype, seed + 10 * i + 1)
        if g.numel() > 1000:
            g.view(-1)[100], g.view(-1)[101], g.view(-1)[102] = NAN, INF, -INF
            put_nans(g, [103, 200, 201, 300])
            put_nans(params[-1], [104, 105, 400])
        grads.append(g)
        ms.append(wide_values(shape, F32, seed + 10 * i + 2) * 2.0**-10)
        v = (wide_values(shape, F32, seed + 10 * i + 3) * 2.0**-20) ** 2
        if v.numel() > 1000:
            put_nans(ms[-1], [106, 500])
            put_nans(v, [107, 501])
        vs.append(v)
        ws.append(torch.maximum(v, (wide_values(shape, F32, seed + 10 * i + 4) * 2.0**-20) ** 2))
    return params, grads, ms, vs, ws


ADAM_CONFIGS = [  # (weight_decay, decoupled, maximize, amsgrad)
    (0.1, True, False, False), (0.1, False, True, False), (0.0, False, False, False), (0.1, True, False, True),
    (0.01, False, True, True), (0.0, True, False, True),
]
MIXED = [(F32,), (BF16,), (F16,), (F32, BF16, F16)]


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "-".join(name_of(t) for t in d))
@pytest.mark.parametrize("wd,decoupled,maximize,amsgrad", ADAM_CONFIGS)
def test_adam_step(dtypes, wd, decoupled, maximize, amsgrad):
    """Adam / AdamW (L2 or decoupled weight decay, maximize, AMSGrad) over six parameters of different sizes
    (empty, one element, a block's tail, more than the grid's threads) and dtypes, at several t and lr."""
    params, grads, ms, vs, ws = optim_tensors(dtypes, seed_of("adam", dtypes, wd, decoupled, maximize, amsgrad))
    for t, lr in ((1, 1e-3), (7, 0.5), (1000, 1e-2)):
        beta1, beta2 = 0.9, 0.999
        bc1, bc2s = 1.0 - beta1**t, math.sqrt(1.0 - beta2**t)
        check_op("adam_step_", params, grads, ms, vs, ws if amsgrad else [], lr, beta1, beta2, 1e-8, wd, bc1, bc2s,
                 decoupled, maximize, context=f"t={t} lr={lr}")


@pytest.mark.parametrize("dtypes", MIXED[2:], ids=lambda d: "-".join(name_of(t) for t in d))
@pytest.mark.parametrize("lr_kind", ["float", "float32 tensor", "float64 tensor"])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_step_capturable(dtypes, lr_kind, amsgrad):
    """t and lr read by the kernel from device memory (the CPU reads them on the host): each parameter's own
    t, among them the first step, a large one, and t past 2^24."""
    params, grads, ms, vs, ws = optim_tensors(dtypes, seed_of("capturable", dtypes, lr_kind, amsgrad))
    steps = [torch.tensor([t], dtype=F32) for t in (1.0, 2.0, 10.0, 1000.0, 2.0**24 + 2, 3.0)]
    lr_tensor = {"float": None, "float32 tensor": torch.tensor(3e-3, dtype=F32),
                 "float64 tensor": torch.tensor([1e-2 / 3], dtype=torch.float64)}[lr_kind]
    for wd, decoupled, maximize in ((0.1, True, False), (0.05, False, True)):
        check_op("adam_step_capturable_", params, grads, ms, vs, ws if amsgrad else [], steps, 1e-3, lr_tensor,
                 0.9, 0.999, 1e-8, wd, decoupled, maximize, context=f"wd={wd} decoupled={decoupled}")


SGD_CONFIGS = [  # (momentum, dampening, weight_decay, nesterov, maximize)
    (0.0, 0.0, 0.0, False, False), (0.0, 0.0, 0.01, False, True), (0.9, 0.0, 0.01, True, False),
    (0.5, 0.25, 0.0, False, False), (0.9, 0.1, 0.1, False, True),
]


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "-".join(name_of(t) for t in d))
@pytest.mark.parametrize("momentum,dampening,wd,nesterov,maximize", SGD_CONFIGS)
def test_sgd_step(dtypes, momentum, dampening, wd, nesterov, maximize):
    """SGD without momentum (no buffers), with momentum (the first step sets the buffers), dampening,
    nesterov, weight decay and maximize, over the same six parameters."""
    params, grads, ms, _, _ = optim_tensors(dtypes, seed_of("sgd", dtypes, momentum, dampening, wd, nesterov))
    buffers = ms if momentum != 0.0 else []
    for first in ((True, False) if momentum != 0.0 else (False,)):
        check_op("sgd_step_", params, grads, buffers, 0.05, momentum, dampening, wd, nesterov, maximize, first,
                 context=f"first_step={first}")


def test_optimizer_steps_of_empty_tensors_launch_nothing():
    """Parameters that are all empty: the CUDA branches skip them (no launch), the CPU's leave them alone."""
    e = [torch.empty(0), torch.empty((3, 0), dtype=BF16)]
    z = [torch.empty(0), torch.empty((3, 0))]
    check_op("adam_step_", e, e, z, z, z, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.03, True, False, context="adam",
             expect_launch=False)
    check_op("adam_step_capturable_", e, e, z, z, [], [torch.ones(1), torch.ones(1)], 1e-3, None, 0.9, 0.999, 1e-8,
             0.0, True, False, context="capturable", expect_launch=False)
    check_op("sgd_step_", e, e, z, 0.1, 0.9, 0.0, 0.0, False, False, True, context="sgd", expect_launch=False)
    check_op("clip_scale_", e, torch.tensor(2.0), 1.0, 1e-6, context="clip", expect_launch=False)


# The optimizer kernels take up to 32 tensors of one dtype per launch (csrc/optim/tensor_lists.cuh), in chunks of
# 4096 elements (16 Ki for the sum of squares). LIST_SIZES: 75 tensors around those chunk sizes, empty ones among
# them; LIST_DTYPES: runs of one dtype broken where the dtype changes.
LIST_SIZES = [(4096, 4095, 0, 1, 4097, 8192, 12289, 33, 0, 16385)[i % 10] for i in range(75)]
LIST_DTYPES = {"float32": [F32] * 75, "runs": [F32] * 40 + [BF16] * 5 + [F32] * 10 + [F16] * 20,
               "alternating": [(F32, BF16, F16)[i % 3] for i in range(75)]}


def list_launches(dtypes, sizes):
    """Launches of one list kernel: runs of nonempty tensors of one dtype, cut every 32 tensors."""
    count, run, last = 0, 0, None
    for dtype, size in zip(dtypes, sizes):
        if size == 0:
            continue
        if run == 0 or dtype != last or run == 32:
            count, run = count + 1, 0
        run, last = run + 1, dtype
    return count


def many_tensors(kind, seed):
    """75 parameters (LIST_SIZES, LIST_DTYPES[kind]) with gradients, float32 states and per-tensor steps."""
    ps, gs, ms, vs, ws, steps = [], [], [], [], [], []
    for i, (size, dtype) in enumerate(zip(LIST_SIZES, LIST_DTYPES[kind])):
        ps.append(wide_values((size,), dtype, seed + 7 * i))
        gs.append(wide_values((size,), dtype, seed + 7 * i + 1))
        ms.append(wide_values((size,), F32, seed + 7 * i + 2) * 2.0**-10)
        vs.append((wide_values((size,), F32, seed + 7 * i + 3) * 2.0**-20) ** 2)
        ws.append(torch.maximum(vs[-1], (wide_values((size,), F32, seed + 7 * i + 4) * 2.0**-20) ** 2))
        steps.append(torch.tensor([float(1 + 37 * i)], dtype=F32))  # every tensor its own t
    return ps, gs, ms, vs, ws, steps


@pytest.mark.parametrize("kind", LIST_DTYPES)
def test_optimizer_kernels_over_many_tensors(kind):
    """75 tensors of sizes around the chunk sizes, empty ones among them, in runs of one or several dtypes: each
    list kernel takes the launches the grouping predicts, and every tensor gets its own update (capturable Adam:
    its own t), as on the CPU."""
    ps, gs, ms, vs, ws, steps = many_tensors(kind, seed_of("many tensors", kind))
    dtypes, want = LIST_DTYPES[kind], list_launches(LIST_DTYPES[kind], LIST_SIZES)
    calls = {
        "adam_step_": ("adam_step_", ps, gs, ms, vs, ws, 1e-2, 0.9, 0.999, 1e-8, 0.1, 0.3, 0.05, True, False),
        "adam_step_capturable_": ("adam_step_capturable_", ps, gs, ms, vs, [], steps, 1e-3, None, 0.9, 0.999, 1e-8,
                                  0.01, False, True),
        "sgd_step_": ("sgd_step_", ps, gs, ms, 0.05, 0.9, 0.1, 0.01, True, False, False),
        "clip_scale_": ("clip_scale_", gs, torch.tensor(7.5, dtype=F32), 0.5, 1e-6),
    }
    for name, (op, *args) in calls.items():
        before = launches()
        check_op(op, *args, context=f"{kind}, {len(ps)} tensors")
        assert launches() - before == want, f"{name}: {launches() - before} launches, expected {want}"
    before = launches()
    check_op("sum_squares", gs, True, context=f"{kind}, {len(gs)} tensors")
    assert launches() - before == 2 * want + 2, "sum of squares: two list kernels, decide and finish"


def test_sum_squares_tie_across_launches():
    """The float32 tie 1 + 2^-24 spread over 70 tensors in three launches: tier 1 cannot decide, and every launch's
    blocks add their exact accumulators into the one scratch."""
    tensors = [torch.zeros(5000) for _ in range(70)]
    tensors[0][0] = 1.0
    for i in range(1, 65):
        tensors[i][i * 17] = 2.0**-15  # 64 squares of 2^-30: 2^-24 in all
    for nudge in (None, 2.0**-40, -(2.0**-40)):
        if nudge is not None:
            tensors[69][4999] = abs(nudge) ** 0.5
            if nudge < 0:
                tensors[64][100] = 0.0  # one square of 2^-30 fewer: just below the tie
        check_op("sum_squares", tensors, False, context=f"tie, nudge={nudge}")
        check_op("sum_squares", tensors, True, context=f"tie, nudge={nudge}, sqrt")


def test_sum_squares():
    """Lists of tensors of every dtype, sizes from empty to several 16 Ki-element chunks, NaN and inf, the
    float32 tie 1 + 2^-24 (tier 1 undecided: the exact per-block accumulators merged by atomics), with and
    without the square root."""
    g = generator(41)
    big = wide_values((1 << 17,), F32, 4)
    lists = {
        "mixed": [wide_values((70, 33), BF16, 1), torch.empty(0), wide_values((257,), F16, 2), big],
        "one element": [torch.tensor([3.0])],
        "empty": [torch.empty(0), torch.empty((3, 0), dtype=BF16)],
        "nan": [big, torch.tensor([1.0, NAN, 2.0])],
        "inf": [torch.tensor([INF, 1.0], dtype=BF16), big],
        "huge": [torch.tensor([3e38, -3e38, 1e30]), torch.tensor([6e4], dtype=F16)],
        "tie": [torch.tensor([1.0]), torch.tensor([2.0**-12])],
        "tie and more": [torch.tensor([1.0]), torch.tensor([2.0**-12]), torch.tensor([2.0**-30])],
        "subnormal": [torch.tensor([1e-40, -1e-41]), torch.tensor([2.0**-126])],
        "random": [random_values((40000,), F32, g, spread=10), random_values((30000,), BF16, g, spread=10)],
    }
    for dtype in DTYPES:  # a tie spread over a large tensor: squares of many chunks and blocks sum to the tie
        spread = torch.zeros(300_000, dtype=dtype)
        spread[::73][:4096] = 2.0**-18 if dtype != F16 else 2.0**-9
        one = torch.ones(1, dtype=dtype) if dtype != F16 else torch.full((1,), 2.0**9, dtype=dtype)
        nudge = torch.tensor([2.0**-20 if dtype != F16 else 2.0**-14], dtype=dtype)
        lists[f"spread tie {name_of(dtype)}"] = [spread, one]
        lists[f"spread tie nudged {name_of(dtype)}"] = [spread, one, nudge]
    for name, tensors in lists.items():
        for take_sqrt in (False, True):
            check_op("sum_squares", tensors, take_sqrt, context=f"{name} sqrt={take_sqrt}")


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "-".join(name_of(t) for t in d))
def test_clip_scale(dtypes):
    """The clip coefficient read from the device's total norm: above the maximum (coef < 1: every gradient
    rounded, subnormal results), below it (coef 1: only NaNs rewritten), a NaN or infinite total."""
    _, grads, _, _, _ = optim_tensors(dtypes, seed_of("clip", dtypes))
    for total in (0.0, 0.25, 1.0, 3.0, 1e30, 1e-30, INF, NAN):
        for max_norm in (0.5, 1e-3):
            check_op("clip_scale_", grads, torch.tensor(total, dtype=F32), max_norm, 1e-6,
                     context=f"total={total} max_norm={max_norm}")
    check_op("clip_scale_", [torch.empty(0)], torch.tensor(2.0), 1.0, 1e-6, context="empty", expect_launch=False)
