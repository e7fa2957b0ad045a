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


@pytest.mark.parametrize("where", ["two indices", "mask"])
def test_accumulating_index_put_takes_index_tensors_on_the_cpu_for_a_device_tensor(where):
    """torch indexes a CUDA tensor with CPU index tensors (x[cpu_idx], x[:, [0, 2]]), and the backward's
    index_put gets those indices as they are: the route moves them to x's device for carbon.index_add
    (the meta device stands in for CUDA)."""
    x = torch.zeros(5, 6, device="meta")
    if where == "two indices":
        idx, v = (torch.tensor([0, 1, 1]), torch.tensor([2, -4, 2])), torch.ones(3, device="meta")
    else:
        idx, v = (torch.tensor([True, False, True, True, False]),), torch.ones(3, 6, device="meta")
    with carbon.enabled():
        out = torch.ops.aten.index_put(x, list(idx), v, True)
    assert out.device == x.device and out.shape == x.shape and out.dtype == x.dtype


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
def test_attention_with_shared_heads_or_a_learned_mask_is_thread_and_batch_invariant(kind, restore_num_threads):
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
        if mask is None:  # shared heads are the heads copied out (repeat_kv): the same attention, the same bits
            with carbon.enabled():
                copied = F.scaled_dot_product_attention(q, k.repeat_interleave(4 // kv_heads, 1),
                                                        v.repeat_interleave(4 // kv_heads, 1))
            assert torch.equal(as_bits(copied), as_bits(out)), "repeat_kv"
    assert all(torch.equal(a, b) for a, b in zip(*results))


def _bits_of(values, dtype=F32):
    return bits_tensor([round_bits(v, dtype) for v in values], dtype)


def test_logsumexp_is_log_of_the_exact_sum_of_exps_plus_the_max():
    x = _randn(5, 9, seed=20, scale=4.0)
    x[1, :] = -math.inf  # an all −∞ row stays −∞
    with carbon.enabled():
        got = torch.logsumexp(x, -1)
    want = []
    for row in x.tolist():
        m = max(row)
        if math.isinf(m):
            want.append(m)
            continue
        exps = carbon.exp(torch.tensor([v - m for v in row]))  # RN32(x − m) is exact here (same binade or below)
        s = bits_to_float(row_quotient_bits(exps.double().tolist(), 1, F32), F32)
        log_s = carbon.log(torch.tensor([s])).item()
        want.append(Fraction(log_s) + Fraction(m))
    assert_bits_equal(got, _bits_of(want), "logsumexp")


def test_smooth_l1_and_huber_losses_follow_their_definitions():
    x, y = _randn(50, seed=21, scale=2.0), _randn(50, seed=22)
    with carbon.enabled():
        s_none = F.smooth_l1_loss(x, y, beta=0.5, reduction="none")
        s_mean = F.smooth_l1_loss(x, y, beta=0.5)
        h_none = F.huber_loss(x, y, delta=0.7, reduction="none")
    want_s, want_h = [], []
    for xv, yv in zip(_values(x), _values(y)):
        d = rn32(Fraction(xv) - Fraction(yv))
        half_sq = rn32(rn32(d * d) / 2)
        want_s.append(rn32(half_sq / Fraction(0.5)) if abs(d) < 0.5 else rn32(abs(d) - Fraction(0.25)))
        want_h.append(half_sq if abs(d) < 0.7 else rn32(rn32(abs(d) - rn32(0.35)) * rn32(0.7)))
    assert_bits_equal(s_none, _bits_of(want_s), "smooth_l1 none")
    assert_bits_equal(h_none, _bits_of(want_h), "huber none")
    assert as_bits(s_mean).item() & 0xFFFFFFFF == row_quotient_bits([float(v) for v in want_s], 50, F32)


def test_xlogy_nansum_trace_and_addmv_are_exact_compositions():
    x, y = _randn(6, 6, seed=23), _randn(6, 6, seed=24).abs()
    x[0, 0] = 0.0
    logs = carbon.log(y)
    with carbon.enabled():
        xl = torch.xlogy(x, y)
        ns = torch.nansum(torch.where(x > 1, float("nan"), x), 1)
        tr = torch.trace(x)
        mv = torch.addmv(y[:, 0], x, y[1])
    want_xl = [0.0 if a == 0 else Fraction(a) * Fraction(b) for a, b in zip(_values(x), _values(logs))]
    assert_bits_equal(xl, _bits_of(want_xl).reshape(6, 6), "xlogy")
    want_ns = [row_quotient_bits([v for v in row if v <= 1] or [0.0], 1, F32) for row in x.tolist()]
    assert_bits_equal(ns, bits_tensor(want_ns, F32), "nansum")
    assert as_bits(tr).item() & 0xFFFFFFFF == row_quotient_bits([x[i, i].item() for i in range(6)], 1, F32)
    want_mv = [round_bits(Fraction(y[i, 0].item()) + sum(Fraction(a) * Fraction(b) for a, b in zip(x[i].tolist(), y[1].tolist())), F32)
               for i in range(6)]
    assert_bits_equal(mv, bits_tensor(want_mv, F32), "addmv")


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_padding_gradient_sums_each_source_exactly(mode):
    x = _randn(2, 7, seed=25).requires_grad_()
    with carbon.enabled():
        y = F.pad(x.unsqueeze(0), (3, 4), mode=mode)
    g = _randn(*y.shape, seed=26, scale=1e3) + _randn(*y.shape, seed=27, scale=1e-4)
    with carbon.enabled():
        y.backward(g)

    def source(j):  # output position j of a row padded by 3 on the left
        i = j - 3
        if mode == "replicate":
            return min(max(i, 0), 6)
        i = -i if i < 0 else i
        return 12 - i if i > 6 else i
    want = []
    for r in range(2):
        terms = {}
        for j, gv in enumerate(g[0, r].tolist()):
            terms.setdefault(source(j), []).append(gv)
        want += [row_quotient_bits(terms[i], 1, F32) for i in range(7)]
    assert_bits_equal(x.grad, bits_tensor(want, F32).reshape(2, 7), f"{mode} pad gradient")


def test_exponential_draws_are_minus_log_of_one_minus_carbons_uniforms():
    with carbon.enabled(seed=5):
        e = torch.empty(1000).exponential_(2.5)
    with carbon.enabled(seed=5):
        u = torch.rand(1000)  # the same (first) draw of the same seeded generator
    logs = carbon.log(1.0 - u)  # 1 − u is exact for u = k·2⁻²⁴
    assert_bits_equal(e, _bits_of([rn32(-Fraction(v)) / Fraction(2.5) for v in _values(logs)]), "exponential_")


def test_lstm_and_gru_run_on_routed_ops_with_the_same_bits_at_one_and_two_threads(restore_num_threads):
    """Thread and batch invariant, a sequence alone included: carbon.enable hands torch's RNN a contiguous
    time-major input, which torch projects with addmm whatever the batch size (docs/enable.md)."""
    seq = _randn(3, 7, 6, seed=28)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0):
            lstm, gru = torch.nn.LSTM(6, 5, num_layers=2, batch_first=True), torch.nn.GRU(6, 5, batch_first=True)
            out = lstm(seq)[0] + gru(seq)[0]
            out.sum().backward()
            pair = lstm(seq[1:3])[0] + gru(seq[1:3])[0]
            alone = lstm(seq[2:3])[0] + gru(seq[2:3])[0]
        assert torch.equal(as_bits(pair), as_bits(out[1:3].detach())), "batches of 2 and 3"
        assert torch.equal(as_bits(alone), as_bits(out[2:3].detach())), "a sequence alone"
        results.append([as_bits(out.detach())] + [as_bits(p.grad) for p in list(lstm.parameters()) + list(gru.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert torch.backends.mkldnn.enabled  # restored by disable()


def test_linear_gives_the_same_bits_for_every_input_layout():
    """torch decomposes F.linear into addmm for contiguous inputs and matmul + add for others."""
    x, w, b = _randn(4, 5, 8, seed=29), _randn(3, 8, seed=30), _randn(3, seed=31)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    with carbon.enabled():
        plain, other, four_d = F.linear(x, w, b), F.linear(strided, w, b), F.linear(x.unsqueeze(0), w, b)
    assert not strided.is_contiguous()
    assert torch.equal(as_bits(plain), as_bits(other)) and torch.equal(as_bits(plain), as_bits(four_d[0]))
    want = [round_bits(Fraction(b[n].item()) + sum(Fraction(p) * Fraction(q) for p, q in zip(row, w[n].tolist())), F32)
            for row in x.reshape(20, 8).tolist() for n in range(3)]
    assert_bits_equal(plain, bits_tensor(want, F32).reshape(4, 5, 3), "linear")


@pytest.mark.parametrize("kind", ["elu", "selu", "celu"])
def test_elu_family_uses_carbons_expm1(kind):
    x = torch.cat([torch.tensor([0.0, -0.0, -1e-6, 1e-6, -30.0, 30.0]), _randn(200, seed=32, scale=3.0)])
    leaf = x.clone().requires_grad_()
    g = _randn(x.numel(), seed=33)
    alpha, scale, input_scale = {"elu": (1.3, 1.0, 1.0), "selu": (1.6732632423543772, 1.0507009873554805, 1.0),
                                 "celu": (0.7, 1.0, 1 / 0.7)}[kind]
    with carbon.enabled():
        y = {"elu": lambda t: F.elu(t, alpha), "selu": F.selu, "celu": lambda t: F.celu(t, alpha)}[kind](leaf)
        y.backward(g)
    inner = (x * torch.tensor(input_scale, dtype=F32)) if input_scale != 1.0 else x  # RN32(x·is): IEEE product
    em, ex = carbon.expm1(inner), carbon.exp(inner)  # carbon's own functions (tested against mpmath)
    c, s, iscale = rn32(alpha * scale), rn32(scale), rn32(input_scale)
    want_y, want_g = [], []
    for xv, ev, eg, gv in zip(_values(x), _values(em), _values(ex), _values(g)):
        if xv > 0:
            want_y.append(round_bits(Fraction(xv) * s, F32))
            want_g.append(round_bits(Fraction(gv) * s, F32))
        else:
            want_y.append(round_bits(c * Fraction(ev), F32))
            want_g.append(round_bits(rn32(rn32(Fraction(gv) * iscale) * c) * Fraction(eg), F32))
    # x = −0 gives c·(−0) = −0; the Fraction product loses the sign
    want_y[1] = 0x80000000
    assert_bits_equal(y, bits_tensor(want_y, F32), kind)
    assert_bits_equal(leaf.grad, bits_tensor(want_g, F32), f"{kind} gradient")


# ---- log2 ... atanh: the aten ops run carbon's functions; their backward is torch's formula of routed ops ----------

NEWER_UNARY = ("log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh", "acosh",
               "atanh")


def _domain(name: str, n: int = 200, seed: int = 40) -> torch.Tensor:
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if name in ("asin", "acos", "erfinv", "atanh"):
        return (u * 2 - 1).to(F32)
    if name == "acosh":
        return (1 + u * 20).to(F32)
    if name in ("log2", "log10"):
        return torch.pow(2.0, u * 60 - 30).to(F32)
    return (u * 40 - 20).to(F32)


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NEWER_UNARY)
def test_newer_elementwise_aten_ops_run_carbons_functions(name, dtype):
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 2.0, -2.0, 1e-30])
    x = torch.cat([_domain(name), specials]).to(dtype)
    with carbon.enabled():
        y = getattr(torch, name)(x)
        z = x.clone()
        getattr(z, name + "_")()
    want = getattr(carbon, name)(x)  # carbon's own function (against mpmath in test_elementwise.py)
    assert_bits_equal(y, as_bits(want), f"torch.{name}")
    assert_bits_equal(z, as_bits(want), f"Tensor.{name}_")


def _rsqrt32(v: Fraction) -> Fraction:
    """The routed rsqrt: RN(1/RN(sqrt v)) (docs/enable.md), the root from mpmath at 256 bits."""
    import mpmath as mp
    from elementwise_ref import _fraction
    with mp.workprec(256):
        root = rn32(_fraction(mp.sqrt(mp.mpf(v.numerator) / v.denominator)))
    return rn32(1 / root)


def _torch_backward_formula(name: str, x: float, g: float, y: float, other: float) -> Fraction:
    """torch's derivative formula for `name` (autograd's ops, each one float32 rounding), with `y` the
    forward result and `other` carbon's cosh / sinh / exp where the formula calls one (torch's
    derivatives.yaml; a double constant times a float32 tensor is RN32(constant) times it)."""
    X, G, Y = Fraction(x), Fraction(g), Fraction(y)
    if name in ("log2", "log10"):
        return rn32(G / rn32(X * rn32(0.6931471805599453 if name == "log2" else 2.302585092994046)))
    if name == "exp2":
        return rn32(rn32(G * Y) * rn32(0.6931471805599453))
    if name == "erfc":  # -2/sqrt(pi) * exp(-x^2) * g
        return rn32(rn32(Fraction(other) * rn32(-1.1283791670955126)) * G)
    if name in ("sinh", "cosh"):
        return rn32(G * Fraction(other))
    if name == "tan":
        return rn32(G * rn32(rn32(Y * Y) + 1))
    if name == "atan":
        return rn32(G / rn32(rn32(X * X) + 1))
    if name == "erfinv":  # (M_PI_4 * M_2_SQRTPI) * exp(erfinv(x).pow(2)) * g
        return rn32(rn32(Fraction(other) * rn32(0.7853981633974483 * 1.1283791670955126)) * G)
    if name == "asinh":  # g * (x.pow(2) + 1).rsqrt()
        return rn32(G * _rsqrt32(rn32(rn32(X * X) + 1)))
    if name == "acosh":  # g * (x * x - 1).rsqrt()
        return rn32(G * _rsqrt32(rn32(rn32(X * X) - 1)))
    if name == "atanh":  # g * 1 / (1 - x.pow(2))
        return rn32(G / rn32(1 - rn32(X * X)))
    root = _rsqrt32(rn32(rn32(-X * X) + 1))
    product = rn32(root * G)
    return product if name == "asin" else -product


@pytest.mark.parametrize("name", NEWER_UNARY)
def test_newer_elementwise_backward_runs_strict_as_torchs_formula(name):
    x = _domain(name, 120, seed=41)
    if name == "erfc":
        x = x / 4  # where exp(-x^2) is not 0
    g = _randn(x.numel(), seed=42)
    leaf = x.clone().requires_grad_()
    with carbon.enabled():  # strict: every op of the backward is routed or allowed
        y = getattr(torch, name)(leaf)
        y.backward(g)
    other = {"sinh": carbon.cosh(x), "cosh": carbon.sinh(x), "erfc": carbon.exp(-(x * x)),
             "erfinv": carbon.exp(carbon.erfinv(x) * carbon.erfinv(x))}.get(name, x)
    want = [round_bits(_torch_backward_formula(name, xv, gv, yv, ov), F32)
            for xv, gv, yv, ov in zip(_values(x), _values(g), _values(y), _values(other))]
    assert_bits_equal(leaf.grad, bits_tensor(want, F32), f"{name} gradient")


@pytest.mark.parametrize("name", ["log", "exp", "sin", "tanh", "log2", "atan"])
def test_integer_and_boolean_tensors_are_converted_to_the_default_dtype_first(name):
    """torch.log(torch.arange(1, n)) (Mamba / Jamba initializations): as torch, in float32, after one
    correctly rounded conversion (exact here: every integer below 2^24); in-place on an integer tensor is
    torch's error."""
    ints = torch.arange(-5, 40) if name not in ("log", "log2") else torch.arange(1, 2 ** 20, 997)
    flags = torch.tensor([True, False, True])
    with carbon.enabled():
        got, from_bool = getattr(torch, name)(ints), getattr(torch, name)(flags)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            getattr(ints.clone(), name + "_")()
    want = getattr(carbon, name)(ints.to(F32))
    assert got.dtype == F32 and from_bool.dtype == F32
    assert_bits_equal(got, as_bits(want), f"torch.{name} of int64")
    assert_bits_equal(from_bool, as_bits(getattr(carbon, name)(flags.to(F32))), f"torch.{name} of bool")


@pytest.mark.parametrize("beta,threshold", [(2.0, 20.0), (0.1, 5.0), (1.7, 3.0)])
def test_softplus_with_beta_is_torchs_formula_on_carbons_softplus(beta, threshold):
    """y = RN32(x·RN32(β)); x where y > threshold, else RN32(SOFTPLUS(y) / RN32(β)); gradient g where
    y > threshold, else carbon's softplus derivative at y, RN(g·σ(y))."""
    x = torch.cat([_randn(300, seed=51) * 8, torch.tensor([0.0, -0.0, 1e-30, -100.0, 100.0])])
    g = _randn(x.numel(), seed=52)
    leaf = x.clone().requires_grad_()
    with carbon.enabled():
        out = F.softplus(leaf, beta=beta, threshold=threshold)
        out.backward(g)
    b32 = Fraction(bits_to_float(round_bits(beta, F32), F32))
    y = [round_bits(Fraction(v) * b32, F32) for v in _values(x)]
    y_vals = torch.tensor([bits_to_float(b, F32) for b in y], dtype=F32)
    soft, slope = carbon.softplus(y_vals), torch.ops.carbon.elementwise_backward(g, y_vals, "softplus")
    for i, (xv, yv) in enumerate(zip(_values(x), _values(y_vals))):
        over = yv > threshold
        want = xv if over else bits_to_float(round_bits(Fraction(soft[i].item()) / b32, F32), F32)
        want_grad = g[i].item() if over else slope[i].item()
        assert out[i].item() == want or (math.isnan(want) and math.isnan(out[i].item())), (xv, beta)
        assert leaf.grad[i].item() == want_grad, (xv, beta)


@pytest.mark.parametrize("eps", [None, 1e-6, 0.25, 0.6])
def test_logit_follows_torchs_clamp_rule_and_carbons_log(eps):
    """z = lo where x < lo, else hi where x > hi, else x, with lo = RN32(eps) and hi = RN32(1 − lo) (torch's
    kernel rule: for eps > 0.5 every x maps to one bound); logit = RN(LOG(RN(z / RN(1 − z)))); gradient
    RN(g / RN(x·RN(1 − x))) for lo ≤ x ≤ hi, else 0."""
    x = torch.cat([torch.rand(200, generator=torch.Generator().manual_seed(61)),
                   torch.tensor([0.0, 1.0, 1e-7, 1 - 1e-7, 0.5])])
    g = _randn(x.numel(), seed=62)
    leaf = x.clone().requires_grad_()
    with carbon.enabled():
        y = torch.logit(leaf, eps=eps)
        y.backward(g)
    xs = _values(x)
    if eps is None:
        zs = xs
    else:
        lo = bits_to_float(round_bits(eps, F32), F32)
        hi = bits_to_float(round_bits(1 - Fraction(lo), F32), F32)
        zs = [lo if v < lo else hi if v > hi else v for v in xs]
    quotients = torch.tensor([bits_to_float(round_bits(Fraction(z) / Fraction(bits_to_float(
        round_bits(1 - Fraction(z), F32), F32)), F32), F32) if z != 1 else math.inf for z in zs], dtype=F32)
    assert_bits_equal(y.detach(), as_bits(carbon.log(quotients)), "logit")
    for i, (v, gv) in enumerate(zip(xs, _values(g))):
        inside = eps is None or lo <= v <= hi
        if not inside:
            assert leaf.grad[i].item() == 0.0
            continue
        den = round_bits(Fraction(v) * Fraction(bits_to_float(round_bits(1 - Fraction(v), F32), F32)), F32)
        den_v = bits_to_float(den, F32)
        want = math.copysign(math.inf, gv) if den_v == 0 else bits_to_float(round_bits(Fraction(gv) / Fraction(den_v), F32), F32)
        assert leaf.grad[i].item() == want, (v, eps)


def test_zero_dim_indexed_accumulation_is_one_rounding_of_the_exact_sum():
    """index_add / scatter_add / scatter_reduce on a 0-dim self (torch allows it): self + the contribution,
    rounded once, a 0-dim result."""
    x, src = torch.tensor(1.0), torch.tensor(2.0 ** -24 + 2.0 ** -47)  # 1 + src rounds up only if exact
    with carbon.enabled():
        added = x.index_add(0, torch.tensor([0]), src)
        scattered = x.scatter_add(0, torch.tensor(0), src)
        reduced = x.scatter_reduce(0, torch.tensor(0), src, "sum")
        mean = x.scatter_reduce(0, torch.tensor(0), torch.tensor(2.0), "mean")
        scaled = x.index_add(0, torch.tensor(0), torch.tensor(3.0), alpha=-1)
    for name, t in (("index_add", added), ("scatter_add", scattered), ("scatter_reduce", reduced)):
        assert t.shape == () and t.item() == 1.0 + 2.0 ** -23, name
    assert mean.shape == () and mean.item() == 1.5  # (1 + 2) / 2 with include_self
    assert scaled.item() == -2.0


@pytest.mark.parametrize("shape,normalized", [((4, 5), (5,)), ((2, 3, 4), (3, 4)), ((1, 2, 3), (1, 2, 3))])
def test_norm_statistics_have_torchs_shapes(shape, normalized):
    """native_layer_norm's mean / rstd and _fused_rms_norm's rstd keep torch's shape (leading dimensions, then
    a 1 per normalized dimension); their values are carbon's (test_layer_norm.py checks those against the
    reference), and the backward reads them back in either shape."""
    x, w = _randn(*shape, seed=71), _randn(*normalized, seed=72)
    g = _randn(*shape, seed=73)
    stat_shape = shape[:len(shape) - len(normalized)] + (1,) * len(normalized)
    with carbon.enabled():
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, list(normalized), w, None, 1e-5)
        with torch.inference_mode():  # else autograd decomposes _fused_rms_norm before carbon sees it
            _, rms_rstd = torch.ops.aten._fused_rms_norm(x, list(normalized), w, 1e-5)
        dx, dw, _ = torch.ops.aten.native_layer_norm_backward(g, x, list(normalized), mean, rstd, w, None,
                                                              [True, True, False])
        with pytest.raises(carbon.NotExactError, match="eps"):
            torch.ops.aten.native_layer_norm(x, list(normalized), w, None, -0.5)
    _, c_mean, c_rstd = torch.ops.carbon.layer_norm(x, list(normalized), w, None, 1e-5)
    assert mean.shape == rstd.shape == rms_rstd.shape == stat_shape
    assert torch.equal(as_bits(mean.reshape(c_mean.shape)), as_bits(c_mean))
    assert torch.equal(as_bits(rstd.reshape(c_rstd.shape)), as_bits(c_rstd))
    assert torch.equal(as_bits(rms_rstd.reshape(c_rstd.shape)), as_bits(torch.ops.carbon.rms_norm(x, list(normalized), w, 1e-5)[1]))
    want_dx, want_dw, _ = torch.ops.carbon.norm_backward(g, x, list(normalized), c_mean, c_rstd, w, [True, True, False])
    assert torch.equal(as_bits(dx), as_bits(want_dx)) and torch.equal(as_bits(dw), as_bits(want_dw))


def test_empty_batches_and_other_index_dtypes_in_backward_routes():
    """Gradients of padding and unfold over an empty batch are empty (no ambiguous reshapes); gather's
    gradient with an empty uint8 index (torch accepts it) is +0; a float64 softmax's backward is refused
    in strict mode like its forward, and runs as torch's otherwise."""
    for f in (lambda t: F.pad(t, (1, 2), mode="reflect"), lambda t: F.pad(t, (1, 2), mode="replicate"),
              lambda t: F.unfold(t.unsqueeze(1), (2, 2))):
        leaf = torch.zeros(0, 3, 4).requires_grad_()
        with carbon.enabled():
            f(leaf).sum().backward()
        assert leaf.grad.shape == (0, 3, 4)
    x = _randn(3, 4, seed=81)
    leaf = x[0].clone().requires_grad_()
    with carbon.enabled():  # torch accepts an empty uint8 index
        torch.gather(leaf, 0, torch.zeros(0, dtype=torch.uint8)).sum().backward()
    assert torch.equal(as_bits(leaf.grad), as_bits(torch.zeros(4)))
    leaf = x.clone().requires_grad_()
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="float64"):
        torch.softmax(leaf, 1, dtype=torch.float64).sum().backward()
    with pytest.warns(RuntimeWarning), carbon.enabled(strict=False):
        torch.softmax(leaf, 1, dtype=torch.float64).pow(2).sum().backward()
    assert leaf.grad.shape == x.shape


