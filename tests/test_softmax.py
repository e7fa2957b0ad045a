"""carbon.softmax / carbon.log_softmax (docs/contract.md §8), forward and
backward, compared bit for bit with the exact reference of
tests/softmax_reference.py: every input / output dtype, dims and layouts,
row lengths 1 to 5000, special values, masked rows, sums that land on (or
next to) a float32 tie, batch / thread / permutation invariance, the
custom-op machinery (opcheck, torch.compile, meta tensors) and the errors.
Also a loose (not bitwise) sanity check against torch.softmax."""

import math
import random

import numpy as np
import pytest
import torch

import carbon
from data import BF16, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, generator, random_values, seed_of
from oracle import as_bits, assert_bits_equal, fmt_of, is_midpoint
from softmax_reference import (
    RowInfo, log_softmax_backward_bits, log_softmax_bits, softmax_backward_bits, softmax_bits,
)

pytestmark = pytest.mark.skipif(not hasattr(carbon, "softmax"), reason="carbon.softmax not built yet")

INF, NAN = math.inf, math.nan
OPS = {"softmax": (carbon.softmax, softmax_bits), "log_softmax": (carbon.log_softmax, log_softmax_bits)}
BACKWARD = {"softmax": softmax_backward_bits, "log_softmax": log_softmax_backward_bits}
F32_MAX = (2 - 2.0**-23) * 2.0**127


def check(op: str, x: torch.Tensor, dim: int, dtype=None, context: str = ""):
    fn, ref = OPS[op]
    out = fn(x, dim, dtype=dtype)
    assert_bits_equal(out, ref(x, dim, dtype), f"{op} {context} {x.dtype}->{dtype} dim={dim}",
                      dtype=x.dtype if dtype is None else dtype)
    return out


def softmax_values(shape, dtype, g, wide=False):
    """Logits: normal samples times 2^e; e in [-3, 3] (moderate), or in
    [-20, 20] for `wide` rows (very peaked rows, huge differences)."""
    return random_values(shape, dtype, g, spread=(20 if wide else 3) if dtype != F16 else 3)


# ---------------------------------------------------------------- random rows, every dtype pair, every length

