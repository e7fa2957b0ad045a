"""F.multi_margin_loss (nn.MultiMarginLoss) under carbon.enable (docs/enable.md, carbon/_enable_margin.py): forward
and backward against an exact oracle of the documented steps (Fractions, one rounding per step), with p = 1 and 2,
a margin, class weights and every reduction; a row alone vs in the batch, 1 vs 2 threads; bfloat16."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import as_bits, round_value

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32


def rn(v) -> Fraction:
    return round_value(Fraction(v), F32)


def oracle(x: list, t: list, p: int, margin: float, w, reduction: str, g) -> tuple:
    """(loss values, gradient rows) of the documented definition."""
    n, c = len(x), len(x[0])
    losses, hinge = [], []
    for i in range(n):
        y = t[i]
        m = rn(margin)  # the margin as a float32 value, as torch's kernel takes it
        zs = [rn(rn(m - Fraction(x[i][y])) + Fraction(x[i][d])) for d in range(c)]
        hs = []
        for d in range(c):
            if d == y or zs[d] <= 0:
                hs.append(None)
                continue
            h = zs[d] if p == 1 else rn(zs[d] * zs[d])
            hs.append(rn(h * Fraction(w[y])) if w is not None else h)
        losses.append(rn(sum((h for h in hs if h is not None), Fraction(0)) / c))
        hinge.append(zs)
    if reduction == "mean":
        value = [rn(sum(losses, Fraction(0)) / n)]
    elif reduction == "sum":
        value = [rn(sum(losses, Fraction(0)))]
    else:
        value = losses
    s = rn(Fraction(1) / rn(n * c)) if reduction == "mean" else rn(Fraction(1) / c)
    grads = []
    for i in range(n):
        y, zs = t[i], hinge[i]
        ks = []
        for d in range(c):
            if d == y or zs[d] <= 0:
                ks.append(Fraction(0))
                continue
            k = s if p == 1 else rn(2 * s * zs[d])
            ks.append(rn(k * Fraction(w[y])) if w is not None else k)
        gi = Fraction(g[i] if reduction == "none" else g[0])
        row = [rn(k * gi) for k in ks]
        row[y] = rn(-rn(sum(ks, Fraction(0))) * gi)
        grads.append(row)
    return [float(v) for v in value], [[float(v) for v in row] for row in grads]


def data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(7, 5, generator=g), torch.randint(0, 5, (7,), generator=g), torch.rand(5, generator=g) + 0.5


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin_loss_is_the_documented_definition(p, reduction, weighted):
    x, t, w = data(p + 2 * weighted)
    x = x.requires_grad_()
    with carbon.enabled():
        loss = F.multi_margin_loss(x, t, p=p, margin=0.7, weight=w if weighted else None, reduction=reduction)
        g = torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape)
        loss.backward(g)
    want, want_grad = oracle(x.detach().tolist(), t.tolist(), p, 0.7, w.tolist() if weighted else None, reduction,
                             g.reshape(-1).tolist())
    assert loss.reshape(-1).tolist() == want
    assert x.grad.tolist() == want_grad
    ref = F.multi_margin_loss(x.detach().double(), t, p=p, margin=0.7, weight=w.double() if weighted else None,
                              reduction=reduction)
    assert torch.allclose(loss.double(), ref, rtol=1e-6, atol=1e-7)


def test_rows_alone_threads_and_bfloat16(restore_num_threads):
    x, t, _ = data(9)
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append(F.multi_margin_loss(x, t, reduction="none"))
            alone = F.multi_margin_loss(x[3], t[3], reduction="none")
            half = F.multi_margin_loss(x.bfloat16(), t, reduction="none")
    assert torch.equal(as_bits(runs[0]), as_bits(runs[1]))
    assert torch.equal(as_bits(runs[0][3]), as_bits(alone))
    want = oracle(x.bfloat16().float().tolist(), t.tolist(), 1, 1.0, None, "none", [1.0] * 7)[0]
    assert half.dtype == torch.bfloat16 and torch.equal(as_bits(half), as_bits(torch.tensor(want).bfloat16()))
