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
from tests.norm_reference import layer_norm_ref, sqrt_rn32
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_group_and_batch_norm_round_once_after_float32_steps(dtype):
    """16-bit inputs: x̂ = RN32((x − mean)·rstd) of the (exactly widened) rows, RN32(RN32(x̂·w) + b) in
    float32, and one rounding to the input's dtype at the end."""
    n, c, groups = 2, 4, 2
    x = _randn(n, c, 5, seed=21, scale=3.0).to(dtype)
    w, b = _randn(c, seed=22).to(dtype), _randn(c, seed=23).to(dtype)
    with carbon.enabled():
        gn = F.group_norm(x, groups, w, b)
        bn = F.batch_norm(x, None, None, w, b, training=True)
    def expected(rows: torch.Tensor, channel_of) -> torch.Tensor:
        xhat = _floats_of_bits(layer_norm_ref(rows.float(), [rows.shape[1]])[0])
        affine = _affine_bits(xhat, channel_of, w.float().tolist(), b.float().tolist()).view(F32)
        return affine.to(dtype)  # float32 -> 16 bits: one correctly rounded conversion
    want_gn = expected(x.reshape(n * groups, -1), lambda i: (i // 5) % c).reshape(x.shape)
    rows = x.movedim(1, 0).reshape(c, -1)
    want_bn = expected(rows, lambda i: i // (n * 5)).reshape(c, n, 5).movedim(0, 1)
    assert torch.equal(as_bits(gn), as_bits(want_gn))
    assert torch.equal(as_bits(bn), as_bits(want_bn))

    # evaluation with 16-bit running statistics (model.to(dtype)): RN32(RN32(x − mean)·rstd), rstd =
    # RN32(1 / RN32(√RN32(var + eps))), the affine steps in float32, one rounding to the dtype at the end
    mean, var = _randn(c, seed=24).to(dtype), (_randn(c, seed=25).abs() + 0.5).to(dtype)
    with carbon.enabled():
        ev = F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3)
    eps32 = rn32(Fraction(1e-3))
    rstd = [rn32(1 / sqrt_rn32(float(rn32(Fraction(v) + eps32)))) for v in var.float().tolist()]
    xhat = [float(rn32(rn32(Fraction(v) - Fraction(mean[(i // 5) % c].item())) * rstd[(i // 5) % c]))
            for i, v in enumerate(x.float().reshape(-1).tolist())]
    want_ev = _affine_bits(xhat, lambda i: (i // 5) % c, w.float().tolist(), b.float().tolist()).view(F32).to(dtype)
    assert torch.equal(as_bits(ev), as_bits(want_ev.reshape(x.shape)))


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


def _values(t: torch.Tensor) -> list:
    return t.detach().double().reshape(-1).tolist()


def test_hard_activations_are_single_roundings_in_order():
    x = torch.cat([torch.tensor([-3.0, 3.0, -2.9999998, 2.9999998, 0.0, -0.0]), _randn(200, seed=20, scale=4.0)])
    leaf = x.clone().requires_grad_()
    g = _randn(x.numel(), seed=21)
    with carbon.enabled():
        hs, hw = F.hardsigmoid(leaf), F.hardswish(leaf)
        (hs * g).sum().backward()
        hs_grad = leaf.grad.clone()
        leaf.grad = None
        (hw * g).sum().backward()
    six = Fraction(6)
    want_hs, want_hw, want_dhs, want_dhw = [], [], [], []
    for v, gv in zip(_values(x), _values(g)):
        clamped = min(max(rn32(Fraction(v) + 3), Fraction(0)), six)
        want_hs.append(round_bits(clamped / six, F32))
        product = Fraction(v) * clamped
        # x · 0 keeps x's sign (−0 for negative x below −3), and −0 / 6 = −0
        want_hw.append(round_bits(rn32(product) / six, F32) if product else (0x80000000 if math.copysign(1, v) < 0 else 0))
        want_dhs.append(round_bits(Fraction(gv) / six, F32) if -3 < v < 3 else 0)
        # g · 1 is exact: the sum's multiplication by the upstream ones changes nothing
        if v < -3:
            want_dhw.append(0)
        elif v <= 3:
            want_dhw.append(round_bits(Fraction(gv) * rn32(rn32(Fraction(v) / 3) + Fraction(1, 2)), F32))
        else:
            want_dhw.append(round_bits(gv, F32))
    assert_bits_equal(hs, bits_tensor(want_hs, F32), "hardsigmoid")
    assert_bits_equal(hw, bits_tensor(want_hw, F32), "hardswish")
    assert_bits_equal(hs_grad, bits_tensor(want_dhs, F32), "hardsigmoid gradient")
    assert_bits_equal(leaf.grad, bits_tensor(want_dhw, F32), "hardswish gradient")


def test_mish_and_glu_compose_carbons_functions_with_rounded_products():
    x = _randn(300, seed=22, scale=3.0)
    t = carbon.tanh(carbon.softplus(x))  # outside enable: carbon's own functions (tested in test_elementwise)
    s = carbon.sigmoid(x[150:])
    with carbon.enabled():
        mish, glu = F.mish(x), F.glu(x, 0)
    assert_bits_equal(mish, bits_tensor([round_bits(Fraction(a) * Fraction(b), F32)
                                         for a, b in zip(_values(x), _values(t))], F32), "mish")
    assert_bits_equal(glu, bits_tensor([round_bits(Fraction(a) * Fraction(b), F32)
                                        for a, b in zip(_values(x[:150]), _values(s))], F32), "glu")


def test_average_pooling_is_the_exact_window_mean_and_its_gradient_exact_sums_of_shares():
    x = _randn(2, 2, 7, 7, seed=23, scale=3.0).requires_grad_()
    with carbon.enabled():
        y = F.avg_pool2d(x, 3, 2, 1)
    g = _randn(*y.shape, seed=24)
    with carbon.enabled():
        y.backward(g)
    xs, gs = x.detach().double().reshape(4, 7, 7).tolist(), g.double().reshape(4, 4, 4).tolist()
    want_y, terms = [], {}
    for p in range(4):
        for i in range(4):
            for j in range(4):
                window = [(r, q) for r in range(2 * i - 1, 2 * i + 2) for q in range(2 * j - 1, 2 * j + 2)]
                values = [xs[p][r][q] if 0 <= r < 7 and 0 <= q < 7 else 0.0 for r, q in window]  # padding: +0
                want_y.append(row_quotient_bits(values, 9, F32))
                share = float(rn32(Fraction(gs[p][i][j]) / 9))
                for r, q in window:
                    terms.setdefault((p, r, q), []).append(share)
    want_dx = [row_quotient_bits(terms.get((p, r, q), []), 1, F32) for p in range(4) for r in range(7) for q in range(7)]
    assert_bits_equal(y, bits_tensor(want_y, F32).reshape(y.shape), "avg_pool2d")
    assert_bits_equal(x.grad, bits_tensor(want_dx, F32).reshape(x.shape), "avg_pool2d gradient")


def test_nearest_upsampling_gradient_sums_each_block_exactly():
    x = _randn(2, 3, 4, 5, seed=25).requires_grad_()
    with carbon.enabled():
        y = F.interpolate(x, scale_factor=(2, 3), mode="nearest")
    g = _randn(*y.shape, seed=26, scale=1e3) + _randn(*y.shape, seed=27, scale=1e-4)
    with carbon.enabled():
        y.backward(g)
    assert torch.equal(y, x.detach().repeat_interleave(2, 2).repeat_interleave(3, 3))
    gs = g.double().reshape(6, 8, 15).tolist()
    want = [row_quotient_bits([gs[p][2 * r + a][3 * q + b] for a in range(2) for b in range(3)], 1, F32)
            for p in range(6) for r in range(4) for q in range(5)]
    assert_bits_equal(x.grad, bits_tensor(want, F32).reshape(x.shape), "upsample_nearest2d gradient")