LENGTHS = (1, 2, 7, 100, 1000, 5000)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_random_rows(op, in_dtype, out_dtype):
    g = generator(seed_of(op, str(in_dtype), str(out_dtype)))
    for n in LENGTHS:
        if n == 5000 and out_dtype not in (None, F32):
            continue  # (the longest rows once per input dtype: the reference is Python)
        rows = max(1, 2000 // n) if n < 5000 else 1
        for wide in (False, True):
            x = softmax_values((min(rows, 6), n), in_dtype, g, wide)
            check(op, x, 1, out_dtype, f"n={n} wide={wide}")


@pytest.mark.parametrize("op", OPS)
def test_values_of_every_magnitude(op):
    """Logits spread over float32's whole exponent range, subnormals included:
    RN32(x - m) overflows to -inf, underflows, is exact or not."""
    rng = random.Random(7)
    rows = []
    for _ in range(12):
        row = []
        for _ in range(33):
            e = rng.choice([rng.randint(-149, -126), rng.randint(-126, 127), rng.randint(-3, 6), rng.randint(95, 127)])
            v = float(np.float32(rng.uniform(1, 2) * 2.0**e))
            row.append(v if rng.random() < 0.5 else -v)
        rows.append(row)
    rows.append([1e30, -1e30, 0.0, 1.0, 3e38, -3e38, 2.0**-149, -(2.0**-149)] + [0.0] * 25)
    rows.append([-1e30, -1e30 * (1 + 2.0**-23), -1e30 * (1 - 2.0**-24)] + [-3e38] * 30)
    rows.append([F32_MAX, -F32_MAX] + [2.0**-130] * 31)
    rows.append([2.0**-149 * k for k in range(33)])  # subnormal logits only
    x = exact_tensor([[float(np.float32(v)) for v in r] for r in rows], F32)
    for out_dtype in (None, BF16, F16):
        check(op, x, 1, out_dtype, "magnitudes")
        check(op, x.to(BF16), -1, out_dtype, "magnitudes bf16")


# ---------------------------------------------------------------- special values, masks, empty tensors


SPECIAL_ROWS = [
    [1.0, 2.0, -INF, 0.5],  # partially masked
    [-INF, -INF, -INF, -INF],  # fully masked
    [-INF, 3.0, -INF, -INF],  # one survivor: softmax 1, log_softmax 0
    [1.0, NAN, 2.0, 3.0],
    [INF, 1.0, 2.0, 3.0],
    [INF, INF, INF, INF],
    [-INF, INF, -INF, 0.0],
    [NAN, -INF, -INF, -INF],
    [0.0, -0.0, 0.0, -0.0],
    [-0.0, -0.0, -1.0, -INF],
    [65280.0, -65280.0, 1.0, -INF],
    [2.0**-24, -(2.0**-24), 2.0**-14, -INF],
]


def special_tensor(dtype):
    """SPECIAL_ROWS in `dtype` (NaNs set after the cast: torch's vectorized
    cast to bfloat16 may give them the sign bit; the kernels ignore it)."""
    nan = torch.tensor(SPECIAL_ROWS).isnan()
    x = exact_tensor([[0.0 if v != v else v for v in r] for r in SPECIAL_ROWS], dtype)
    return x.masked_fill(nan, NAN)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_special_values(op, in_dtype, out_dtype):
    x = special_tensor(in_dtype)
    out = check(op, x, 1, out_dtype, "specials")
    f = fmt_of(out.dtype)
    bits = as_bits(out)
    assert (bits[3:6] == torch.tensor(f.nan_bits).to(f.bits_dtype)).all(), "NaN / +inf rows: canonical NaN"
    if op == "softmax":
        assert (bits[1] == 0).all(), "fully masked row: +0"
        assert out[2].tolist() == [0.0, 1.0, 0.0, 0.0]
    else:
        assert out[1].tolist() == [-INF] * 4, "fully masked row: -inf"
        assert out[2].tolist() == [-INF, 0.0, -INF, -INF]
    # Along dim 0, with the specials spread over columns.
    check(op, x.t().contiguous(), 0, out_dtype, "specials dim 0")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_masked_rows_nan(op, in_dtype, out_dtype):
    """masked_rows_nan=True (what carbon.enable asks for torch's _softmax / _log_softmax): a row of -inf only is
    the canonical NaN (0/0) instead of 0 / -inf, along any dim; every other row, the NaN and +inf rows included,
    keeps the bits that test_special_values and the oracle tests check for the default."""
    x = special_tensor(in_dtype)
    for t, dim in ((x, 1), (x.t().contiguous(), 0)):
        fn = getattr(torch.ops.carbon, op)
        out, default = fn(t, dim, out_dtype, True), fn(t, dim, out_dtype)
        f = fmt_of(out.dtype)
        masked = t.isneginf().all(dim, keepdim=True).expand_as(t)
        assert masked.any()
        bits = as_bits(out)
        assert (bits[masked] == torch.tensor(f.nan_bits).to(f.bits_dtype)).all(), "masked rows: canonical NaN"
        assert torch.equal(bits[~masked], as_bits(default)[~masked]), "the other rows are unchanged"
    # (opcheck compares outputs with NaN != NaN: a row without specials checks the schema, fake and autograd)
    torch.library.opcheck(getattr(torch.ops.carbon, op), (torch.randn(3, 5, requires_grad=True), 1, None, True))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,dim", [((0, 5), 1), ((0, 5), 0), ((5, 0), 1), ((5, 0), 0), ((2, 0, 3), -1), ((0,), 0)])
def test_empty(op, shape, dim):
    fn, _ = OPS[op]
    for dtype in (None, BF16):
        x = torch.empty(shape, dtype=F32)
        out = fn(x, dim, dtype=dtype)
        assert out.shape == x.shape and out.dtype == (dtype or F32)
        x = x.requires_grad_()
        fn(x, dim, dtype=dtype).sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


# ---------------------------------------------------------------- dims and layouts


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dims_and_layouts(op, dtype):
    g = generator(11)
    x = softmax_values((3, 4, 5), dtype, g)
    for dim in (0, 1, 2, -1, -2, -3):
        check(op, x, dim, None, "3-D")
    big = softmax_values((6, 10, 8), dtype, g)
    check(op, big.transpose(0, 2), 1, None, "transposed")
    check(op, big[::2, 1::3], -1, F32, "strided")
    check(op, big.permute(2, 0, 1), 0, None, "permuted")
    check(op, big[:, 3], 0, None, "a column")
    check(op, big.expand(2, 6, 10, 8)[:, :, :, 2], 1, None, "expanded")
    scalar = exact_tensor(2.5, dtype)
    for dim in (0, -1):
        out = check(op, scalar, dim, None, "0-dim")
        assert out.shape == () and out.item() == (1.0 if op == "softmax" else 0.0)
    check(op, softmax_values((9,), dtype, g), 0, None, "1-D")
    out = OPS[op][0](x, dim=1)  # keyword dim
    assert torch.equal(as_bits(out), OPS[op][1](x, 1))
    raw = getattr(torch.ops.carbon, op)
    assert torch.equal(as_bits(raw(x, 2, None)), OPS[op][1](x, 2))
    assert torch.equal(as_bits(raw.default(x, 0, F16)), OPS[op][1](x, 0, F16))


# ---------------------------------------------------------------- ties: S exactly on (or just past) a float32 midpoint


def tie_row(n_max: int, ks, tiny: int, m: float):
    """A row whose e_j are exactly known: n_max entries equal to the maximum m
    (e = 1), entries m - k 2^-24 (e = EXP(-k 2^-24) = 1 - k 2^-24 exactly for
    k < 2^12, checked), and `tiny` entries m - 100 (0 < e < 2^-120: a nudge)."""
    row = [m] * n_max + [m - k * 2.0**-24 for k in ks] + [m - 100.0] * tiny
    return row


def split(K: int, parts: int, rng) -> list:
    """K as `parts` nonnegative integers of at most 255 (for 8-bit formats)."""
    ks = [0] * parts
    for i in range(K):
        j = rng.randrange(parts)
        while ks[j] >= 255:
            j = (j + 1) % parts
        ks[j] += 1
    return ks


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype", DTYPES)
def test_sum_on_a_float32_tie(op, in_dtype):
    rng = random.Random(3)
    up = down = 0
    rows = []
    for n in (2, 3, 5, 17, 100, 1000):
        a = math.floor(math.log2(n - 2.0**-10))
        for odd in (1, 3, 5, 7):
            K = 2**a * odd  # n - K 2^-24 is a midpoint of [2^a, 2^(a+1))
            if K > 255 * (n - 1):
                continue
            ks = split(K, n - 1, rng)
            for m in (0.0, 1.0, -0.5) if in_dtype == F32 else (0.0,):
                for tiny in (0, 1, 7):
                    row = tie_row(1, ks, tiny, m)
                    x = exact_tensor(row, in_dtype)  # (asserts every logit is exact in in_dtype)
                    info = RowInfo(row)
                    # The construction: every e_j is exact and the main terms sum to a tie.
                    assert [float(e) for e in info.e[: n]] == [1.0 - k * 2.0**-24 for k in [0] + ks]
                    main = info.exact_sum - sum(map(float, info.e[n:]))
                    assert main == n - K * 2.0**-24 and is_midpoint(main, F32), (n, K)
                    assert tiny == 0 or 0 < float(info.e[-1]) < 2.0**-120
                    below = info.S < main if tiny == 0 else None
                    if tiny == 0:
                        up, down = up + (not below), down + below
                    else:
                        assert info.S > main, "a positive nudge past a tie rounds up"
                    rows.append((x, f"n={n} K={K} m={m} tiny={tiny}"))
    assert up >= 3 and down >= 3, "ties rounding each way"
    for x, context in rows:
        for out_dtype in (None, F32, BF16) if in_dtype == F32 else (None, F32):
            check(op, x, 0, out_dtype, "tie " + context)
    # The ties also in a batch (rows of different lengths padded with -inf).
    width = 1000
    batch = torch.stack([torch.cat([x, torch.full((width - x.numel(),), -INF, dtype=in_dtype)]) for x, _ in rows[:40]])
    check(op, batch, 1, None, "tie batch")


def test_tie_decides_outputs():
    """The ties are visible in the outputs (n = 2, float32)."""
    cases = [  # (k, nudged, S, softmax)
        (1, False, 2.0, [0.5, 0.4999999701976776]),  # e = [1, 1 - 2^-24]: S = 2 - 2^-24, a tie -> 2 (even)
        (1, True, 2.0, [0.5, 0.4999999701976776]),
        (3, False, 2.0 - 2.0**-22, [0.5000000596046448, 0.4999999701976776]),  # tie -> 2 - 2^-22 (even)
        (3, True, 2.0 - 2.0**-23, [0.5000000596046448, 0.4999999403953552]),  # nudged: up (the fp64 sum is on the tie)
    ]
    for k, nudged, S, expected in cases:
        row = tie_row(1, [k], int(nudged), 0.0)
        assert RowInfo(row).S == S, (k, nudged)
        out = carbon.softmax(exact_tensor(row, F32), 0)
        assert out[:2].tolist() == expected, (k, nudged)
        lsm = carbon.log_softmax(exact_tensor(row, F32), 0)
        assert_bits_equal(lsm, log_softmax_bits(exact_tensor(row, F32), 0), f"log_softmax tie k={k} nudged={nudged}")


# ---------------------------------------------------------------- invariance: batch, threads, permutation


@pytest.mark.parametrize("op", OPS)
def test_batch_invariance(op):
    fn, ref = OPS[op]
    g = generator(5)
    batch = softmax_values((1000, 64), F32, g)
    batch[::7, ::3] = -INF
    batch[5] = -INF
    full = as_bits(fn(batch, 1))
    for i in (0, 5, 17, 500, 999):
        alone = as_bits(fn(batch[i : i + 1].clone(), 1))
        assert torch.equal(alone, full[i : i + 1]), f"row {i} alone differs from row {i} in a batch of 1000"
    assert torch.equal(as_bits(fn(batch[:3], 1)), full[:3])
    assert torch.equal(ref(batch[:4], 1), full[:4])
    t = fn(batch.t().contiguous(), 0)  # the same rows laid out along dim 0
    assert torch.equal(as_bits(t).t(), full)


@pytest.mark.parametrize("op", OPS)
def test_thread_count_invariance(op, restore_num_threads):
    fn, _ = OPS[op]
    g = generator(6)
    x = softmax_values((64, 3000), F32, g, wide=True).requires_grad_()
    y_ref = x[:2].detach()
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x.grad = None
        y = fn(x, 1)
        y.backward(softmax_values(y.shape, F32, generator(7)))
        results.append((as_bits(y), as_bits(x.grad)))
    assert torch.equal(results[0][0], results[1][0]), "forward differs between 1 and 2 threads"
    assert torch.equal(results[0][1], results[1][1]), "backward differs between 1 and 2 threads"
    assert torch.equal(results[0][0][:2], OPS[op][1](y_ref, 1))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_permutation_invariance(op, dtype):
    fn, _ = OPS[op]
    g = generator(8)
    for n in (7, 100, 2000):
        x = softmax_values((3, n), dtype, g, wide=n == 100)
        out = as_bits(fn(x, 1))
        for _ in range(2):
            perm = torch.randperm(n, generator=g)
            assert torch.equal(as_bits(fn(x[:, perm], 1)), out[:, perm]), f"n={n}"


# ---------------------------------------------------------------- gradients


def leaf(x):
    return x.detach().clone().requires_grad_()


def check_grad(op, x, dim, dtype, grad, context=""):
    fn, _ = OPS[op]
    xl = leaf(x)
    y = fn(xl, dim, dtype=dtype)
    y.backward(grad)
    expected = BACKWARD[op](grad.to(y.dtype) if grad.dtype != y.dtype else grad, y.detach(), dim, x.dtype)
    assert_bits_equal(xl.grad, expected, f"d{op} {context} {x.dtype}->{dtype} dim={dim}", dtype=x.dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_gradients(op, in_dtype, out_dtype):
    g = generator(seed_of("grad", op, str(in_dtype), str(out_dtype)))
    for shape, dim in (((4, 7), 1), ((3, 100), -1), ((50, 3), 0), ((2, 3, 4), 1), ((1, 1000), 1)):
        x = softmax_values(shape, in_dtype, g, wide=shape[-1] == 7)
        odt = out_dtype or in_dtype
        grad = random_values(shape, odt, g, spread=3)
        check_grad(op, x, dim, out_dtype, grad, f"{shape}")
    # Specials: masked / NaN / +inf rows, infinite and NaN incoming gradients.
    x = special_tensor(in_dtype)
    odt = out_dtype or in_dtype
    grad = random_values(x.shape, odt, g, spread=2)
    check_grad(op, x, 1, out_dtype, grad, "specials")
    grad[0, 1], grad[2, 0], grad[8, 3] = INF, NAN, -INF
    check_grad(op, x, 1, out_dtype, grad, "special grads")


def test_gradient_of_a_float32_gradient_into_bf16_output():
    """An incoming gradient of another dtype is rounded to y's dtype first."""
    x = random_values((3, 9), F32, generator(9)).requires_grad_()
    y = carbon.softmax(x, 1, dtype=BF16)
    g = random_values((3, 9), F32, generator(10))
    (y.float() * g).sum().backward()  # the gradient reaching y is (bf16) g rounded through .float()'s backward
    expected = softmax_backward_bits(g.to(BF16), y.detach(), 1, F32)
    assert_bits_equal(x.grad, expected, "softmax grad through a dtype change")


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_sums_on_ties(dtype):
    """D = RN32(sum g_k y_k) and G = RN32(sum g_k) on a float32 tie, with and
    without a nudge the fp64 sum cannot see (raw ops, chosen y and g)."""
    for nudge in (0.0, 2.0**-60 if dtype != F16 else 2.0**-24):
        if dtype == F16:  # (float16 cannot hold 2^-60: a tie at 2^30 instead, nudged by 2^-48)
            y = exact_tensor([[2.0**15, 1.0, 2.0**-24 if nudge else 0.0, 0.5]], dtype)
            g = exact_tensor([[2.0**15, 2.0**6, nudge, 0.0]], dtype)
        else:
            y = exact_tensor([[1.0, 2.0**-24, nudge, 0.5]], dtype)
            g = exact_tensor([[1.0, 1.0, 1.0, 0.0]], dtype)
        for out in DTYPES:
            got = torch.ops.carbon.softmax_backward(g, y, 1, out)
            assert_bits_equal(got, softmax_backward_bits(g, y, 1, out), f"softmax_backward tie nudge={nudge}", dtype=out)
        if dtype != F16:
            D = 1.0 if nudge == 0 else 1.0 + 2.0**-23
            assert torch.ops.carbon.softmax_backward(g, y, 1, F32)[0, 0].item() == 1.0 - D
        yl = exact_tensor([[0.0, -1.0, -2.0, -0.5]], dtype)
        gl = exact_tensor([[1.0, 2.0**-24, nudge, -0.0] if dtype != F16 else [2.0**15, 2.0**-9, nudge, -0.0]], dtype)
        for out in DTYPES:
            got = torch.ops.carbon.log_softmax_backward(gl, yl, 1, out)
            assert_bits_equal(got, log_softmax_backward_bits(gl, yl, 1, out), f"log_softmax_backward tie nudge={nudge}",
                              dtype=out)
        G = 1.0 if nudge == 0 else 1.0 + 2.0**-23
        if dtype != F16:
            assert torch.ops.carbon.log_softmax_backward(gl, yl, 1, F32)[0, 0].item() == 1.0 - G


def test_backward_long_rows_with_cancellation():
    """Sums of g_k y_k that cancel to (almost) nothing: the fp64 tier fails."""
    g0 = generator(12)
    y = random_values((2, 4000), F32, g0, spread=10)
    g = random_values((2, 4000), F32, g0, spread=10)
    g[:, 2000:] = -g[:, :2000]
    y[:, 2000:] = y[:, :2000]
    y[0, 77] = 2.0**-40
    g[1, 5] = 1e-20
    for op, raw in (("softmax", torch.ops.carbon.softmax_backward), ("log_softmax", torch.ops.carbon.log_softmax_backward)):
        yy = -y.abs() if op == "log_softmax" else y
        assert_bits_equal(raw(g, yy, 1, F32), BACKWARD[op](g, yy, 1, F32), f"{op}_backward cancellation")


def test_backward_rows_without_gradient():
    """Rows whose terms are all ±0 (a padded position's gradient): D is an exact zero, −0 iff every term is −0,
    decided without the exact tiers (the GPU's block-wide flag, the CPU's one pass); against the reference."""
    g0 = generator(13)
    y = random_values((4, 300), F32, g0, spread=10).abs()
    g = torch.zeros(4, 300)
    g[1] = -0.0  # every term −0·y = −0... y > 0: g·y = −0
    g[2, ::2] = -0.0  # mixed zeros: +0
    g[3] = -0.0
    y[3, 7] = 0.0  # (−0)·(+0) = −0 still
    for op, raw in (("softmax", torch.ops.carbon.softmax_backward), ("log_softmax", torch.ops.carbon.log_softmax_backward)):
        yy = -y if op == "log_softmax" else y
        for out in DTYPES:
            assert_bits_equal(raw(g, yy, 1, out), BACKWARD[op](g, yy, 1, out), f"{op}_backward, zero rows", dtype=out)


# ---------------------------------------------------------------- custom-op machinery


@pytest.mark.parametrize("op", OPS)
def test_opcheck_forward(op):
    opdef = getattr(torch.ops.carbon, op).default
    g = generator(13)
    for x, dim, dtype in ((softmax_values((3, 5), F32, g), 1, None), (softmax_values((2, 3, 4), BF16, g), -1, F32),
                          (softmax_values((6,), F16, g), -1, BF16)):
        for inp in (x, leaf(x)):
            torch.library.opcheck(opdef, (inp, dim, dtype))


@pytest.mark.parametrize("op", OPS)
def test_opcheck_backward(op):
    opdef = getattr(torch.ops.carbon, op + "_backward").default
    g = generator(14)
    for dtype, in_dtype in ((F32, F32), (BF16, F32), (F16, F16)):
        x = softmax_values((3, 6), dtype, g)
        y = OPS[op][0](x, 1)
        torch.library.opcheck(opdef, (random_values((3, 6), dtype, g, spread=2), y, 1, in_dtype))


def test_opcheck_cross_entropy():
    g = generator(15)
    x = softmax_values((5, 7), F32, g)
    t = torch.tensor([0, 6, -100, 3, 2])
    for reduction in (0, 1, 2):
        for eps in (0.0, 0.1):
            for inp in (x, leaf(x), leaf(x.to(BF16))):
                torch.library.opcheck(torch.ops.carbon.cross_entropy.default, (inp, t, reduction, -100, eps))
            _, lp, count = torch.ops.carbon.cross_entropy(x, t, reduction, -100, eps)
            grad = torch.ones(5) if reduction == 0 else torch.tensor(0.5)
            torch.library.opcheck(torch.ops.carbon.cross_entropy_backward.default,
                                  (grad, lp, t, count, reduction, -100, eps, BF16))


def test_torch_compile_fullgraph_matches_eager():
    def f(x, t):
        return carbon.softmax(x, 1), carbon.log_softmax(x, -1, dtype=BF16), carbon.cross_entropy(x, t, label_smoothing=0.1)

    g = generator(16)
    x = softmax_values((6, 9), F32, g)
    x[2, :4] = -INF
    t = torch.tensor([0, 8, 3, -100, 4, 4])
    # (dim=-1 here: softmax over another dim is test_torch_compile_over_a_leading_dim)
    eager = f(x, t)
    compiled = torch.compile(f, fullgraph=True)(x, t)
    for name, e, c in zip(("softmax", "log_softmax", "cross_entropy"), eager, compiled):
        assert e.dtype == c.dtype and e.shape == c.shape, name
        assert torch.equal(as_bits(e), as_bits(c)), f"compiled {name} differs from eager"
    assert_bits_equal(eager[0], softmax_bits(x, 1))

    def h(x, t):
        return carbon.cross_entropy(carbon.log_softmax(x, 1) * 2, t, reduction="sum") + carbon.softmax(x, 1, dtype=BF16).sum()

    xe, xc = leaf(x), leaf(x)
    h(xe, t).backward()
    torch.compile(h, fullgraph=True)(xc, t).backward()
    assert torch.equal(as_bits(xe.grad), as_bits(xc.grad)), "compiled backward differs from eager"


@pytest.mark.parametrize("op", OPS)
def test_output_strides_match_the_fake(op):
    """The real kernels must return what the fake (meta) kernels promise, or
    torch.compile / opcheck fail. Softmax over a dim that is not the last
    returns rows.movedim(-1, dim) (a non-contiguous tensor) while the fake
    returns a contiguous one."""
    fn, _ = OPS[op]
    raw_backward = getattr(torch.ops.carbon, op + "_backward")
    x = softmax_values((2, 3, 4), F32, generator(18))
    bad = []
    for dim in (0, 1, 2):
        real, fake = fn(x, dim), fn(x.to("meta"), dim)
        if real.stride() != fake.stride():
            bad.append(f"{op} dim={dim}: strides {real.stride()} (real) vs {fake.stride()} (fake)")
        dx_real = raw_backward(torch.ones_like(real), real, dim, F32)
        dx_fake = raw_backward(torch.ones_like(fake), fake, dim, F32)
        if dx_real.stride() != dx_fake.stride():
            bad.append(f"{op}_backward dim={dim}: strides {dx_real.stride()} (real) vs {dx_fake.stride()} (fake)")
    assert not bad, "; ".join(bad)
    torch.library.opcheck(getattr(torch.ops.carbon, op).default, (x, 0, None))


def test_torch_compile_over_a_leading_dim():
    def f(x):
        return carbon.softmax(x, 0), carbon.log_softmax(x, 0, dtype=BF16)

    x = softmax_values((6, 9), F32, generator(19))
    eager, compiled = f(x), torch.compile(f, fullgraph=True)(x)
    for e, c in zip(eager, compiled):
        assert torch.equal(as_bits(e), as_bits(c)), "compiled differs from eager"


def test_meta_tensors():
    for op in OPS:
        fn, _ = OPS[op]
        x = torch.empty((3, 4, 5), device="meta", dtype=BF16)
        out = fn(x, 1, dtype=F32)
        assert out.device.type == "meta" and out.shape == (3, 4, 5) and out.dtype == F32
        raw = getattr(torch.ops.carbon, op + "_backward")
        dx = raw(torch.empty((3, 4), device="meta"), torch.empty((3, 4), device="meta"), -1, F16)
        assert dx.shape == (3, 4) and dx.dtype == F16
        with pytest.raises(ValueError, match=f"carbon.{op}: dim 3"):
            fn(x, 3)
    loss, lp, count = torch.ops.carbon.cross_entropy(torch.empty((4, 10), device="meta"),
                                                      torch.empty(4, dtype=torch.int64, device="meta"), 0)
    assert loss.shape == (4,) and lp.shape == (4, 10) and lp.dtype == F32 and count.shape == ()
    loss = carbon.cross_entropy(torch.empty((4, 10, 3), device="meta", dtype=F16),
                                torch.empty((4, 3), dtype=torch.int64, device="meta"), "none")
    assert loss.shape == (4, 3) and loss.dtype == F16


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("op", OPS)
def test_errors(op):
    fn, _ = OPS[op]
    x = torch.zeros(3, 4)
    for bad in (torch.float64, torch.int32, torch.int64):
        with pytest.raises(TypeError, match=f"carbon.{op}: x has dtype"):
            fn(x.to(bad), 1)
    with pytest.raises(TypeError, match=f"carbon.{op}: output dtype"):
        fn(x, 1, dtype=torch.float64)
    with pytest.raises(TypeError, match=f"carbon.{op}: output dtype"):
        fn(x, 1, dtype=torch.int32)
    for dim in (2, -3, 100):
        with pytest.raises(ValueError, match=f"carbon.{op}: dim {dim} is out of range"):
            fn(x, dim)
    with pytest.raises(ValueError, match="out of range"):
        fn(torch.tensor(1.0), 1)
    raw = getattr(torch.ops.carbon, op + "_backward")
    y = fn(x, 1)
    with pytest.raises(ValueError, match=f"carbon.{op}_backward: grad has shape"):
        raw(torch.zeros(3, 5), y, 1, F32)
    with pytest.raises(TypeError, match=f"carbon.{op}_backward: grad has dtype"):
        raw(torch.zeros(3, 4, dtype=BF16), y, 1, F32)
    with pytest.raises(TypeError, match=f"carbon.{op}_backward"):
        raw(torch.zeros(3, 4, dtype=torch.float64), y.double(), 1, F32)
    with pytest.raises(TypeError, match=f"carbon.{op}_backward: output dtype"):
        raw(torch.zeros(3, 4), y, 1, torch.float64)
    with pytest.raises(ValueError, match=f"carbon.{op}_backward: dim"):
        raw(torch.zeros(3, 4), y, 2, F32)


# ---------------------------------------------------------------- sanity against torch (not bitwise)


@pytest.mark.parametrize("dtype", DTYPES)
def test_close_to_torch(dtype):
    g = generator(17)
    x = softmax_values((8, 500), dtype, g)
    for dim in (0, 1):
        for ours, theirs in ((carbon.softmax, torch.softmax), (carbon.log_softmax, torch.log_softmax)):
            a = ours(x, dim, dtype=F32).double()
            b = theirs(x.double(), dim)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-7)  # (d_j and S are float32)
            c = ours(x, dim).double()  # in x's dtype: within an ulp or two of it
            tol = {F32: 1e-5, BF16: 2**-7, F16: 2**-10}[dtype]
            torch.testing.assert_close(c, b, rtol=tol, atol=1e-7 if dtype == F16 else 2e-7)
    xl = leaf(x.float())
    xt = leaf(x.float())
    gy = random_values(x.shape, F32, g, spread=2)
    carbon.log_softmax(xl, 1).backward(gy)
    torch.log_softmax(xt, 1).backward(gy)
    torch.testing.assert_close(xl.grad, xt.grad, rtol=1e-5, atol=1e-6)
    xl.grad = xt.grad = None
    carbon.softmax(xl, 1).backward(gy)
    torch.softmax(xt, 1).backward(gy)
    torch.testing.assert_close(xl.grad, xt.grad, rtol=1e-5, atol=1e-6)
