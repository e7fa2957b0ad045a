"""carbon.cross_entropy (docs/contract.md §8): the loss and its gradient
compared bit for bit with the exact reference of tests/softmax_reference.py
for every reduction, ignore_index, label smoothing, input layout ([C],
[N, C], [N, C, d...]) and logit dtype; sums and means on float32 ties;
batch / thread invariance; errors; a loose sanity check against
torch.nn.functional.cross_entropy."""

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import carbon
from data import BF16, DTYPES, F16, F32, exact_tensor, generator, random_values, seed_of
from oracle import as_bits, assert_bits_equal, bits_to_float, is_midpoint, round_bits
from softmax_reference import cross_entropy_bits, cross_entropy_grad_bits, row_losses

pytestmark = pytest.mark.skipif(not hasattr(carbon, "cross_entropy"), reason="carbon.cross_entropy not built yet")

INF, NAN = math.inf, math.nan
REDUCTIONS = ("none", "mean", "sum")
SMOOTHING = (0.0, 0.1, 1.0)


def logits(shape, dtype, g):
    return random_values(shape, dtype, g, spread=3)


def targets(n, C, g, ignored=(), ignore_index=-100):
    t = torch.randint(0, C, (n,), generator=g)
    for i in ignored:
        t[i] = ignore_index
    return t


def incoming(loss, g):
    """An incoming gradient for the loss: random values of the loss dtype."""
    return random_values(loss.shape, loss.dtype, g, spread=2)


def check(x, t, reduction, ignore_index=-100, eps=0.0, g=None, context=""):
    """Loss bits and input-gradient bits against the reference."""
    ctx = f"{context} {x.dtype} {tuple(x.shape)} {reduction} ignore={ignore_index} eps={eps}"
    xl = x.detach().clone().requires_grad_()
    loss = carbon.cross_entropy(xl, t, reduction, ignore_index, eps)
    assert_bits_equal(loss, cross_entropy_bits(x, t, reduction, ignore_index, eps), "loss " + ctx, dtype=x.dtype)
    grad = incoming(loss, g if g is not None else generator(1))
    loss.backward(grad)
    assert_bits_equal(xl.grad, cross_entropy_grad_bits(x, t, grad, reduction, ignore_index, eps), "grad " + ctx,
                      dtype=x.dtype)
    return loss, xl.grad


# ---------------------------------------------------------------- every reduction / smoothing / dtype


