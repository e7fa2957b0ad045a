"""More of carbon.enable's routes (docs/enable.md), each against an independent
reference: accumulating advanced-index writes and the weight-norm gradient
against exact Fraction sums, binary cross-entropy and linspace against their
definitions evaluated in Python, bilinear upsampling against the separable
definition with weights re-derived here from torch's documented rule, and
attention with shared key/value heads or a learned mask against other thread
counts and batch sizes."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import as_bits, assert_bits_equal, bits_to_float, bits_tensor, round_bits, row_quotient_bits

F32 = torch.float32


def _randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(F32)


def rn32(v) -> Fraction:
    return Fraction(bits_to_float(round_bits(v, F32), F32))


def _values(t: torch.Tensor) -> list:
    return t.detach().double().reshape(-1).tolist()


@pytest.fixture(autouse=True)
def _always_disabled_after():
    yield
    carbon.disable()


@pytest.mark.parametrize("where", ["dim 1", "two indices", "2-d index", "mask"])
def test_accumulating_index_put_gives_each_destination_one_rounding_of_its_exact_sum(where):
    x = _randn(5, 6, 7, seed=1, scale=1e3)
    if where == "dim 1":
        idx, vshape = (slice(None), torch.tensor([1, 1, 3, -1])), (5, 4, 7)
    elif where == "two indices":
        idx, vshape = (torch.tensor([0, 1, 1, 1]), torch.tensor([2, -4, 2, 2])), (4, 7)
    elif where == "2-d index":
        idx, vshape = (torch.tensor([[0, 4], [4, 4]]),), (2, 2, 6, 7)
    else:
        idx, vshape = (torch.tensor([True, False, True, True, False]),), (3, 6, 7)
    v = _randn(*vshape, seed=2) + _randn(*vshape, seed=3, scale=1e-6)
    indices = [None if isinstance(i, slice) else i for i in idx]
    with carbon.enabled():
        out = torch.ops.aten.index_put(x, indices, v, True)
    # The same writes, one by one, as exact Fraction terms per destination.
    terms = {i: [value] for i, value in enumerate(_values(x))}
    positions = torch.arange(x.numel()).reshape(x.shape)[idx]
    for pos, value in zip(positions.reshape(-1).tolist(), torch.broadcast_to(v, positions.shape).reshape(-1).tolist()):
        terms[pos].append(value)
    want = [row_quotient_bits(terms[i], 1, F32) for i in range(x.numel())]
    assert_bits_equal(out, bits_tensor(want, F32).reshape(x.shape), where)


def test_linspace_is_the_two_sided_binary64_formula_rounded_once():
    with carbon.enabled():
        got = [torch.linspace(-0.3, 1.7, 11), torch.linspace(0.0, 0.1, 7, dtype=torch.bfloat16), torch.linspace(2.0, 2.0, 1)]
    for t, (start, end, steps) in zip(got, [(-0.3, 1.7, 11), (0.0, 0.1, 7), (2.0, 2.0, 1)]):
        step = (end - start) / (steps - 1) if steps > 1 else 0.0
        values = [start + step * i if i < steps // 2 else end - step * (steps - 1 - i) for i in range(steps)]
        assert_bits_equal(t, bits_tensor([round_bits(v, t.dtype) for v in values], t.dtype), f"linspace {steps}")


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_and_its_gradients_use_exact_slice_sums(dim):
    v = _randn(4, 3, 5, seed=4).requires_grad_()
    gshape = [v.shape[d] if d == dim else 1 for d in range(3)]
    g = (_randn(*gshape, seed=5).abs() + 0.5).requires_grad_()
    gw = _randn(4, 3, 5, seed=6)
    with carbon.enabled():
        w = torch._weight_norm(v, g, dim)
        w.backward(gw)
    vs = v.detach().movedim(dim, 0).reshape(v.shape[dim], -1).double().tolist()
    gws = gw.movedim(dim, 0).reshape(v.shape[dim], -1).double().tolist()
    gv = g.detach().reshape(-1).double().tolist()
    want_w, want_dg, want_dv = [], [], []
    for row, grow, gval in zip(vs, gws, gv):
        norm = rn32(math.sqrt(bits_to_float(round_bits(sum(Fraction(a) ** 2 for a in row), F32), F32)))
        scale = rn32(Fraction(gval) / norm)
        want_w.append([round_bits(Fraction(a) * scale, F32) for a in row])
        dg = rn32(rn32(sum(Fraction(a) * Fraction(b) for a, b in zip(grow, row))) / norm)
        want_dg.append(round_bits(dg, F32))
        inner = rn32(dg / norm)
        want_dv.append([round_bits(scale * rn32(Fraction(b) - rn32(Fraction(a) * inner)), F32) for a, b in zip(row, grow)])
    moved = list(v.movedim(dim, 0).shape)

    def back(bits):
        return bits_tensor(bits, F32).reshape(moved).movedim(0, dim)
    assert_bits_equal(w, back(want_w), "w")
    assert_bits_equal(v.grad, back(want_dv), "grad v")
    assert_bits_equal(g.grad, bits_tensor(want_dg, F32).reshape(gshape), "grad g")


@pytest.mark.parametrize("pos_weight", [False, True])
def test_binary_cross_entropy_with_logits_follows_its_definition(pos_weight):
    x, y = _randn(40, seed=7, scale=4.0), torch.rand(40, generator=torch.Generator().manual_seed(8))
    w, pw = torch.rand(40, generator=torch.Generator().manual_seed(9)), torch.full((40,), 3.0)
    soft = carbon.softplus(-x)  # carbon's own softplus (tested against mpmath in test_elementwise)
    with carbon.enabled():
        none = F.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw if pos_weight else None, reduction="none")
        mean = F.binary_cross_entropy_with_logits(x, y, pos_weight=pw if pos_weight else None)
    want_none, plain = [], []
    for xv, yv, wv, sv in zip(_values(x), _values(y), _values(w), _values(soft)):
        lw = rn32(rn32(Fraction(2) * Fraction(yv)) + 1) if pos_weight else Fraction(1)
        loss = rn32(rn32(rn32(1 - Fraction(yv)) * Fraction(xv)) + rn32(lw * Fraction(sv)))
        plain.append(float(loss))
        want_none.append(round_bits(Fraction(wv) * loss, F32))
    assert_bits_equal(none, bits_tensor(want_none, F32), "reduction none")
    assert as_bits(mean).item() & 0xFFFFFFFF == row_quotient_bits(plain, 40, F32)


def test_binary_cross_entropy_and_its_gradient_follow_their_definitions():
    p = torch.rand(30, generator=torch.Generator().manual_seed(10)) * 0.98 + 0.01
    y = torch.rand(30, generator=torch.Generator().manual_seed(11))
    log_p, log_q = carbon.log(p), carbon.log1p(-p)
    leaf = p.clone().requires_grad_()
    with carbon.enabled():
        loss = F.binary_cross_entropy(leaf, y)
        loss.backward()
    terms = [float(rn32(rn32((Fraction(yv) - 1) * Fraction(max(lq, -100.0))) - rn32(Fraction(yv) * Fraction(max(lp, -100.0)))))
             for yv, lp, lq in zip(_values(y), _values(log_p), _values(log_q))]
    assert as_bits(loss).item() & 0xFFFFFFFF == row_quotient_bits(terms, 30, F32)
    want = []
    for pv, yv in zip(_values(p), _values(y)):
        d = rn32(rn32(Fraction(pv) - Fraction(yv)) / max(rn32(rn32(1 - Fraction(pv)) * Fraction(pv)), rn32(1e-12)))
        want.append(round_bits(d / 30, F32))  # g = 1: RN(1 · (x − y)) is exact
    assert_bits_equal(leaf.grad, bits_tensor(want, F32), "gradient")


def _weights(size_in, size_out, align_corners, factor):
    """torch's linear-interpolation rule (aten/src/ATen/native/UpSample.h), written out here."""
    if align_corners:
        scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        scale = 1.0 / factor if factor else size_in / size_out
    out = []
    for j in range(size_out):
        src = scale * j if align_corners else max(scale * (j + 0.5) - 0.5, 0.0)
        lo = min(int(src), size_in - 1)
        hi = min(lo + 1, size_in - 1)
        lam = src - lo
        row = {}
        row[lo] = row.get(lo, 0.0) + (1.0 - lam)
        row[hi] = row.get(hi, 0.0) + lam
        out.append({k: rn32(v) for k, v in row.items()})
    return out


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(9, 11), None])
def test_bilinear_upsampling_is_two_exact_separable_passes(align_corners, size):
    x = _randn(1, 2, 4, 5, seed=12).requires_grad_()
    with carbon.enabled():
        y = F.interpolate(x, size=size, scale_factor=None if size else 2.0, mode="bilinear", align_corners=align_corners)
    g = _randn(*y.shape, seed=13)
    with carbon.enabled():
        y.backward(g)
    ho, wo = y.shape[-2:]
    ah = _weights(4, ho, align_corners, None if size else 2.0)
    aw = _weights(5, wo, align_corners, None if size else 2.0)
    xs, gs = x.detach().double().tolist()[0], g.double().tolist()[0]
    want_y, want_dx = [], []
    for c in range(2):
        rows = [[rn32(sum(wt * Fraction(xs[c][i][k]) for k, wt in aw[j].items())) for j in range(wo)] for i in range(4)]
        want_y += [round_bits(sum(wt * rows[k][j] for k, wt in ah[i].items()), F32) for i in range(ho) for j in range(wo)]
        # backward: along W first (transposed weights), then along H
        gw = [[rn32(sum(aw[j].get(k, 0) * Fraction(gs[c][i][j]) for j in range(wo))) for k in range(5)] for i in range(ho)]
        want_dx += [round_bits(sum(ah[i].get(r, 0) * gw[i][k] for i in range(ho)), F32) for r in range(4) for k in range(5)]
    assert_bits_equal(y, bits_tensor(want_y, F32).reshape(y.shape), "bilinear")
    assert_bits_equal(x.grad, bits_tensor(want_dx, F32).reshape(x.shape), "bilinear gradient")