def test_layer_norm_backward_of_torchs_own_forward_falls_back():
    """A bfloat16 layer_norm with a negative eps is not covered: with strict=False torch's forward runs (bf16
    statistics), and its backward must then be torch's too, not carbon's (which reads float32 statistics)."""
    x = _randn(3, 8, seed=91).to(torch.bfloat16).requires_grad_()
    with pytest.warns(RuntimeWarning), carbon.enabled(strict=False):
        F.layer_norm(x, (8,), eps=-1e-3).float().pow(2).sum().backward()
    want = x.detach().clone().requires_grad_()
    F.layer_norm(want, (8,), eps=-1e-3).float().pow(2).sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).any() == torch.isfinite(want.grad).any()


@pytest.mark.parametrize("eps", [None, -0.5])
def test_logit_gradient_without_eps_follows_torchs_edges(eps):
    """Without eps (torch reads a negative one as none): NaN outside [0, 1], g·∞ at x = ±0 and 1."""
    x = torch.tensor([-0.5, -0.0, 0.0, 1.0, 1.5, 2.0])
    g = torch.tensor([1.0, 1.0, -2.0, 3.0, 1.0, 1.0])
    leaf = x.clone().requires_grad_()
    with carbon.enabled():
        torch.logit(leaf, eps=eps).backward(g)
    got = leaf.grad.tolist()
    assert math.isnan(got[0]) and math.isnan(got[4]) and math.isnan(got[5])
    assert got[1:4] == [math.inf, -math.inf, math.inf]


def test_sinc_of_integers_is_computed_in_the_default_dtype():
    ints = torch.tensor([0, 1, -3, 7])
    with carbon.enabled():
        got = torch.sinc(ints)
        want = torch.sinc(ints.to(F32))
    assert got.dtype == F32 and torch.equal(as_bits(got), as_bits(want))


def test_out_arguments_that_cannot_hold_the_result_raise_as_in_torch():
    with carbon.enabled(), pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.exp(torch.arange(4), out=torch.empty(4, dtype=torch.long))