@pytest.mark.parametrize("eps", SMOOTHING)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions(dtype, reduction, eps):
    g = generator(seed_of(str(dtype), reduction, eps))
    for N, C, ignored in ((9, 13, (2, 5)), (1, 1, ()), (4, 2, (0,)), (3, 1000, (1,)), (40, 7, range(0, 40, 3))):
        x = logits((N, C), dtype, g)
        check(x, targets(N, C, g, ignored), reduction, eps=eps, g=g, context=f"N={N} C={C}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ignore_index(reduction):
    g = generator(2)
    x = logits((8, 5), F32, g)
    t = targets(8, 5, g)
    t[[1, 4]] = 3
    check(x, t, reduction, ignore_index=3, g=g, context="ignore a real class")
    check(x, t, reduction, ignore_index=3, eps=0.1, g=g, context="ignore a real class")
    t2 = t.clone()
    t2[0] = -100  # not ignored with ignore_index=3: out of range
    with pytest.raises(IndexError, match="carbon.cross_entropy: target -100"):
        carbon.cross_entropy(x, t2, reduction, ignore_index=3)
    # Every row ignored: mean NaN, sum +0, none zeros; zero gradient.
    t_all = torch.full((8,), -100)
    for eps in (0.0, 0.1):
        loss, grad = check(x, t_all, reduction, eps=eps, g=g, context="all ignored")
        if reduction == "mean":
            assert as_bits(loss).item() == 0x7FC00000, "mean over no rows: canonical NaN"
        else:
            assert (as_bits(loss) == 0).all(), "+0 losses"
        assert (as_bits(grad) == 0).all(), "+0 gradients"


@pytest.mark.parametrize("dtype", DTYPES)
def test_layouts(dtype):
    g = generator(3)
    # [C] logits with a 0-dim target.
    x = logits((11,), dtype, g)
    for reduction in REDUCTIONS:
        for eps in (0.0, 0.1):
            loss, grad = check(x, torch.tensor(4), reduction, eps=eps, g=g, context="[C]")
            assert loss.shape == () and grad.shape == (11,)
    # [N, C, d1, d2] logits with [N, d1, d2] targets (class dim 1).
    x = logits((3, 6, 4, 2), dtype, g)
    t = torch.randint(0, 6, (3, 4, 2), generator=g)
    t[1, 2, 0] = -100
    for reduction in REDUCTIONS:
        for eps in (0.0, 0.1):
            loss, grad = check(x, t, reduction, eps=eps, g=g, context="[N,C,d1,d2]")
            assert loss.shape == ((3, 4, 2) if reduction == "none" else ()) and grad.shape == x.shape
    # Non-contiguous logits.
    base = logits((7, 20), dtype, g)
    check(base[:, ::2], targets(7, 10, g), "mean", eps=0.1, g=g, context="strided")
    check(base.t()[:9].t(), targets(7, 9, g), "sum", g=g, context="transposed")
    # Positional and keyword calling conventions.
    x, t = logits((5, 4), dtype, g), targets(5, 4, g)
    assert torch.equal(as_bits(carbon.cross_entropy(x, t)), cross_entropy_bits(x, t, "mean"))
    assert torch.equal(as_bits(carbon.cross_entropy(x, t, reduction="none", label_smoothing=0.25)),
                       cross_entropy_bits(x, t, "none", -100, 0.25))


def test_empty_batch():
    for dtype in (F32, BF16):
        x = torch.empty((0, 5), dtype=dtype, requires_grad=True)
        t = torch.empty((0,), dtype=torch.int64)
        assert carbon.cross_entropy(x, t, "none").shape == (0,)
        assert as_bits(carbon.cross_entropy(x, t, "sum")).item() == 0
        mean = carbon.cross_entropy(x, t, "mean")
        assert math.isnan(mean.item())
        carbon.cross_entropy(x, t, "sum").backward()
        assert x.grad.shape == (0, 5)


# ---------------------------------------------------------------- special logits


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_logits(dtype):
    rows = [
        [0.0, -INF, 1.0, 2.0],  # partially masked, target on a live class
        [0.0, -INF, 1.0, 2.0],  # target on the masked class: loss +inf
        [-INF, -INF, -INF, -INF],  # fully masked: lsm -inf everywhere
        [1.0, NAN, 0.0, 0.0],
        [INF, 0.0, 0.0, 0.0],
        [0.0, -200.0, -200.0, -200.0],  # S = 1: loss +0
        [49152.0, -49152.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
    nan = torch.tensor(rows).isnan()
    x = exact_tensor([[0.0 if v != v else v for v in r] for r in rows], dtype).masked_fill(nan, NAN)
    t = torch.tensor([3, 1, 0, 2, 1, 0, 0, 2])
    g = generator(4)
    for reduction in REDUCTIONS:
        for eps in SMOOTHING:
            check(x, t, reduction, eps=eps, g=g, context="specials")
    losses = row_losses(x, t)
    assert losses[1] == INF and math.isnan(losses[3]) and losses[5] == 0.0
    assert math.copysign(1.0, losses[5]) == 1.0  # nll = 0 (-) lsm = 0 - (+0) = +0
    # Only the finite rows: every reduction finite.
    check(x[[0, 5, 6, 7]], t[[0, 5, 6, 7]], "mean", eps=0.1, g=g, context="finite specials")


# ---------------------------------------------------------------- exact reductions on ties


def test_sum_and_mean_on_float32_ties():
    """k rows [0, 0] (loss L = LOG(2) = 1453635 2^-21, odd) sum to k L, for k
    odd in [12, 23] an odd multiple of 2^-21 in [8, 16): a float32 tie (k is
    picked so that it rounds down, to even). 16 - k rows [0, -200] (loss +0)
    make the count 16, so the mean k L / 16 is a tie too. Then one of them
    replaced by a row of loss ~1.2e-7 (a quarter ulp) must round up."""
    t = torch.zeros(16, dtype=torch.int64)
    L = row_losses(exact_tensor([[0.0, 0.0]], F32), t[:1])[0]
    assert L == float(torch.log(torch.tensor(2.0))) and (L * 2**21) % 2 == 1
    k = next(k for k in range(13, 24, 2) if bits_to_float(round_bits(k * L, F32), F32) < k * L)
    x = exact_tensor([[0.0, 0.0]] * k + [[0.0, -200.0]] * (16 - k), F32)
    assert is_midpoint(k * L, F32) and is_midpoint(k * L / 16, F32)
    g = generator(5)
    for reduction in ("sum", "mean"):
        check(x, t, reduction, g=g, context="tie")
        check(x.to(BF16), t, reduction, g=g, context="tie bf16 logits")
    near = x.clone()
    near[15] = exact_tensor([0.0, -16.0], F32)
    nudge = row_losses(near[15:], t[15:])[0]
    assert 0 < nudge < 2.0**-21 / 2
    for reduction in ("sum", "mean"):
        check(near, t, reduction, g=g, context="near tie")
    a = carbon.cross_entropy(x, t, "sum").item()
    b = carbon.cross_entropy(near, t, "sum").item()
    assert a == k * L - 2.0**-21 and b == k * L + 2.0**-21, "the tie decides the result"
    a = carbon.cross_entropy(x, t, "mean").item()
    b = carbon.cross_entropy(near, t, "mean").item()
    assert a == (k * L - 2.0**-21) / 16 and b == (k * L + 2.0**-21) / 16


def test_label_smoothing_mean_on_ties():
    """sm = -RN32(sum_c lsm_c / C): with C = 2 (or 3) the exact mean of the
    log-probabilities is often a float32 tie; eps = 1 makes the loss sm
    itself, so each row's result shows how the tie was rounded."""
    g = generator(10)
    for C in (2, 3):
        x = logits((200, C), F32, g)
        t = targets(200, C, g)
        rows = [[float(v) for v in r] for r in carbon.log_softmax(x, 1).tolist()]
        ties = sum(is_midpoint(sum(map(Fraction, r)) / C, F32) for r in rows)
        assert ties >= 5, f"C={C}: only {ties} ties"
        for eps in (1.0, 0.1):
            check(x, t, "none", eps=eps, g=g, context=f"smoothing ties C={C}")


def test_mean_gradient_coefficient_is_rounded_once():
    """'mean': c = RN32(g / count), an exact quotient rounded once (count 3)."""
    x = logits((5, 4), F32, generator(6))
    t = torch.tensor([0, -100, 1, 2, -100])
    for gv in (1.0, 1.0 + 2.0**-23, 3.0, 2.0**-140, 7e-45, -5.0):
        xl = x.clone().requires_grad_()
        carbon.cross_entropy(xl, t, "mean").backward(torch.tensor(gv))
        expected = cross_entropy_grad_bits(x, t, torch.tensor(gv), "mean")
        assert_bits_equal(xl.grad, expected, f"mean grad g={gv}")


# ---------------------------------------------------------------- invariance


def test_batch_and_thread_invariance(restore_num_threads):
    g = generator(7)
    x = logits((1000, 50), F32, g)
    t = targets(1000, 50, g, ignored=range(0, 1000, 17))
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        xl = x.clone().requires_grad_()
        losses = carbon.cross_entropy(xl, t, "none", label_smoothing=0.1)
        mean = carbon.cross_entropy(xl, t, "mean", label_smoothing=0.1)
        (losses.sum() + mean).backward()
        results.append((as_bits(losses), as_bits(mean), as_bits(xl.grad)))
    for a, b in zip(*results):
        assert torch.equal(a, b), "1 vs 2 threads"
    for i in (0, 1, 500, 999):
        alone = carbon.cross_entropy(x[i : i + 1], t[i : i + 1], "none", label_smoothing=0.1)
        assert torch.equal(as_bits(alone), results[0][0][i : i + 1]), f"row {i} alone vs in a batch"
    assert_bits_equal(carbon.cross_entropy(x[:30], t[:30], "none", label_smoothing=0.1),
                      cross_entropy_bits(x[:30], t[:30], "none", -100, 0.1))


def test_long_rows():
    g = generator(8)
    x = logits((2, 50257), F32, g)
    t = torch.tensor([0, 50256])
    check(x, t, "mean", eps=0.1, g=g, context="50257 classes")
    check(x.to(BF16), t, "none", g=g, context="50257 classes")


# ---------------------------------------------------------------- errors


def test_errors():
    x = torch.zeros(4, 3)
    t = torch.tensor([0, 1, 2, 0])
    for bad in (torch.tensor([0, 1, 3, 0]), torch.tensor([0, -1, 2, 0]), torch.tensor([0, 1, 2, -101])):
        with pytest.raises(IndexError, match="carbon.cross_entropy: target .* out of bounds"):
            carbon.cross_entropy(x, bad)
        with pytest.raises(IndexError):
            carbon.cross_entropy(x, bad, "none", label_smoothing=0.1)
    with pytest.raises(TypeError, match="class-index targets"):
        carbon.cross_entropy(x, t.float())
    with pytest.raises(TypeError, match="class-index targets"):
        carbon.cross_entropy(x, torch.full((4, 3), 1 / 3))  # class probabilities
    with pytest.raises(TypeError, match="int64"):
        carbon.cross_entropy(x, t.int())
    with pytest.raises(TypeError, match="carbon.cross_entropy: input has dtype"):
        carbon.cross_entropy(x.double(), t)
    with pytest.raises(ValueError, match="reduction"):
        carbon.cross_entropy(x, t, "batchmean")
    for eps in (-0.1, 1.5):
        with pytest.raises(ValueError, match="label_smoothing"):
            carbon.cross_entropy(x, t, label_smoothing=eps)
    with pytest.raises(ValueError, match="target has shape"):
        carbon.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="target has shape"):
        carbon.cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="0-dim"):
        carbon.cross_entropy(torch.tensor(1.0), torch.tensor(0))
    raw = torch.ops.carbon.cross_entropy
    with pytest.raises(ValueError, match="carbon.cross_entropy: reduction"):
        raw(x, t, 3, -100, 0.0)
    with pytest.raises(ValueError, match="2-D"):
        raw(torch.zeros(2, 3, 4), t, 1, -100, 0.0)
    _, lp, count = raw(x, t, 1, -100, 0.0)
    back = torch.ops.carbon.cross_entropy_backward
    with pytest.raises(ValueError, match="grad has 4 elements, expected 1"):
        back(torch.ones(4), lp, t, count, 1, -100, 0.0, F32)
    with pytest.raises(TypeError, match="output dtype"):
        back(torch.tensor(1.0), lp, t, count, 1, -100, 0.0, torch.float64)
    with pytest.raises(ValueError, match="log_probs"):
        back(torch.tensor(1.0), lp.to(BF16), t, count, 1, -100, 0.0, F32)
    # (the kernels read target[i] of every row and count[0]: unchecked on CUDA)
    with pytest.raises(ValueError, match="target must be the int64"):
        back(torch.tensor(1.0), lp, t[:-1], count, 1, -100, 0.0, F32)
    with pytest.raises(ValueError, match="count must be"):
        back(torch.tensor(1.0), lp, t, count.reshape(1)[:0], 1, -100, 0.0, F32)


# ---------------------------------------------------------------- sanity against torch (not bitwise)


@pytest.mark.parametrize("dtype", DTYPES)
def test_close_to_torch(dtype):
    g = generator(9)
    x = logits((64, 100), dtype, g)
    t = targets(64, 100, g, ignored=(3, 7))
    for reduction in REDUCTIONS:
        for eps in SMOOTHING:
            ours = carbon.cross_entropy(x.float(), t, reduction, label_smoothing=eps)
            theirs = F.cross_entropy(x.double(), t, reduction=reduction, label_smoothing=eps)
            torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-6)
            mine = carbon.cross_entropy(x, t, reduction, label_smoothing=eps)  # in x's dtype
            tol = {F32: 1e-5, BF16: 2**-7, F16: 2**-10}[dtype]
            torch.testing.assert_close(mine.double(), theirs, rtol=tol, atol=1e-6)
            xa, xb = x.detach().float().clone().requires_grad_(), x.detach().double().requires_grad_()
            carbon.cross_entropy(xa, t, reduction, label_smoothing=eps).sum().backward()
            F.cross_entropy(xb, t, reduction=reduction, label_smoothing=eps).sum().backward()
            torch.testing.assert_close(xa.grad.double(), xb.grad, rtol=1e-5, atol=1e-7)
