"""CNN building blocks under carbon.enable (docs/enable.md): batch, group and
instance norm, max pooling's backward and adaptive average pooling, each
against an independent reference (the layer-norm reference of contract §7,
Fraction arithmetic with the integer oracle's rounding); and a small
ResNet-style network that trains to the same bits at 1 and 2 threads under
strict enable, with batch-invariant logits in evaluation mode."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import carbon
from tests.norm_reference import layer_norm_ref
from tests.oracle import as_bits, assert_bits_equal, bits_to_float, bits_tensor, round_bits, row_quotient_bits

F32 = torch.float32


def _randn(*shape, seed=0, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(F32)


def rn32(v) -> Fraction:
    return Fraction(bits_to_float(round_bits(v, F32), F32))


def _floats_of_bits(bits: torch.Tensor) -> list:
    return bits.view(F32).double().reshape(-1).tolist()


def _affine_bits(xhat: list, channel_of, w: list, b: list) -> torch.Tensor:
    """RN32(RN32(xhat * w[c]) + b[c]) for each value."""
    return bits_tensor([round_bits(rn32(Fraction(v) * Fraction(w[channel_of(i)])) + Fraction(b[channel_of(i)]), F32)
                        for i, v in enumerate(xhat)], F32)


@pytest.fixture(autouse=True)
def _always_disabled_after():
    yield
    carbon.disable()


def test_batch_norm_training_normalizes_each_channel_as_a_layer_norm_row():
    n, c, h, w = 4, 3, 5, 5
    x = _randn(n, c, h, w, seed=1, scale=2.0, offset=0.5)
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.weight.copy_(_randn(c, seed=2))
        bn.bias.copy_(_randn(c, seed=3))
        bn.running_mean.copy_(_randn(c, seed=4))
        bn.running_var.copy_(_randn(c, seed=5).abs() + 0.5)
    rm0, rv0 = bn.running_mean.tolist(), bn.running_var.tolist()
    with carbon.enabled():
        y = bn(x)
    rows = x.movedim(1, 0).reshape(c, -1)
    xhat_bits, mean_bits, _ = layer_norm_ref(rows, [rows.shape[1]])
    xhat = _floats_of_bits(xhat_bits)
    m = rows.shape[1]
    want = _affine_bits(xhat, lambda i: i // m, bn.weight.tolist(), bn.bias.tolist()).reshape(c, n, h, w)
    assert_bits_equal(y, want.movedim(0, 1).contiguous(), "output")
    # running = RN32(RN32(m32 * stat) + RN32((1 - m)32 * running)), the variance unbiased and exact
    m32, keep32 = rn32(0.1), rn32(1.0 - 0.1)
    for ch, row in enumerate(rows.double().tolist()):
        mean = Fraction(bits_to_float(int(mean_bits[ch]) & 0xFFFFFFFF, F32))
        var = rn32(sum((Fraction(v) - mean) ** 2 for v in row) / (m - 1))
        assert as_bits(bn.running_mean)[ch].item() & 0xFFFFFFFF == round_bits(rn32(m32 * mean) + rn32(keep32 * Fraction(rm0[ch])), F32)
        assert as_bits(bn.running_var)[ch].item() & 0xFFFFFFFF == round_bits(rn32(m32 * var) + rn32(keep32 * Fraction(rv0[ch])), F32)


def test_batch_norm_evaluation_uses_the_running_statistics():
    c = 3
    x = _randn(2, c, 4, 4, seed=6)
    bn = nn.BatchNorm2d(c).eval()
    with torch.no_grad():
        bn.weight.copy_(_randn(c, seed=7))
        bn.bias.copy_(_randn(c, seed=8))
        bn.running_mean.copy_(_randn(c, seed=9))
        bn.running_var.copy_(_randn(c, seed=10).abs() + 0.5)
    with carbon.enabled():
        y = bn(x)
    eps32 = rn32(bn.eps)
    rstd = [rn32(1 / rn32(math.sqrt(bits_to_float(round_bits(Fraction(v) + eps32, F32), F32))))
            for v in bn.running_var.tolist()]
    rm, w, b = bn.running_mean.tolist(), bn.weight.tolist(), bn.bias.tolist()
    want = []
    for (i, ch, _, _), v in zip(((i, ch, p, q) for i in range(2) for ch in range(c) for p in range(4) for q in range(4)),
                               x.reshape(-1).tolist()):
        xhat = rn32(rn32(Fraction(v) - Fraction(rm[ch])) * rstd[ch])
        want.append(round_bits(rn32(xhat * Fraction(w[ch])) + Fraction(b[ch]), F32))
    assert_bits_equal(y, bits_tensor(want, F32).reshape(x.shape), "evaluation output")


def test_group_norm_normalizes_each_sample_group_as_a_layer_norm_row():
    n, c, groups = 3, 6, 2
    x = _randn(n, c, 7, seed=11, scale=3.0)
    gn = nn.GroupNorm(groups, c)
    with torch.no_grad():
        gn.weight.copy_(_randn(c, seed=12))
        gn.bias.copy_(_randn(c, seed=13))
    with carbon.enabled():
        y = gn(x)
        inst = F.instance_norm(x)
    xhat = _floats_of_bits(layer_norm_ref(x.reshape(n * groups, -1), [c // groups * 7])[0])
    want = _affine_bits(xhat, lambda i: (i // 7) % c, gn.weight.tolist(), gn.bias.tolist())
    assert_bits_equal(y, want.reshape(x.shape), "group_norm")
    assert_bits_equal(inst, layer_norm_ref(x.reshape(n * c, -1), [7])[0].reshape(x.shape), "instance_norm")


def test_max_pool_gradient_sums_overlapping_windows_exactly():
    x = _randn(2, 2, 9, 9, seed=14)
    x[0, 0, 5, 5] = 50.0  # the maximum of the four windows (stride 2, size 3) that overlap there
    leaf = x.clone().requires_grad_()
    with carbon.enabled():
        y, idx = F.max_pool2d(leaf, 3, 2, 1, return_indices=True)
    g = _randn(*y.shape, seed=15, scale=1e3) + _randn(*y.shape, seed=16, scale=1e-5)
    with carbon.enabled():
        y.backward(g)
    terms = {}
    for plane, (gi, ii) in enumerate(zip(g.reshape(4, -1).tolist(), idx.reshape(4, -1).tolist())):
        for gv, iv in zip(gi, ii):
            terms.setdefault((plane, iv), []).append(gv)
    want = [row_quotient_bits(terms.get((plane, pos), []), 1, F32) for plane in range(4) for pos in range(81)]
    assert_bits_equal(leaf.grad, bits_tensor(want, F32).reshape(x.shape), "max_pool2d gradient")
    assert len(terms[(0, 5 * 9 + 5)]) == 4  # the case under test: four windows share that maximum


def test_adaptive_average_pooling_means_and_their_gradient():
    x = _randn(2, 3, 7, 9, seed=17, scale=5.0).requires_grad_()
    with carbon.enabled():
        y = F.adaptive_avg_pool2d(x, (3, 4))
    g = _randn(2, 3, 3, 4, seed=18)
    with carbon.enabled():
        y.backward(g)

    def regions(size, out):
        return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]
    planes = x.detach().reshape(6, 7, 9).tolist()
    want_y, want_dx = [], []
    for p, plane in enumerate(planes):
        dx = [[Fraction(0)] * 9 for _ in range(7)]
        for i, (h0, h1) in enumerate(regions(7, 3)):
            for j, (w0, w1) in enumerate(regions(9, 4)):
                values = [plane[r][s] for r in range(h0, h1) for s in range(w0, w1)]
                want_y.append(row_quotient_bits(values, len(values), F32))
                share = rn32(Fraction(g.reshape(6, 3, 4)[p, i, j].item()) / len(values))
                for r in range(h0, h1):
                    for s in range(w0, w1):
                        dx[r][s] = rn32(dx[r][s] + share)  # overlapping regions: added in region order
        want_dx.extend(round_bits(v, F32) for row in dx for v in row)
    assert_bits_equal(y, bits_tensor(want_y, F32).reshape(2, 3, 3, 4), "adaptive_avg_pool2d")
    assert_bits_equal(x.grad, bits_tensor(want_dx, F32).reshape(2, 3, 7, 9), "adaptive_avg_pool2d gradient")


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.GroupNorm(2, 8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = self.stem(x)
        h = F.relu(h + self.block(h))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def test_a_small_resnet_trains_to_the_same_bits_at_one_and_two_threads(restore_num_threads):
    def train(threads):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0):
            model = TinyResNet()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            x, t = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
            for _ in range(3):
                opt.zero_grad()
                F.cross_entropy(model(x), t).backward()
                opt.step()
        return model, [as_bits(v) for v in model.state_dict().values() if v.is_floating_point()]
    model, one = train(1)
    _, two = train(2)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    model.eval()
    x = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(19))
    with carbon.enabled(), torch.no_grad():
        batch = model(x)
        alone = torch.cat([model(x[i:i + 1]) for i in range(6)])
    assert torch.equal(as_bits(batch), as_bits(alone))