def test_pow_of_a_cpu_scalar_base_to_integer_exponents_is_carbons_pow():
    base = torch.tensor(2.0 ** -0.5)
    e = torch.arange(1, 9, dtype=torch.int32)
    with carbon.enabled():
        slopes = torch.pow(base, e)
    assert_bits_equal(slopes, as_bits(torch.ops.carbon.pow_scalar_tensor(base.item(), e.float())), "ALiBi slopes")


@pytest.mark.parametrize("kind", ["grouped heads", "one shared head", "learned mask"])
def test_attention_outside_the_fused_op_is_thread_and_batch_invariant(kind, restore_num_threads):
    q = _randn(4, 4, 6, 8, seed=14)
    kv_heads = {"grouped heads": 2, "one shared head": 1, "learned mask": 4}[kind]
    k, v = _randn(4, kv_heads, 6, 8, seed=15), _randn(4, kv_heads, 6, 8, seed=16)
    mask = _randn(1, 4, 6, 6, seed=17) if kind == "learned mask" else None
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([mask.clone().requires_grad_()] if mask is not None else [])
        with carbon.enabled():
            out = F.scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], attn_mask=leaves[3] if mask is not None else None,
                                                 enable_gqa=kind == "grouped heads")
            out.backward(torch.ones_like(out))
            first = F.scaled_dot_product_attention(q[:1], k[:1], v[:1], attn_mask=mask, enable_gqa=kind == "grouped heads")
        results.append([as_bits(out)] + [as_bits(t.grad) for t in leaves])
        assert torch.equal(as_bits(first), as_bits(out[:1])), "batch invariance"
    assert all(torch.equal(a, b) for a, b in zip(*results))
