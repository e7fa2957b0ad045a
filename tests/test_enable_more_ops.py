"""carbon.enable's routes for ops that ordinary models reach less often (docs/enable.md): the ``*_like``
random factories and the log-normal / geometric draws, F.fold (col2im) against exact Fraction sums built by
index arithmetic, Python's modulo, log-add-exp and torch.dist against their definitions evaluated here, and
the selections that run as torch's own because every value they return is one of their input's."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.norm_reference import sqrt_rn32
from tests.grid_reference import reflect as _reflect
from tests.oracle import as_bits, assert_bits_equal, bits_tensor, bits_to_float, round_bits, row_quotient_bits, row_sum_bits

F32 = torch.float32


def _randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(F32)


def _values(t: torch.Tensor) -> list:
    return t.detach().double().reshape(-1).tolist()


def _bits_of(values, dtype=F32) -> torch.Tensor:
    return bits_tensor([round_bits(v, dtype) for v in values], dtype)


def _assert_bits_or_both_nan(got: torch.Tensor, want_bits: torch.Tensor, context: str) -> None:
    """Bits equal, except that a NaN made by a single IEEE operation (fmod(∞, y), ∞ − ∞) has the device's
    own NaN bits (docs/enable.md): there only NaN-ness is compared."""
    want = want_bits.view(got.dtype)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{context}: NaN positions differ"
    assert_bits_equal(got[~nan], want_bits[~nan], context)


@pytest.fixture(autouse=True)
def _always_disabled_after():
    yield
    carbon.disable()


# ---- random factories -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_like_factories_draw_what_the_plain_factories_draw_in_the_input_layout(dtype):
    x = torch.empty(2, 3, 4, 5, dtype=dtype).to(memory_format=torch.channels_last)
    draws = {}
    for name, like, plain in [
        ("rand", lambda: torch.rand_like(x), lambda: torch.rand(x.shape, dtype=dtype)),
        ("randn", lambda: torch.randn_like(x), lambda: torch.randn(x.shape, dtype=dtype)),
        ("randint", lambda: torch.randint_like(x, 3, 11), lambda: torch.randint(3, 11, x.shape).to(dtype)),
    ]:
        with carbon.enabled(seed=11):
            got = like()
        with carbon.enabled(seed=11):
            want = plain()
        assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last), name
        assert torch.equal(as_bits(got.contiguous()), as_bits(want)), name
        draws[name] = got
    ints = draws["randint"].double()
    assert ints.min() >= 3 and ints.max() <= 10 and torch.equal(ints, ints.floor())
    with carbon.enabled(seed=11):
        assert torch.randint_like(x, 7, dtype=torch.int64).dtype == torch.int64


def test_log_normal_draws_are_carbons_exp_of_its_normal_draws():
    with carbon.enabled(seed=3):
        got = torch.empty(500).log_normal_(0.5, 1.5)
    with carbon.enabled(seed=3):
        n = torch.empty(500).normal_(0.5, 1.5)  # the same (first) draw of the same seeded generator
    assert_bits_equal(got, as_bits(carbon.exp(n)), "log_normal_")
    assert got.min() > 0


def test_geometric_draws_invert_carbons_uniforms():
    p = 0.3
    with carbon.enabled(seed=4):
        got = torch.empty(2000).geometric_(p)
    with carbon.enabled(seed=4):
        u = torch.rand(2000)
    logs = _values(carbon.log(1.0 - u))  # 1 − u is exact for u = k·2⁻²⁴
    log_q = Fraction(carbon.log1p(torch.tensor(-p)).item())
    want = [max(1, math.ceil(round_bits_value(Fraction(v) / log_q))) for v in logs]
    assert got.tolist() == [float(k) for k in want]
    # the law: P(K = 1) = p
    assert abs(float((got == 1).double().mean()) - p) < 0.04


def test_cauchy_draws_are_torchs_inversion_of_carbons_uniforms():
    median, sigma = 0.5, 2.0
    with carbon.enabled(seed=5):
        got = torch.empty(2000).cauchy_(median, sigma)
    with carbon.enabled(seed=5):
        u = torch.rand(2000)  # the same (first) draw of the same seeded generator
    pi32 = Fraction(torch.tensor(math.pi, dtype=torch.float32).item())
    angles = torch.tensor([float(round_bits_value((Fraction(v) - Fraction(1, 2)) * pi32)) for v in u.tolist()])
    tans = _values(carbon.tan(angles))
    want = [round_bits_value(Fraction(median) + Fraction(round_bits_value(Fraction(sigma) * Fraction(t)))) for t in tans]
    assert got.tolist() == want
    # the law: the median and the quartiles median -+ sigma
    q = torch.quantile(got.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    assert abs(q[1] - median) < 0.2 and abs(q[0] - (median - sigma)) < 0.4 and abs(q[2] - (median + sigma)) < 0.4
    with carbon.enabled(seed=5):
        half = torch.empty(10, dtype=torch.bfloat16).cauchy_()
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()


def test_trunc_normal_by_erfinv_runs_strict_and_gives_the_same_bits_at_one_and_two_threads(restore_num_threads):
    """torch 2.11's nn.init.trunc_normal_ (and other initializers) map uniform draws through erfinv_, then
    scale, shift and clamp: written out here, it runs under strict enable, erfinv_ gives carbon.erfinv of the
    draws (against mpmath in test_elementwise.py), and every step has the same bits at 1 and 2 threads."""
    mean, std, a, b = 0.0, 0.02, -0.04, 0.04
    lo = 0.5 * (1 + math.erf((a - mean) / std / math.sqrt(2.0)))  # the normal's CDF at the bounds
    hi = 0.5 * (1 + math.erf((b - mean) / std / math.sqrt(2.0)))

    def init(threads: int):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=5):  # strict
            t = torch.empty(257, 129)
            t.uniform_(2 * lo - 1, 2 * hi - 1)
            draws = t.clone()
            t.erfinv_()
            inverted = t.clone()
            t.mul_(std * math.sqrt(2.0))
            t.add_(mean)
            t.clamp_(min=a, max=b)
        return draws, inverted, t

    one, two = init(1), init(2)
    for k, (x, y) in enumerate(zip(one, two)):
        assert torch.equal(as_bits(x), as_bits(y)), f"step {k}"
    draws, inverted, t = one
    assert_bits_equal(inverted, as_bits(carbon.erfinv(draws)), "erfinv_")
    assert t.min() >= a and t.max() <= b
    # out= and functional forms run the same function
    with carbon.enabled():
        out = torch.empty_like(draws)
        torch.erfinv(draws, out=out)
        assert_bits_equal(out, as_bits(carbon.erfinv(draws)), "erfinv(out=)")
        assert_bits_equal(torch.special.erfinv(draws), as_bits(carbon.erfinv(draws)), "torch.special.erfinv")


def round_bits_value(q: Fraction) -> float:
    """RN32(q) as a Python float."""
    return bits_to_float(round_bits(q, F32), F32)


# ---- F.fold / col2im ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel,dilation,padding,stride", [
    ((3, 3), (1, 1), (1, 1), (2, 2)),
    ((2, 3), (2, 1), (0, 2), (1, 3)),
    ((1, 1), (1, 1), (0, 0), (1, 1)),
])
def test_fold_gives_each_position_one_rounding_of_the_exact_sum_of_its_entries(kernel, dilation, padding, stride):
    h, w, c, n = 7, 9, 2, 2
    oh = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    cols = _randn(n, c * kernel[0] * kernel[1], oh * ow, seed=1) + _randn(n, c * kernel[0] * kernel[1], oh * ow,
                                                                          seed=2, scale=1e-6)
    cols[0, 0, 0] = 3e7  # a large term that cancels only in the exact sum
    cols[0, 0, 1 % (oh * ow)] = -3e7
    with carbon.enabled():
        got = F.fold(cols, (h, w), kernel, dilation=dilation, padding=padding, stride=stride)
    terms = {}
    v = cols.double().tolist()
    for b in range(n):
        for ch in range(c):
            for ki in range(kernel[0]):
                for kj in range(kernel[1]):
                    row = (ch * kernel[0] + ki) * kernel[1] + kj
                    for li in range(oh):
                        for lj in range(ow):
                            y = li * stride[0] - padding[0] + ki * dilation[0]
                            x = lj * stride[1] - padding[1] + kj * dilation[1]
                            if 0 <= y < h and 0 <= x < w:
                                terms.setdefault((b, ch, y, x), []).append(v[b][row][li * ow + lj])
    want = [row_quotient_bits(terms.get((b, ch, y, x), [0.0]), 1, F32)
            for b in range(n) for ch in range(c) for y in range(h) for x in range(w)]
    assert_bits_equal(got, bits_tensor(want, F32).reshape(n, c, h, w), "fold")
    # unbatched input: the same bits as a batch of one
    with carbon.enabled():
        alone = F.fold(cols[1], (h, w), kernel, dilation=dilation, padding=padding, stride=stride)
    assert torch.equal(as_bits(alone), as_bits(got[1]))


def test_unfold_is_a_copy_and_its_gradient_is_fold():
    x = _randn(2, 3, 6, 8, seed=3).requires_grad_()
    g = _randn(2, 3 * 4, 5 * 7, seed=4)
    with carbon.enabled():
        cols = F.unfold(x, 2)
        cols.backward(g)
        want = F.fold(g, (6, 8), 2)
    ref = torch.nn.functional.unfold(x.detach(), 2)  # torch's own im2col: a gather, no arithmetic
    assert torch.equal(as_bits(cols), as_bits(ref))
    assert torch.equal(as_bits(x.grad), as_bits(want))


def test_fold_rejects_inconsistent_shapes():
    with carbon.enabled(), pytest.raises(RuntimeError, match="col2im"):
        F.fold(torch.zeros(1, 4, 5), (4, 4), 2)


# ---- modulo, log-add-exp, distance --------------------------------------------------------------------------------

def _remainder_reference(x: float, y: float, dtype: torch.dtype) -> int:
    """FMOD exactly (math.fmod is exact), then m + y rounded to float32 where signs differ, then to dtype."""
    m = math.fmod(x, y) if (math.isfinite(x) and y != 0 and not math.isnan(y)) else math.nan
    if math.isinf(y) and math.isfinite(x):
        m = x
    if m == m and m != 0 and (m < 0) != (y < 0):
        m = y if math.isinf(y) else round_bits_value(Fraction(m) + Fraction(y))
    return round_bits(m, dtype)


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_remainder_follows_pythons_modulo_step_by_step(dtype):
    x = torch.cat([_randn(300, seed=5, scale=10.0), torch.tensor([0.0, -0.0, 5.0, -5.0, math.inf, math.nan, 1e-30,
                                                                   -1e-30, 3e38])]).to(dtype)
    ys = [0.3, -0.7, 2.5]
    for y in ys:
        with carbon.enabled():
            got = torch.remainder(x, y)
        y_compute = round_bits_value(Fraction(y))  # the number in float32, torch's compute type
        want = [_remainder_reference(v, y_compute, dtype) for v in _values(x)]
        _assert_bits_or_both_nan(got, bits_tensor(want, dtype), f"remainder by {y}")
    yt = torch.cat([_randn(300, seed=6), torch.tensor([0.0, -1.0, math.inf, -math.inf, 1.0, 2.0, -3.0, 0.5, 1e-30])])
    yt = yt.to(dtype)
    with carbon.enabled():
        got = x % yt
    want = [_remainder_reference(a, b, dtype) for a, b in zip(_values(x), _values(yt))]
    _assert_bits_or_both_nan(got, bits_tensor(want, dtype), "remainder of two tensors")
    with carbon.enabled():
        assert torch.equal(torch.remainder(torch.arange(-5, 5), 3), torch.arange(-5, 5) % 3)


def test_logaddexp_is_max_plus_carbons_log1p_of_carbons_exp():
    x = torch.cat([_randn(200, seed=7, scale=5.0), torch.tensor([math.inf, -math.inf, -math.inf, math.nan, 0.0])])
    y = torch.cat([_randn(200, seed=8, scale=5.0), torch.tensor([math.inf, -math.inf, 1.0, 0.0, -0.0])])
    with carbon.enabled():
        got = torch.logaddexp(x, y)
    want = []
    for a, b in zip(_values(x), _values(y)):
        if math.isinf(a) and a == b:
            want.append(a)
            continue
        d = round_bits_value(Fraction(a) - Fraction(b)) if math.isfinite(a) and math.isfinite(b) else a - b
        t = carbon.log1p(carbon.exp(torch.tensor([-abs(d)], dtype=F32))).item()
        m = max(a, b) if a == a and b == b else math.nan
        want.append(m + t if not (math.isfinite(m) and math.isfinite(t)) else round_bits_value(Fraction(m) + Fraction(t)))
    _assert_bits_or_both_nan(got, _bits_of(want), "logaddexp")
    # close to the true value (a sanity check of the formula, not of the bits)
    true = torch.logaddexp(x.double(), y.double())
    finite = torch.isfinite(true)
    assert torch.allclose(got.double()[finite], true[finite], rtol=1e-6, atol=1e-6)


def test_dist_is_the_rounded_root_of_the_rounded_exact_sum_of_squared_differences():
    x = _randn(7, 11, seed=9, scale=1e3)
    y = x + _randn(7, 11, seed=10, scale=1e-3)  # differences far below the values
    with carbon.enabled():
        got = torch.dist(x, y)
        inf_norm = torch.dist(x, y, float("inf"))
    diffs = [round_bits_value(Fraction(a) - Fraction(b)) for a, b in zip(_values(x), _values(y))]
    total = row_sum_bits([d * d for d in diffs], F32)  # d·d is exact in binary64
    assert_bits_equal(got.reshape(1), _bits_of([sqrt_rn32(bits_to_float(total, F32))]), "dist")
    assert inf_norm.item() == max(abs(d) for d in diffs)


# ---- selections ---------------------------------------------------------------------------------------------------

def test_selections_run_as_torchs_own_and_return_input_values():
    x = _randn(6, 9, seed=12)
    with carbon.enabled():
        results = {
            "median": torch.median(x), "nanmedian": torch.nanmedian(x, 1).values, "kthvalue": torch.kthvalue(x, 4).values,
            "mode": torch.mode(x.round()).values, "cummax": torch.cummax(x, 1).values, "cummin": torch.cummin(x, 0).values,
        }
        buckets = torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0]))
        found = torch.searchsorted(torch.sort(x[0]).values, x)
        frac = torch.frac(x * 100)
    inputs = set(_values(x)) | set(_values(x.round()))
    for name, r in results.items():
        assert set(_values(r)) <= inputs, name
    assert torch.equal(buckets, torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0])))
    assert torch.equal(found, torch.searchsorted(torch.sort(x[0]).values, x))
    scaled = _values(x * 100)
    want = [Fraction(v) - math.trunc(Fraction(v)) for v in scaled]  # exact: frac never rounds
    assert [Fraction(v) for v in _values(frac)] == want


# ---- embedding_bag ------------------------------------------------------------------------------------------------

def _bags(idx: list, offsets: list, include_last_offset: bool) -> list:
    ends = offsets[1:] if include_last_offset else offsets[1:] + [len(idx)]
    starts = offsets[:-1] if include_last_offset else offsets
    return [idx[s:e] for s, e in zip(starts, ends)]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_and_its_gradient_follow_the_exact_definitions(mode, include_last_offset):
    w = (_randn(12, 6, seed=20) + _randn(12, 6, seed=21, scale=1e-7)).requires_grad_()
    with torch.no_grad():
        w[3] *= 1e6  # rows of very different sizes: a float32 running sum would lose the small ones
    idx = [3, 1, 2, 3, 5, 0, 0, 7, 3, 11, 5, 5, 2]
    offsets = [0, 4, 4, 9, 13] if include_last_offset else [0, 4, 4, 9]
    g = _randn(4 if include_last_offset else 4, 6, seed=22)
    with carbon.enabled():
        out = F.embedding_bag(torch.tensor(idx), w, torch.tensor(offsets), mode=mode, padding_idx=0,
                              include_last_offset=include_last_offset)
        out.backward(g)
    wv, gv = w.detach().double().tolist(), g.double().tolist()
    want, grads = [], {}
    for b, bag in enumerate(_bags(idx, offsets, include_last_offset)):
        rows = [r for r in bag if r != 0]
        for j in range(6):
            col = [wv[r][j] for r in rows]
            if mode == "max":
                want.append(round_bits(max(col), F32) if col else round_bits(0.0, F32))
                if col:
                    top = rows[col.index(max(col))]
                    grads.setdefault((top, j), []).append(gv[b][j])
                continue
            s = row_sum_bits(col or [0.0], F32)
            if mode == "sum":
                want.append(s)
                share = gv[b][j]
            else:
                want.append(round_bits(Fraction(bits_to_float(s, F32)) / max(len(rows), 1), F32))
                share = bits_to_float(round_bits(Fraction(gv[b][j]) / max(len(rows), 1), F32), F32)
            for r in rows:
                grads.setdefault((r, j), []).append(share)
    assert_bits_equal(out, bits_tensor(want, F32).reshape(out.shape), f"embedding_bag {mode}")
    want_grad = [row_sum_bits(grads.get((r, j), [0.0]), F32) for r in range(12) for j in range(6)]
    assert_bits_equal(w.grad, bits_tensor(want_grad, F32).reshape(12, 6), f"embedding_bag {mode} gradient")


def test_embedding_bag_per_sample_weights_sum_exact_products():
    w = (_randn(8, 5, seed=23) * 1e3).requires_grad_()
    psw = (_randn(7, seed=24).abs() + 1e-4).requires_grad_()
    idx, offsets = [1, 2, 1, 7, 3, 3, 0], [0, 3, 5]
    g = _randn(3, 5, seed=25)
    with carbon.enabled():
        out = F.embedding_bag(torch.tensor(idx), w, torch.tensor(offsets), mode="sum", per_sample_weights=psw)
        out.backward(g)
    wv, pv, gv = w.detach().double().tolist(), _values(psw), g.double().tolist()
    bags = _bags(list(range(7)), offsets, False)  # positions, to pair each index with its weight
    want = [exact_row_bits([Fraction(wv[idx[i]][j]) * Fraction(pv[i]) for i in bag]) for bag in bags for j in range(5)]
    assert_bits_equal(out, bits_tensor(want, F32).reshape(3, 5), "per-sample-weighted bags")
    bag_of = {i: b for b, bag in enumerate(bags) for i in bag}
    want_p = [exact_row_bits([Fraction(gv[bag_of[i]][j]) * Fraction(wv[idx[i]][j]) for j in range(5)]) for i in range(7)]
    assert_bits_equal(psw.grad, bits_tensor(want_p, F32), "per-sample-weight gradient")


def exact_row_bits(terms: list) -> int:
    """RN32 of an exact Fraction sum."""
    return round_bits(sum(terms, Fraction(0)), F32)


def test_embedding_bag_module_with_two_dimensional_input_matches_flat_offsets():
    m = torch.nn.EmbeddingBag(30, 4, mode="mean")
    x = torch.randint(0, 30, (5, 3), generator=torch.Generator().manual_seed(0))
    with carbon.enabled():
        a = m(x)
        b = m(x.reshape(-1), torch.arange(0, 15, 3))
    assert torch.equal(as_bits(a), as_bits(b))


# ---- 3-d average pooling ------------------------------------------------------------------------------------------

def _regions(size: int, out: int) -> list:
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def test_avg_pool3d_and_its_gradient_are_exact_window_means_and_sums():
    x = (_randn(1, 2, 5, 6, 7, seed=30) * torch.logspace(-4, 4, 7)).requires_grad_()
    k, s, p = (2, 3, 2), (2, 2, 3), (1, 1, 0)
    with carbon.enabled():
        y = F.avg_pool3d(x, k, s, p)
        g = torch.linspace(-1, 2, y.numel()).reshape(y.shape)
        y.backward(g)
    xv = x.detach().double().numpy()
    size = k[0] * k[1] * k[2]
    want, shares = [], {}
    gv = g.double().reshape(-1).tolist()
    for c in range(2):
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                for l in range(y.shape[4]):
                    terms, at = [], []
                    for a in range(k[0]):
                        for b in range(k[1]):
                            for e in range(k[2]):
                                z, yy, xx = i * s[0] - p[0] + a, j * s[1] - p[1] + b, l * s[2] - p[2] + e
                                if 0 <= z < 5 and 0 <= yy < 6 and 0 <= xx < 7:
                                    terms.append(float(xv[0, c, z, yy, xx]))
                                    at.append((c, z, yy, xx))
                    want.append(row_quotient_bits(terms or [0.0], size, F32))
                    share = round_bits_value(Fraction(gv[len(want) - 1]) / size)
                    for pos in at:
                        shares.setdefault(pos, []).append(share)
    assert_bits_equal(y, bits_tensor(want, F32).reshape(y.shape), "avg_pool3d")
    want_g = [row_sum_bits(shares.get((c, z, yy, xx), [0.0]), F32)
              for c in range(2) for z in range(5) for yy in range(6) for xx in range(7)]
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(x.shape), "avg_pool3d gradient")


@pytest.mark.parametrize("out", [(2, 3, 3), (1, 1, 1)])
def test_adaptive_avg_pool3d_is_the_exact_mean_of_each_region(out):
    x = (_randn(2, 5, 6, 9, seed=31) * torch.logspace(-5, 5, 9)).requires_grad_()
    with carbon.enabled():
        y = F.adaptive_avg_pool3d(x, out)
        y.sum().backward()
    xv = x.detach().double().numpy()
    want, grads = [], {}
    for c in range(2):
        for r0 in _regions(5, out[0]):
            for r1 in _regions(6, out[1]):
                for r2 in _regions(9, out[2]):
                    terms = [float(xv[c, z, yy, xx]) for z in range(*r0) for yy in range(*r1) for xx in range(*r2)]
                    want.append(row_quotient_bits(terms, len(terms), F32))
                    share = round_bits_value(Fraction(1) / len(terms))
                    for z in range(*r0):
                        for yy in range(*r1):
                            for xx in range(*r2):
                                grads.setdefault((c, z, yy, xx), []).append(share)
    assert_bits_equal(y, bits_tensor(want, F32).reshape(y.shape), f"adaptive_avg_pool3d {out}")
    # overlapping regions add their shares one rounded addition at a time, in row-major order
    want_g = []
    for c in range(2):
        for z in range(5):
            for yy in range(6):
                for xx in range(9):
                    acc = 0.0
                    for v in grads[(c, z, yy, xx)]:
                        acc = round_bits_value(Fraction(acc) + Fraction(v))
                    want_g.append(round_bits(acc, F32))
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(x.shape), f"adaptive_avg_pool3d {out} gradient")


# ---- bicubic upsampling -------------------------------------------------------------------------------------------

def _cubic_rows(size_in: int, size_out: int, align_corners: bool, factor) -> list:
    """Per output index {input index: Fraction weight}: torch's bicubic rule (Keys' kernel, A = −0.75,
    taps clamped to the edge) evaluated in binary64 as docs/enable.md states, each summed weight then
    rounded to float32."""
    a = -0.75
    if align_corners:
        scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        scale = 1.0 / factor if factor else size_in / size_out
    rows = []
    for dst in range(size_out):
        src = scale * dst if align_corners else scale * (dst + 0.5) - 0.5
        base = math.floor(src)
        t = src - base
        taps = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                ((a + 2) * t - (a + 3)) * t * t + 1,
                ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
        row = {}
        for k, wt in enumerate(taps):
            i = min(max(base - 1 + k, 0), size_in - 1)
            row[i] = row.get(i, 0.0) + wt
        rows.append({i: Fraction(round_bits_value(Fraction(wt))) for i, wt in row.items()})
    return rows


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(9, 4), None])
def test_bicubic_upsampling_is_two_exact_separable_passes(align_corners, size):
    x = _randn(1, 2, 5, 6, seed=40).requires_grad_()
    factor = None if size else 2.5
    with carbon.enabled():
        y = F.interpolate(x, size=size, scale_factor=factor, mode="bicubic", align_corners=align_corners)
        g = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(g)
    ho, wo = y.shape[-2:]
    ah, aw = _cubic_rows(5, ho, align_corners, factor), _cubic_rows(6, wo, align_corners, factor)
    xs, gs = x.detach().double().tolist()[0], g.double().tolist()[0]
    want_y, want_dx = [], []
    for c in range(2):
        rows = [[Fraction(round_bits_value(sum(wt * Fraction(xs[c][i][k]) for k, wt in aw[j].items())))
                 for j in range(wo)] for i in range(5)]
        want_y += [round_bits(sum(wt * rows[k][j] for k, wt in ah[i].items()), F32) for i in range(ho) for j in range(wo)]
        gw = [[Fraction(round_bits_value(sum(aw[j].get(k, 0) * Fraction(gs[c][i][j]) for j in range(wo))))
               for k in range(6)] for i in range(ho)]
        want_dx += [round_bits(sum(ah[i].get(r, 0) * gw[i][k] for i in range(ho)), F32) for r in range(5) for k in range(6)]
    assert_bits_equal(y, bits_tensor(want_y, F32).reshape(y.shape), "bicubic")
    assert_bits_equal(x.grad, bits_tensor(want_dx, F32).reshape(x.shape), "bicubic gradient")
    # the same interpolation as torch's own (which rounds differently inside)
    ref = torch.nn.functional.interpolate(x.detach(), size=size, scale_factor=factor, mode="bicubic",
                                          align_corners=align_corners)
    assert torch.allclose(y, ref, atol=1e-5)


def _antialias_rows(size_in: int, size_out: int, align_corners: bool, factor, cubic: bool) -> list:
    """Per output index {input index: Fraction weight}: torch's antialiased rule (PIL's) as docs/enable.md states
    it, in binary64 — the triangle or Keys' cubic (A = −0.5) filter stretched by the scale when downsampling,
    taps xmin … xmax − 1 around c = scale·(i + 0.5), normalized by their sum — each weight rounded to float32."""
    if align_corners:
        scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        scale = 1.0 / factor if factor else size_in / size_out
    stretch = scale if scale >= 1.0 else 1.0
    support = (2.0 if cubic else 1.0) * stretch

    def kernel(x: float) -> float:
        x, a = abs(x), -0.5
        if not cubic:
            return max(1.0 - x, 0.0)
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a if x < 2.0 else 0.0
    rows = []
    for dst in range(size_out):
        c = scale * (dst + 0.5)
        lo, hi = max(int(c - support + 0.5), 0), min(int(c + support + 0.5), size_in)
        w = {j: kernel((j - c + 0.5) / stretch) for j in range(lo, hi)}
        total = 0.0
        for v in w.values():
            total += v
        rows.append({j: Fraction(round_bits_value(Fraction(v / total if total else v))) for j, v in w.items()})
    return rows


@pytest.mark.parametrize("cubic", [False, True])
@pytest.mark.parametrize("size, factor, align_corners", [((3, 4), None, False), ((3, 4), None, True),
                                                         ((9, 14), None, False), (None, 0.45, False)])
def test_antialiased_resizing_is_two_exact_separable_passes(cubic, size, factor, align_corners):
    x = _randn(1, 2, 7, 9, seed=41).requires_grad_()
    mode = "bicubic" if cubic else "bilinear"
    with carbon.enabled():
        y = F.interpolate(x, size=size, scale_factor=factor, mode=mode, antialias=True, align_corners=align_corners)
        g = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(g)
    ho, wo = y.shape[-2:]
    ah = _antialias_rows(7, ho, align_corners, factor, cubic)
    aw = _antialias_rows(9, wo, align_corners, factor, cubic)
    xs, gs = x.detach().double().tolist()[0], g.double().tolist()[0]
    want_y, want_dx = [], []
    for c in range(2):
        rows = [[Fraction(round_bits_value(sum(wt * Fraction(xs[c][i][k]) for k, wt in aw[j].items())))
                 for j in range(wo)] for i in range(7)]
        want_y += [round_bits(sum(wt * rows[k][j] for k, wt in ah[i].items()), F32) for i in range(ho) for j in range(wo)]
        gw = [[Fraction(round_bits_value(sum(aw[j].get(k, 0) * Fraction(gs[c][i][j]) for j in range(wo))))
               for k in range(9)] for i in range(ho)]
        want_dx += [round_bits(sum(ah[i].get(r, 0) * gw[i][k] for i in range(ho)), F32) for r in range(7) for k in range(9)]
    assert_bits_equal(y, bits_tensor(want_y, F32).reshape(y.shape), f"{mode} antialias")
    assert_bits_equal(x.grad, bits_tensor(want_dx, F32).reshape(x.shape), f"{mode} antialias gradient")
    # the same resampling as torch's own (whose weights are computed in float32)
    ref = F.interpolate(x.detach(), size=size, scale_factor=factor, mode=mode, antialias=True,
                        align_corners=align_corners)
    assert torch.allclose(y, ref, atol=2e-5)


# ---- average pooling with ceil_mode / count_include_pad=False -------------------------------------------------------

def _torch_windows(size: int, k: int, s: int, p: int, ceil_mode: bool, count_pad: bool) -> list:
    """torch's avg_pool rule along one dimension: [(valid lo, valid hi, divisor factor)] per output index."""
    out = (math.ceil((size + 2 * p - k) / s) if ceil_mode else (size + 2 * p - k) // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    result = []
    for o in range(out):
        start, end = o * s - p, min(o * s - p + k, size + p)
        lo, hi = max(start, 0), min(end, size)
        result.append((lo, hi, end - start if count_pad else hi - lo))
    return result


@pytest.mark.parametrize("k,s,p,ceil_mode,count_pad", [
    ((2, 2), (2, 2), (0, 0), True, False),   # ResNet-D's average-pool shortcut
    ((3, 3), (2, 2), (1, 1), False, False),
    ((3, 2), (2, 3), (1, 1), True, True),
])
def test_avg_pool2d_with_border_divisors_is_the_exact_mean_of_each_window(k, s, p, ceil_mode, count_pad):
    x = (_randn(2, 7, 9, seed=41) * torch.logspace(-3, 3, 9)).requires_grad_()
    with carbon.enabled():
        y = F.avg_pool2d(x, k, s, p, ceil_mode=ceil_mode, count_include_pad=count_pad)
        g = torch.linspace(-2, 1, y.numel()).reshape(y.shape)
        y.backward(g)
    rows, cols = _torch_windows(7, k[0], s[0], p[0], ceil_mode, count_pad), _torch_windows(9, k[1], s[1], p[1], ceil_mode, count_pad)
    assert tuple(y.shape) == (2, len(rows), len(cols))
    xv, gv = x.detach().double().tolist(), g.double().tolist()
    want, shares = [], {}
    for c in range(2):
        for i, (r0, r1, dr) in enumerate(rows):
            for j, (c0, c1, dc) in enumerate(cols):
                terms = [xv[c][a][b] for a in range(r0, r1) for b in range(c0, c1)]
                want.append(round_bits(sum(map(Fraction, terms), Fraction(0)) / (dr * dc), F32))
                share = round_bits_value(Fraction(gv[c][i][j]) / (dr * dc))
                for a in range(r0, r1):
                    for b in range(c0, c1):
                        shares.setdefault((c, a, b), []).append(share)
    assert_bits_equal(y, bits_tensor(want, F32).reshape(y.shape), "avg_pool2d")
    want_g = [row_sum_bits(shares.get((c, a, b), [0.0]), F32) for c in range(2) for a in range(7) for b in range(9)]
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(x.shape), "avg_pool2d gradient")


# ---- cdist --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [5, 40])  # torch takes _cdist_forward below 25 rows, _euclidean_dist (mm) above
def test_cdist_is_the_rounded_root_of_the_exact_sum_of_squared_exact_differences(n):
    x = _randn(n, 6, seed=50, scale=1e3)
    y = _randn(7, 6, seed=51, scale=1e3)
    y[0] = x[0] + _randn(6, seed=52, scale=1e-3)  # nearly equal rows: x² + y² − 2xy cancels in float32
    with carbon.enabled():
        got = torch.cdist(x, y)
    xv, yv = x.double().tolist(), y.double().tolist()
    want = []
    for i in range(n):
        for j in range(7):
            total = sum(((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(xv[i], yv[j])), Fraction(0))
            want.append(round_bits(Fraction(sqrt_rn32(round_bits_value(total))), F32))
    assert_bits_equal(got, bits_tensor(want, F32).reshape(n, 7), "cdist p=2")
    with carbon.enabled():
        alone = torch.cdist(x[:1], y)  # a row alone: the same bits (batch invariance)
    assert torch.equal(as_bits(alone[0]), as_bits(got[0]))


def test_cdist_p1_and_pinf_and_the_p2_gradient_follow_their_definitions():
    x = _randn(4, 5, seed=53).requires_grad_()
    y = (_randn(3, 5, seed=54) * 1e4)
    xv, yv = x.detach().double().tolist(), y.double().tolist()
    with carbon.enabled():
        d1 = torch.cdist(x, y, p=1)
        dinf = torch.cdist(x, y, p=float("inf"))
        d2 = torch.cdist(x, y)
        g = torch.linspace(-1, 1, 12).reshape(4, 3)
        d2.backward(g)
    want1 = [round_bits(sum((abs(Fraction(a) - Fraction(b)) for a, b in zip(xv[i], yv[j])), Fraction(0)), F32)
             for i in range(4) for j in range(3)]
    assert_bits_equal(d1, bits_tensor(want1, F32).reshape(4, 3), "cdist p=1")
    wantinf = [round_bits(max(abs(Fraction(a) - Fraction(b)) for a, b in zip(xv[i], yv[j])), F32)
               for i in range(4) for j in range(3)]
    assert_bits_equal(dinf, bits_tensor(wantinf, F32).reshape(4, 3), "cdist p=inf")
    # gradient: r = RN(g / d); RN(RN(x·RN(Σⱼ r)) − RN(Σⱼ r·y)), both sums exact
    dv, gv = d2.detach().double().tolist(), g.double().tolist()
    want_g = []
    for i in range(4):
        r = [round_bits_value(Fraction(gv[i][j]) / Fraction(dv[i][j])) for j in range(3)]
        s = round_bits_value(sum(map(Fraction, r), Fraction(0)))
        for k in range(5):
            first = round_bits_value(Fraction(xv[i][k]) * Fraction(s))
            second = round_bits_value(sum((Fraction(r[j]) * Fraction(yv[j][k]) for j in range(3)), Fraction(0)))
            want_g.append(round_bits(Fraction(first) - Fraction(second), F32))
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(4, 5), "cdist p=2 gradient")


# ---- complex numbers ----------------------------------------------------------------------------------------------

def _complex(seed: int, n: int, scale: float = 1.0) -> torch.Tensor:
    return torch.view_as_complex(_randn(n, 2, seed=seed, scale=scale).contiguous())


def test_complex_products_round_each_product_and_the_sum():
    x, y, real_factor = _complex(60, 300, 1e3), _complex(61, 300), _randn(300, seed=62)
    with carbon.enabled():
        got = x * y
        by_real = x * real_factor
    xr, xi = _values(torch.view_as_real(x)[:, 0]), _values(torch.view_as_real(x)[:, 1])
    yr, yi = _values(torch.view_as_real(y)[:, 0]), _values(torch.view_as_real(y)[:, 1])

    def rn(q: Fraction) -> Fraction:
        return Fraction(round_bits_value(q))
    real = [round_bits(rn(Fraction(a) * Fraction(c)) - rn(Fraction(b) * Fraction(d)), F32)
            for a, b, c, d in zip(xr, xi, yr, yi)]
    imag = [round_bits(rn(Fraction(a) * Fraction(d)) + rn(Fraction(b) * Fraction(c)), F32)
            for a, b, c, d in zip(xr, xi, yr, yi)]
    assert_bits_equal(torch.view_as_real(got)[:, 0].contiguous(), bits_tensor(real, F32), "complex product, real part")
    assert_bits_equal(torch.view_as_real(got)[:, 1].contiguous(), bits_tensor(imag, F32), "complex product, imaginary part")
    r = _values(_randn(300, seed=62))
    want = [round_bits(Fraction(a) * Fraction(c), F32) for a, c in zip(xr, r)]
    assert_bits_equal(torch.view_as_real(by_real)[:, 0].contiguous(), bits_tensor(want, F32), "complex by real")


def test_complex_sum_and_polar_are_exact_per_part():
    x = _complex(63, 500, 1e4)
    theta = _randn(50, seed=64, scale=3.0)
    r = _randn(50, seed=65).abs()
    with carbon.enabled():
        total = x.sum()
        z = torch.polar(r, theta)
    parts = torch.view_as_real(x)
    assert_bits_equal(torch.view_as_real(total)[0].reshape(1), bits_tensor([row_sum_bits(_values(parts[:, 0]), F32)], F32), "sum re")
    assert_bits_equal(torch.view_as_real(total)[1].reshape(1), bits_tensor([row_sum_bits(_values(parts[:, 1]), F32)], F32), "sum im")
    cos, sin = _values(carbon.cos(theta)), _values(carbon.sin(theta))
    want_re = [round_bits(Fraction(a) * Fraction(c), F32) for a, c in zip(_values(r), cos)]
    want_im = [round_bits(Fraction(a) * Fraction(s), F32) for a, s in zip(_values(r), sin)]
    assert_bits_equal(torch.view_as_real(z)[:, 0].contiguous(), bits_tensor(want_re, F32), "polar re")
    assert_bits_equal(torch.view_as_real(z)[:, 1].contiguous(), bits_tensor(want_im, F32), "polar im")


def test_rotary_embedding_written_with_complex_numbers_runs_under_strict_enable(restore_num_threads):
    """torchtitan / Meta's Llama reference style: torch.polar, view_as_complex, a complex product; the same
    bits at one and two threads, forward and backward."""
    def rope(x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis).flatten(-2)

    x0 = _randn(2, 6, 3, 8, seed=66)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x = x0.clone().requires_grad_()
        with carbon.enabled():
            freqs = torch.outer(torch.arange(6.0), 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8)))
            cis = torch.polar(torch.ones_like(freqs), freqs)[None, :, None, :]
            y = rope(x, cis)
            y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
        results.append((as_bits(y), as_bits(x.grad)))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    ref = rope(x0, torch.polar(torch.ones(6, 4), torch.outer(torch.arange(6.0), 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))))[None, :, None, :])
    assert torch.allclose(ref, y.detach(), atol=1e-5)


def test_other_complex_arithmetic_is_refused_not_silently_run():
    c = _complex(67, 6)
    for name, fn in [("sqrt", lambda: torch.sqrt(c)), ("log", lambda: torch.log(c)), ("tanh", lambda: torch.tanh(c)),
                     ("pow", lambda: c ** 2.5), ("add with a complex alpha", lambda: torch.add(c, c, alpha=1j))]:
        with carbon.enabled(), pytest.raises(carbon.NotExactError):
            fn()
    with carbon.enabled():
        assert torch.equal(torch.view_as_real(c + c), torch.view_as_real(c) * 2)  # componentwise: exact


# ---- grid_sample / affine_grid --------------------------------------------------------------------------------------

def _rn(q) -> float:
    return round_bits_value(Fraction(q))


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_bilinear_grid_sample_and_its_gradients_follow_the_documented_sequence(padding, align):
    n, c, h, w = 1, 3, 4, 5
    x = _randn(n, c, h, w, seed=70).requires_grad_()
    grid = (_randn(n, 3, 2, 2, seed=71) * 0.8).requires_grad_()
    with torch.no_grad():
        grid[0, 0, 0] = torch.tensor([1.3, -1.1])  # outside the image: +0 corners / a clamped coordinate
        grid[0, 1, 1] = torch.tensor([-2.7, 3.4])  # reflected more than once
    with carbon.enabled():
        y = F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=align)
        gy = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(gy)
    xv, gv, gyv = x.detach().double().tolist()[0], grid.detach().double().tolist()[0], gy.double().tolist()[0]
    mx = _rn((w - 1) / 2 if align else w / 2)
    my = _rn((h - 1) / 2 if align else h / 2)
    want_y, shares, want_grid = [], {}, []
    for i in range(3):
        for j in range(2):
            gx_, gy_ = gv[i][j]
            ix = ((gx_ + 1) / 2) * (w - 1) if align else ((gx_ + 1) * w - 1) / 2  # binary64, as documented
            iy = ((gy_ + 1) / 2) * (h - 1) if align else ((gy_ + 1) * h - 1) / 2
            sign = (1.0, 1.0)
            if padding == "reflection":
                (ix, sx), (iy, sy) = _reflect(ix, w, align), _reflect(iy, h, align)
                sign = (sx, sy)
            clip = (0 < ix < w - 1, 0 < iy < h - 1)
            if padding != "zeros":
                ix, iy = min(max(ix, 0.0), w - 1.0), min(max(iy, 0.0), h - 1.0)
            x0, y0 = math.floor(ix), math.floor(iy)
            wx, wy = (x0 + 1 - ix, ix - x0), (y0 + 1 - iy, iy - y0)
            corners = [(y0, x0, wx[0] * wy[0]), (y0, x0 + 1, wx[1] * wy[0]), (y0 + 1, x0, wx[0] * wy[1]),
                       (y0 + 1, x0 + 1, wx[1] * wy[1])]

            def val(ch, yy, xx):
                return xv[ch][yy][xx] if 0 <= yy < h and 0 <= xx < w else 0.0
            for ch in range(c):
                acc = None
                for yy, xx, wt in corners:
                    term = _rn(Fraction(_rn(wt)) * Fraction(val(ch, yy, xx)))
                    acc = term if acc is None else _rn(Fraction(acc) + Fraction(term))
                    if 0 <= yy < h and 0 <= xx < w:
                        shares.setdefault((ch, yy, xx), []).append(_rn(Fraction(gyv[ch][i][j]) * Fraction(_rn(wt))))
                want_y.append((ch, i, j, round_bits(acc, F32)))
            tx = [_rn(Fraction(_rn(_rn(wy[0]) * Fraction(_rn(Fraction(val(ch, y0, x0 + 1)) - Fraction(val(ch, y0, x0)))))) +
                           Fraction(_rn(_rn(wy[1]) * Fraction(_rn(Fraction(val(ch, y0 + 1, x0 + 1)) - Fraction(val(ch, y0 + 1, x0)))))))
                  for ch in range(c)]
            ty = [_rn(Fraction(_rn(_rn(wx[0]) * Fraction(_rn(Fraction(val(ch, y0 + 1, x0)) - Fraction(val(ch, y0, x0)))))) +
                           Fraction(_rn(_rn(wx[1]) * Fraction(_rn(Fraction(val(ch, y0 + 1, x0 + 1)) - Fraction(val(ch, y0, x0 + 1)))))))
                  for ch in range(c)]
            for t, m, k in ((tx, mx, 0), (ty, my, 1)):
                dot = _rn(sum((Fraction(gyv[ch][i][j]) * Fraction(t[ch]) for ch in range(c)), Fraction(0)))
                r = _rn(Fraction(dot) * Fraction(m))
                if padding != "zeros" and not clip[k]:
                    r = 0.0
                want_grid.append(round_bits(r * sign[k], F32))  # ±1: exact
    by_position = {(ch, i, j): b for ch, i, j, b in want_y}
    want_list = [by_position[(ch, i, j)] for ch in range(c) for i in range(3) for j in range(2)]
    assert_bits_equal(y, bits_tensor(want_list, F32).reshape(y.shape), "grid_sample values")
    want_gx = [row_sum_bits(shares.get((ch, yy, xx), [0.0]), F32) for ch in range(c) for yy in range(h) for xx in range(w)]
    assert_bits_equal(x.grad, bits_tensor(want_gx, F32).reshape(x.shape), "grid_sample input gradient")
    assert_bits_equal(grid.grad, bits_tensor(want_grid, F32).reshape(grid.shape), "grid_sample grid gradient")


def test_nearest_grid_sample_copies_and_non_finite_coordinates_give_nan():
    x = _randn(1, 2, 3, 4, seed=72)
    grid = torch.tensor([[[[0.0, 0.0], [-1.0, -1.0], [0.99, 0.2], [math.nan, 0.0], [math.inf, 0.5]]]])
    with carbon.enabled():
        y = F.grid_sample(x, grid, mode="nearest", align_corners=True)
    ix = [round(((g + 1) / 2) * 3) for g in (0.0, -1.0, 0.99)]  # Python's round: half to even, as nearbyint
    iy = [round(((g + 1) / 2) * 2) for g in (0.0, -1.0, 0.2)]
    for k in range(3):
        assert torch.equal(y[0, :, 0, k], x[0, :, iy[k], ix[k]])
    assert torch.isnan(y[0, :, 0, 3:]).all()


def test_affine_grid_entries_are_exact_dot_products_of_the_base_grid():
    theta = _randn(2, 2, 3, seed=73, scale=100.0)
    with carbon.enabled():
        grid = F.affine_grid(theta, (2, 1, 3, 4), align_corners=False)
    tv = theta.double().tolist()
    xs = [_rn(Fraction(_rn(Fraction(_rn(-1 + 2 * j / 3)) * 3)) / 4) for j in range(4)]  # linspace, ·(n − 1), / n
    ys = [_rn(Fraction(_rn(Fraction(_rn(-1 + 2 * i / 2)) * 2)) / 3) for i in range(3)]
    want = [round_bits(Fraction(xs[j]) * Fraction(tv[b][k][0]) + Fraction(ys[i]) * Fraction(tv[b][k][1]) + Fraction(tv[b][k][2]), F32)
            for b in range(2) for i in range(3) for j in range(4) for k in range(2)]
    assert_bits_equal(grid, bits_tensor(want, F32).reshape(grid.shape), "affine_grid")


# ---- other libraries' ops -----------------------------------------------------------------------------------------

_lib = torch.library.Library("carbon_test_foreign", "DEF")
_lib.define("scale(Tensor x) -> Tensor")
_lib.define("count(Tensor x) -> Tensor")
_lib.impl("scale", lambda x: x * 3.0, "CompositeExplicitAutograd")
_lib.impl("count", lambda x: torch.tensor(x.numel()), "CompositeExplicitAutograd")


def test_floating_point_ops_of_other_libraries_are_refused_and_others_pass():
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="carbon_test_foreign"):
        torch.ops.carbon_test_foreign.scale(torch.ones(3))
    with carbon.enabled():
        assert int(torch.ops.carbon_test_foreign.count(torch.ones(3, dtype=torch.int64))) == 3  # no float: passes
    with carbon.enabled(strict=False), pytest.warns(RuntimeWarning, match="carbon_test_foreign"):
        torch.ops.carbon_test_foreign.scale(torch.ones(3))


def test_nms_keeps_what_torchvisions_cpu_kernel_keeps():
    torchvision = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(5)
    xy = torch.rand(400, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + torch.rand(400, 2, generator=g) * 30 + 0.5], 1)
    scores = torch.rand(400, generator=g)
    scores[10:20] = scores[5]  # tied scores: the earlier index first
    for t in (0.3, 0.5, 0.7):
        with carbon.enabled():
            got = torchvision.ops.nms(boxes, scores, t)
        assert torch.equal(got, torchvision.ops.nms(boxes, scores, t)), t


def _roi_axis(start: float, end: float, bins: int, grid: int, size: int, aligned: bool) -> list:
    """Per bin, per sample: (low, high, weight of low, weight of high, outside) by the documented rule
    (grid ≤ 0: adaptive, ⌈length / bins⌉ samples)."""
    length = end - start if aligned else max(end - start, 1.0)
    bin_size = length / bins
    grid = grid if grid > 0 else math.ceil(length / bins)
    out = []
    for p in range(bins):
        row = []
        for i in range(grid):
            c = start + p * bin_size + (i + 0.5) * bin_size / grid
            outside = c < -1.0 or c > size
            c = max(c, 0.0)
            low = math.floor(c)
            if low >= size - 1:
                low = high = size - 1
                c = float(low)
            else:
                high = low + 1
            row.append((low, high, 1.0 - (c - low), c - low, outside))
        out.append(row)
    return out


@pytest.mark.parametrize("ratio", [2, -1])
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_bins_are_exact_means_of_their_documented_samples(aligned, ratio):
    torchvision = pytest.importorskip("torchvision")
    x = _randn(2, 2, 6, 5, seed=80).requires_grad_()
    rois = torch.tensor([[0, 0.5, 1.0, 3.5, 5.0], [1, -2.0, 0.25, 4.0, 7.5], [0, 1.0, 1.0, 6.0, 2.0]])
    scale, (ph, pw) = 0.75, (2, 3)
    with carbon.enabled():
        y = torchvision.ops.roi_align(x, rois, (ph, pw), spatial_scale=scale, sampling_ratio=ratio, aligned=aligned)
    assert torch.allclose(y, torchvision.ops.roi_align(x, rois, (ph, pw), scale, ratio, aligned), atol=1e-6)
    with carbon.enabled():
        g = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(g)
    xv, gv = x.detach().double().tolist(), g.double().tolist()
    off = 0.5 if aligned else 0.0
    want, shares = [], {}
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        ys = _roi_axis(y1 * scale - off, y2 * scale - off, ph, ratio, 6, aligned)
        xs = _roi_axis(x1 * scale - off, x2 * scale - off, pw, ratio, 5, aligned)
        for ch in range(2):
            for p in range(ph):
                for q in range(pw):
                    samples = []
                    for yl, yh, hy, ly, yo in ys[p]:
                        for xl, xh, hx, lx, xo in xs[q]:
                            corners = [(yl, xl, hy * hx), (yl, xh, hy * lx), (yh, xl, ly * hx), (yh, xh, ly * lx)]
                            acc = None
                            for yy, xx, wt in corners:
                                w32 = 0.0 if (yo or xo) else _rn(wt)
                                term = _rn(Fraction(w32) * Fraction(xv[int(b)][ch][yy][xx]))
                                acc = term if acc is None else _rn(Fraction(acc) + Fraction(term))
                                count = len(ys[p]) * len(xs[q])
                                share = _rn(Fraction(_rn(Fraction(gv[k][ch][p][q]) * Fraction(w32))) / count)
                                shares.setdefault((int(b), ch, yy, xx), []).append(share)
                            samples.append(acc)
                    want.append(row_quotient_bits(samples, len(samples), F32))
    assert_bits_equal(y, bits_tensor(want, F32).reshape(y.shape), "roi_align")
    want_g = [row_sum_bits(shares.get((b, ch, yy, xx), [0.0]), F32) for b in range(2) for ch in range(2)
              for yy in range(6) for xx in range(5)]
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(x.shape), "roi_align gradient")


# ---- pdist, cross, soft margin, sinc -------------------------------------------------------------------------------

def test_pdist_and_its_gradient_are_the_cdist_definitions_over_pairs():
    x = _randn(5, 3, seed=90, scale=10.0).requires_grad_()
    with carbon.enabled():
        d = F.pdist(x)
        g = torch.linspace(0.5, 1.5, d.numel())
        d.backward(g)
    xv = x.detach().double().tolist()
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    want = [round_bits(Fraction(sqrt_rn32(_rn(sum(((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(xv[i], xv[j])),
                                                   Fraction(0))))), F32) for i, j in pairs]
    assert_bits_equal(d, bits_tensor(want, F32), "pdist")
    dv, gv = _values(d), _values(g)
    r = [[0.0] * 5 for _ in range(5)]
    for (i, j), dd, gg in zip(pairs, dv, gv):
        r[i][j] = r[j][i] = _rn(Fraction(gg) / Fraction(dd))
    want_g = []
    for i in range(5):
        s = _rn(sum(map(Fraction, r[i]), Fraction(0)))
        for k in range(3):
            first = _rn(Fraction(xv[i][k]) * Fraction(s))
            second = _rn(sum((Fraction(r[i][j]) * Fraction(xv[j][k]) for j in range(5)), Fraction(0)))
            want_g.append(round_bits(Fraction(first) - Fraction(second), F32))
    assert_bits_equal(x.grad, bits_tensor(want_g, F32).reshape(5, 3), "pdist gradient")


def test_cross_soft_margin_and_sinc_follow_their_step_by_step_definitions():
    a, b = _randn(20, 3, seed=91, scale=100.0), _randn(20, 3, seed=92)
    x, y = _randn(30, seed=93, scale=4.0), (_randn(30, seed=94) > 0).float() * 2 - 1
    z = torch.cat([_randn(30, seed=95, scale=3.0), torch.tensor([0.0, -0.0, 1e-20])])
    with carbon.enabled():
        cross = torch.linalg.cross(a, b)
        loss = F.soft_margin_loss(x, y)
        s = torch.sinc(z)
    av, bv = a.double().tolist(), b.double().tolist()
    want = [round_bits(Fraction(_rn(Fraction(av[n][(k + 1) % 3]) * Fraction(bv[n][(k + 2) % 3])))
                       - Fraction(_rn(Fraction(av[n][(k + 2) % 3]) * Fraction(bv[n][(k + 1) % 3]))), F32)
            for n in range(20) for k in range(3)]
    assert_bits_equal(cross, bits_tensor(want, F32).reshape(20, 3), "cross")
    terms = _values(carbon.softplus(-(x * y)))  # x·y of ±1 is exact
    assert_bits_equal(loss.reshape(1), bits_tensor([row_quotient_bits(terms, 30, F32)], F32), "soft margin")
    pi32 = Fraction(_rn(Fraction(math.pi)))
    t = [_rn(pi32 * Fraction(v)) for v in _values(z)]
    sines = _values(carbon.sin(torch.tensor(t, dtype=F32)))
    want_s = [round_bits(1.0, F32) if v == 0 else round_bits(Fraction(sv) / Fraction(tv), F32)
              for v, tv, sv in zip(_values(z), t, sines)]
    assert_bits_equal(s, bits_tensor(want_s, F32), "sinc")


# ---- CTC loss -------------------------------------------------------------------------------------------------------

def _ctc_brute_force(lp: list, target: list, blank: int = 0) -> float:
    """−log Σ over every frame labelling that collapses to `target` of Π p — by enumeration (tiny cases)."""
    import itertools
    t_len, classes = len(lp), len(lp[0])
    total = 0.0
    for path in itertools.product(range(classes), repeat=t_len):
        collapsed = [c for k, c in enumerate(path) if c != blank and (k == 0 or c != path[k - 1])]
        if collapsed == target:
            total += math.exp(sum(lp[k][c] for k, c in enumerate(path)))
    return -math.log(total)


def test_ctc_loss_matches_the_sum_over_alignments_and_is_batch_and_thread_invariant(restore_num_threads):
    g = torch.Generator().manual_seed(7)
    lp = torch.randn(5, 3, 4, generator=g).log_softmax(2)
    targets = torch.tensor([[1, 2, 0], [3, 3, 0], [2, 0, 0]])
    il, tl = torch.tensor([5, 5, 4]), torch.tensor([2, 2, 1])
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x = lp.clone().requires_grad_()
        with carbon.enabled():
            loss = F.ctc_loss(x, targets, il, tl, reduction="none")
            loss.backward(torch.tensor([1.0, 0.5, 2.0]))
        results.append((as_bits(loss), as_bits(x.grad)))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    for n in range(3):
        want = _ctc_brute_force(lp[: il[n], n].double().tolist(), targets[n, : tl[n]].tolist())
        assert abs(loss[n].item() - want) <= 2e-6 * max(1.0, abs(want)), n
    # a sequence alone: the same bits as inside the batch
    x1 = lp[:, 1:2].clone().requires_grad_()
    with carbon.enabled():
        alone = F.ctc_loss(x1, targets[1:2], il[1:2], tl[1:2], reduction="none")
        alone.backward(torch.tensor([0.5]))
    assert torch.equal(as_bits(alone), as_bits(loss[1:2]))
    assert torch.equal(as_bits(x1.grad[:, 0]), results[0][1][:, 1])
    # the gradient is torch's up to rounding
    ref = lp.clone().requires_grad_()
    F.ctc_loss(ref, targets, il, tl, reduction="none").backward(torch.tensor([1.0, 0.5, 2.0]))
    assert torch.allclose(ref.grad, x.grad, atol=1e-6)


def test_ctc_loss_zero_infinity_and_impossible_alignments():
    lp = torch.randn(2, 1, 3, generator=torch.Generator().manual_seed(8)).log_softmax(2).requires_grad_()
    targets, il, tl = torch.tensor([[1, 1]]), torch.tensor([2]), torch.tensor([2])  # needs 3 frames: impossible
    with carbon.enabled():
        inf_loss = F.ctc_loss(lp, targets, il, tl, reduction="sum")
        zero = F.ctc_loss(lp, targets, il, tl, reduction="sum", zero_infinity=True)
        zero.backward()
    assert inf_loss.item() == math.inf and zero.item() == 0.0
    assert torch.equal(lp.grad, torch.zeros_like(lp))


def test_ctc_loss_on_a_gpu_does_not_ask_for_cudnn():
    """On a GPU torch's ctc_loss first asks _use_cudnn_ctc_loss (and, on ROCm builds, _use_miopen_ctc_loss):
    a query with a float tensor argument, which strict mode refused, so every CTC loss on CUDA raised.
    Routed, they answer False (cuDNN's CTC is not routed; torch's _ctc_loss is)."""
    lp = torch.randn(6, 2, 5, generator=torch.Generator().manual_seed(9)).log_softmax(2)
    targets = torch.tensor([1, 2, 3, 3, 4], dtype=torch.int32)  # cuDNN's layout: concatenated int32 on the CPU
    with carbon.enabled():
        for op in (torch.ops.aten._use_cudnn_ctc_loss, torch.ops.aten._use_miopen_ctc_loss):
            assert op(lp, targets, [6, 5], [2, 3], 0) is False
            assert op(lp, targets, torch.tensor([6, 5]), torch.tensor([2, 3]), 0) is False


# ---- index_copy, embedding max_norm, RReLU, vdot ---------------------------------------------------------------------

def test_index_copy_lets_the_last_duplicate_write_win():
    x = _randn(6, 3, seed=100)
    src = _randn(5, 3, seed=101)
    idx = torch.tensor([1, 4, 1, 0, 4])
    with carbon.enabled():
        got = x.index_copy(0, idx, src)
        cols = x.t().contiguous().index_copy(1, torch.tensor([2, 2, 5]), src[:3].t().contiguous())
    want = x.clone()
    for pos, d in enumerate(idx.tolist()):  # in order: the last write stays
        want[d] = src[pos]
    assert torch.equal(as_bits(got), as_bits(want))
    want_cols = x.t().clone()
    want_cols[:, 2], want_cols[:, 5] = src[1], src[2]
    assert torch.equal(as_bits(cols), as_bits(want_cols))


def test_embedding_max_norm_renormalizes_referenced_rows_by_the_documented_steps():
    emb = torch.nn.Embedding(8, 5, max_norm=1.5)
    with torch.no_grad():
        emb.weight.copy_(_randn(8, 5, seed=102, scale=2.0))
    before = emb.weight.detach().clone()
    ids = torch.tensor([1, 3, 3, 6])
    with carbon.enabled():
        emb(ids)
    for r in range(8):
        row = _values(before[r])
        if r not in (1, 3, 6):
            assert torch.equal(as_bits(emb.weight[r].detach()), as_bits(before[r]))
            continue
        norm = sqrt_rn32(round_bits_value(sum((Fraction(v) ** 2 for v in row), Fraction(0))))
        if not norm > 1.5:
            assert torch.equal(as_bits(emb.weight[r].detach()), as_bits(before[r]))
            continue
        scale = round_bits_value(Fraction(1.5 / (norm + 1e-7)))  # binary64 sum and quotient, then float32
        want = [round_bits(Fraction(v) * Fraction(scale), F32) for v in row]
        assert_bits_equal(emb.weight[r].detach(), bits_tensor(want, F32), f"row {r}")


def test_rrelu_draws_its_slopes_from_carbons_uniforms():
    x = _randn(200, seed=103).requires_grad_()
    with carbon.enabled(seed=9):
        y = F.rrelu(x, 0.1, 0.3, training=True)
        y.backward(torch.ones(200))
    with carbon.enabled(seed=9):
        r = torch.empty(200).uniform_(0.1, 0.3)  # the same (first) draw
    xv, rv = _values(x), _values(r)
    want = [round_bits(Fraction(a) * Fraction(b), F32) if a <= 0 else round_bits(a, F32) for a, b in zip(xv, rv)]
    assert_bits_equal(y, bits_tensor(want, F32), "rrelu")
    want_g = [round_bits(b, F32) if a <= 0 else round_bits(1.0, F32) for a, b in zip(xv, rv)]
    assert_bits_equal(x.grad, bits_tensor(want_g, F32), "rrelu gradient")
    with carbon.enabled():
        ev = F.rrelu(x.detach(), 0.1, 0.3, training=False)
    slope = round_bits_value(Fraction((0.1 + 0.3) / 2))
    assert [v for v in _values(ev)] == [v if v > 0 else round_bits_value(Fraction(v) * Fraction(slope)) for v in xv]


def test_vdot_of_real_vectors_is_the_exact_dot_product():
    a, b = _randn(300, seed=104, scale=1e4), _randn(300, seed=105)
    with carbon.enabled():
        got = torch.vdot(a, b)
    want = round_bits(sum((Fraction(x) * Fraction(y) for x, y in zip(_values(a), _values(b))), Fraction(0)), F32)
    assert_bits_equal(got.reshape(1), bits_tensor([want], F32), "vdot")


# ---- scatter_reduce, index_reduce, vector norms, addbmm, adaptive max pooling --------------------------------------

@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_sums_exactly_and_means_round_the_exact_sum_then_divide(reduce, include_self):
    x = _randn(5, 2, seed=110, scale=1e3)
    src = _randn(7, 2, seed=111) + _randn(7, 2, seed=112, scale=1e-6)
    rows = [0, 1, 0, 4, 4, 0, 4]
    idx = torch.tensor(rows).unsqueeze(1).expand(7, 2)
    with carbon.enabled():
        got = x.scatter_reduce(0, idx, src, reduce, include_self=include_self)
        via_index = x.index_reduce(0, torch.tensor(rows), src, "mean", include_self=include_self) if reduce == "mean" else None
    xv, sv = x.double().tolist(), src.double().tolist()
    want = []
    for r in range(5):
        for c in range(2):
            terms = [sv[k][c] for k, d in enumerate(rows) if d == r]
            if not terms:
                want.append(round_bits(xv[r][c], F32))
                continue
            terms = terms + ([xv[r][c]] if include_self else [])
            s = row_sum_bits(terms, F32)
            want.append(s if reduce == "sum" else round_bits(Fraction(bits_to_float(s, F32)) / len(terms), F32))
    assert_bits_equal(got, bits_tensor(want, F32).reshape(5, 2), f"scatter_reduce {reduce}")
    if via_index is not None:
        assert torch.equal(as_bits(via_index), as_bits(got))
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="prod"):
        x.scatter_reduce(0, idx, src, "prod")


def test_vector_norms_of_order_one_zero_and_minus_infinity_and_addbmm_are_exact():
    x = _randn(4, 6, seed=113, scale=1e3)
    x[1, 2] = 0.0
    b1, b2, bias = _randn(3, 2, 5, seed=114), _randn(3, 5, 4, seed=115, scale=1e2), _randn(2, 4, seed=116)
    with carbon.enabled():
        n1 = torch.linalg.vector_norm(x, 1, dim=1)
        n0 = torch.linalg.vector_norm(x, 0)
        nmin = torch.linalg.vector_norm(x, -math.inf)
        acc = torch.addbmm(bias, b1, b2)
    xv = x.double().tolist()
    assert_bits_equal(n1, bits_tensor([row_sum_bits([abs(v) for v in row], F32) for row in xv], F32), "ord 1")
    assert n0.item() == 23.0 and nmin.item() == 0.0
    v1, v2, vb = b1.double().tolist(), b2.double().tolist(), bias.double().tolist()
    want = [round_bits(Fraction(vb[i][j]) + sum((Fraction(v1[b][i][k]) * Fraction(v2[b][k][j])
                                                  for b in range(3) for k in range(5)), Fraction(0)), F32)
            for i in range(2) for j in range(4)]
    assert_bits_equal(acc, bits_tensor(want, F32).reshape(2, 4), "addbmm")


def _pow32(v: Fraction, p: float) -> Fraction:
    """RN32(v^p) for a binary64 exponent p (carbon's pow: correctly rounded outside ~2⁻¹⁹ ulp of a midpoint)."""
    import mpmath
    with mpmath.workprec(200):
        r = mpmath.power(mpmath.mpf(v.numerator) / v.denominator, mpmath.mpf(p))
        sign, man, exp, _ = r._mpf_
        return round_value((-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp))


def round_value(v) -> Fraction:
    return Fraction(bits_to_float(round_bits(v, F32), F32))


def test_p_norms_dist_and_addr_follow_their_definitions():
    """‖x‖₃ = RN(POW(RN(exact Σ RN(|x|·RN(x·x))), 1/3)) (torch.pow's integer route: binary exponentiation), ‖x‖_0.5
    with carbon's pow both ways; torch.dist the same norm of RN(x − y); addr one rounding of M + u_i·v_j."""
    x, y = _randn(5, 7, seed=118, scale=10.0), _randn(5, 7, seed=119, scale=10.0)
    u, v, m = _randn(5, seed=120), _randn(7, seed=121), _randn(5, 7, seed=122)
    with carbon.enabled():
        n3 = torch.linalg.vector_norm(x, 3, dim=1)
        nhalf = torch.linalg.vector_norm(x, 0.5)
        d3 = torch.dist(x, y, 3)
        outer = torch.addr(m, u, v)
        scaled = torch.addr(m, u, v, beta=0.5, alpha=2.0)
    rows = x.double().tolist()
    cube = lambda a: round_value(abs(Fraction(a)) * round_value(Fraction(a) * Fraction(a)))  # noqa: E731
    want3 = [_pow32(round_value(sum((cube(a) for a in row), Fraction(0))), 1 / 3) for row in rows]
    assert_bits_equal(n3, bits_tensor([round_bits(w, F32) for w in want3], F32), "ord 3")
    total = round_value(sum((_pow32(abs(Fraction(a)), 0.5) for row in rows for a in row), Fraction(0)))
    assert_bits_equal(nhalf, bits_tensor(round_bits(_pow32(total, 2.0), F32), F32), "ord 0.5")
    diffs = [round_value(Fraction(a) - Fraction(b)) for ra, rb in zip(rows, y.double().tolist()) for a, b in zip(ra, rb)]
    want_d = _pow32(round_value(sum((round_value(abs(d) * round_value(d * d)) for d in diffs), Fraction(0))), 1 / 3)
    assert_bits_equal(d3, bits_tensor(round_bits(want_d, F32), F32), "dist")
    uv, vv, mv = u.double().tolist(), v.double().tolist(), m.double().tolist()
    want = [[round_bits(Fraction(mv[i][j]) + Fraction(uv[i]) * Fraction(vv[j]), F32) for j in range(7)] for i in range(5)]
    assert_bits_equal(outer, bits_tensor(want, F32), "addr")
    want = [[round_bits(round_value(Fraction(mv[i][j]) / 2) + round_value(2 * round_value(Fraction(uv[i]) * Fraction(vv[j]))),
                        F32) for j in range(7)] for i in range(5)]
    assert_bits_equal(scaled, bits_tensor(want, F32), "addr, beta and alpha")
    assert torch.allclose(n3, torch.linalg.vector_norm(x, 3, dim=1), rtol=1e-6)
    assert torch.allclose(d3, torch.dist(x, y, 3), rtol=1e-6)


@pytest.mark.parametrize("d", [2, 3])
def test_adaptive_max_pooling_gradient_sums_exactly_at_each_maximum(d):
    shape = (1, 2) + (7,) * d
    x = _randn(*shape, seed=117).requires_grad_()
    pool = F.adaptive_max_pool2d if d == 2 else F.adaptive_max_pool3d
    with carbon.enabled():
        y, where = pool(x, 4, return_indices=True)  # 7 → 4: regions overlap, a maximum can serve two outputs
        g = torch.linspace(-1, 2, y.numel()).reshape(y.shape) + 1e-7
        y.backward(g)
    terms = {}
    for plane, (gs, ws) in enumerate(zip(g.reshape(2, -1).double().tolist(), where.reshape(2, -1).tolist())):
        for gv, wv in zip(gs, ws):
            terms.setdefault((plane, wv), []).append(gv)
    size = 7 ** d
    want = [row_sum_bits(terms.get((p, i), [0.0]), F32) for p in range(2) for i in range(size)]
    assert_bits_equal(x.grad, bits_tensor(want, F32).reshape(shape), f"adaptive max pool {d}d gradient")


def test_generation_with_a_static_kv_cache_gives_the_dynamic_caches_bits():
    """Hugging Face's static cache writes with index_copy_ and attends over the whole cache under a mask:
    the same logits, bit for bit, as the growing cache (the masked keys add exact zeros)."""
    T = pytest.importorskip("transformers")
    cfg = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=64)
    with carbon.enabled(seed=0):
        model = T.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    runs = []
    for cache in ("static", None):
        with carbon.enabled(seed=1):
            out = model.generate(ids, max_new_tokens=5, do_sample=True, cache_implementation=cache, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True)
        runs.append((out.sequences, [as_bits(l) for l in out.logits]))
    assert torch.equal(runs[0][0], runs[1][0])
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)


def test_histc_counts_by_the_binary64_bin_rule_and_bincount_sums_weights_exactly():
    x = torch.cat([_randn(500, seed=120), torch.tensor([-1.0, 1.0, 0.2, math.nan, 5.0])])
    with carbon.enabled():
        h = torch.histc(x, 8, -1.0, 1.0)
        auto = torch.histc(x[~torch.isnan(x)], 6)
    want = [0] * 8
    for v in _values(x):
        if v == v and -1.0 <= v <= 1.0:
            want[min(max(math.floor((v - -1.0) * 8 / 2.0), 0), 7)] += 1
    assert h.tolist() == [float(c) for c in want]
    assert auto.sum().item() == 504  # data range: every finite value counted
    idx = torch.tensor([3, 0, 3, 3, 1])
    w = _randn(5, seed=121) * torch.tensor([1e6, 1.0, 1e-6, -1e6, 1.0])
    with carbon.enabled():
        b = torch.bincount(idx, w, minlength=6)
    wv = _values(w)
    want_b = [row_sum_bits([wv[k] for k, i in enumerate(idx.tolist()) if i == r] or [0.0], F32) for r in range(6)]
    assert_bits_equal(b, bits_tensor(want_b, F32), "bincount")


def test_max_unpool_lets_the_last_of_repeated_indices_win():
    x = _randn(1, 2, 5, 6, seed=130)
    pooled, where = F.max_pool2d(x, 3, stride=1, return_indices=True)  # overlapping windows repeat indices
    with carbon.enabled():
        got = F.max_unpool2d(pooled, where, 3, stride=1, output_size=(5, 6))
    want = torch.zeros(2, 30)
    for plane in range(2):
        for value, index in zip(pooled[0, plane].reshape(-1).tolist(), where[0, plane].reshape(-1).tolist()):
            want[plane, index] = value  # in order: the last write stays
    assert torch.equal(as_bits(got.reshape(2, 30)), as_bits(want))


def test_allclose_compares_with_single_rounded_steps():
    y = _randn(300, seed=131, scale=10.0)
    tol = [round_bits_value(Fraction(round_bits_value(Fraction(v) * Fraction(round_bits_value(Fraction(1e-5))))))
           for v in _values(y.abs())]
    bound = [round_bits_value(Fraction(t) + Fraction(round_bits_value(Fraction(1e-8)))) for t in tol]
    x = torch.tensor([v + b for v, b in zip(_values(y), bound)], dtype=F32)  # at (or rounded near) the boundary
    with carbon.enabled():
        got = torch.allclose(x, y)
    close = [abs(round_bits_value(Fraction(a) - Fraction(b))) <= c for a, b, c in zip(_values(x), _values(y), bound)]
    assert got == all(close)
    assert 0 < sum(close) < len(close)  # the boundary cuts both ways: the test can fail
    with carbon.enabled():
        assert torch.allclose(x[torch.tensor(close)], y[torch.tensor(close)])


class _Divisions(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the divisor of every aten.div the routes run (entered beneath carbon's mode, it sees the ops a
    route's handler calls)."""

    def __init__(self):
        super().__init__()
        self.divisors = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_):
            self.divisors.append((str(func), args[0], args[1] if len(args) > 1 else kwargs.get("other")))
        return func(*args, **kwargs)


def _assert_tensor_divisors(divisions: _Divisions) -> None:
    """CUDA turns x / y with a Python or CPU scalar y into x·RN(1/y) (trunc(x·RN(1/y)) for rounding_mode='trunc'),
    which is not the quotient the CPU computes: every divisor must be a tensor on the dividend's device."""
    assert divisions.divisors
    for name, x, y in divisions.divisors:
        assert isinstance(y, torch.Tensor) and y.device == x.device, f"{name} divides by {y!r}"


def test_routes_divide_by_tensors_on_the_dividends_device_not_by_numbers():
    """On the meta device (standing in for CUDA, where a number divisor becomes a reciprocal multiplication):
    div with a rounding mode, histc's bin rule and roi_align's bin sizes divide by device tensors."""
    from carbon._enable_routes import _RoiSamples

    x = torch.empty(10, device="meta")
    with _Divisions() as d, carbon.enabled():
        torch.div(x, 7.0, rounding_mode="trunc")
        torch.div(x, torch.tensor(7.0), rounding_mode="floor")
        x // 7.0  # floor_divide
        torch.histc(x, 8, -1.0, 2.0)
    _assert_tensor_divisors(d)
    with _Divisions() as d:  # a route's own aten calls run below carbon's mode
        _RoiSamples(torch.empty(3, 5, device="meta"), 0.5, (3, 7), (3, 2), False, 16, 16)
    _assert_tensor_divisors(d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_div_with_a_rounding_mode_and_a_number_divisor_is_torchs_cpu_result(dtype):
    x = (_randn(400, seed=140) * 100).to(dtype)
    for mode in ("trunc", "floor"):
        for y in (7.0, -3.0, 0.1, torch.tensor(7.0), 3):
            with carbon.enabled():
                got = torch.div(x, y, rounding_mode=mode)
            want = torch.div(x, y, rounding_mode=mode)
            assert got.dtype == want.dtype
            assert_bits_equal(got, as_bits(want), f"{mode} {y}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_floor_divide_is_division_rounded_down(dtype):
    # CTRL's sinusoidal table computes i // 2 of a float arange; floor_divide was refused before
    x = (_randn(400, seed=141) * 100).to(dtype)
    with carbon.enabled():
        got = [x // 2, torch.floor_divide(x, -3.0), x // torch.tensor(0.1), torch.arange(10.0) // 2]
        inplace = x.clone()
        inplace //= 7
        ints = torch.arange(-7, 7) // 3
    want = [torch.div(x, 2, rounding_mode="floor"), torch.div(x, -3.0, rounding_mode="floor"),
            torch.div(x, torch.tensor(0.1), rounding_mode="floor"), torch.tensor([0.0, 0, 1, 1, 2, 2, 3, 3, 4, 4])]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert_bits_equal(g, as_bits(w))
    assert_bits_equal(inplace, as_bits(torch.div(x, 7, rounding_mode="floor")))
    for v, q in zip(x.tolist(), got[0].tolist()):  # an exact oracle: floor of the exact quotient
        assert q == math.floor(Fraction(v) / 2)
    assert ints.tolist() == [(k // 3) for k in range(-7, 7)] and ints.dtype == torch.int64


def test_xlog1py_entr_angle_and_logaddexp2_are_the_documented_compositions():
    x = _randn(300, seed=160) * 3
    y = _randn(300, seed=161).abs() * 2 - 0.5
    x[:5] = torch.tensor([0.0, 0.0, -0.0, float("nan"), 1.0])
    y[:5] = torch.tensor([0.5, float("nan"), -1.0, 0.5, float("inf")])
    p = torch.cat([_randn(290, seed=162).abs(), torch.tensor([0.0, -0.0, -1.0, float("nan"), float("inf"), 1e-30,
                                                             1.0, 2.0, 0.5, 3e38])])
    with carbon.enabled():
        xl = torch.special.xlog1py(x, y)
        en = torch.special.entr(p)
        an = torch.angle(x)
        la = torch.logaddexp2(x, y)
        z = x.clone().requires_grad_(True)
        w = y.abs().clone().requires_grad_(True)
        (torch.special.entr(w) + torch.logaddexp2(z, w) + torch.special.xlog1py(z, w)).sum().backward()
    log1p_y, log_p = _values(carbon.log1p(y)), _values(carbon.log(p.abs()))
    inv_ln2 = Fraction(torch.tensor(1.0 / math.log(2.0), dtype=torch.float32).item())
    tail = _values(carbon.log1p(carbon.exp2(-(x - y).abs())))  # RN(x − y) is torch's subtraction
    pi32 = torch.tensor(math.pi, dtype=torch.float32).item()
    for i, (a, b) in enumerate(zip(x.tolist(), y.tolist())):
        want = math.nan if math.isnan(b) else 0.0 if a == 0 else (
            math.nan if math.isnan(a) or math.isnan(log1p_y[i]) else round_bits_value(Fraction(a) * Fraction(log1p_y[i]))
            if math.isfinite(log1p_y[i]) else a * log1p_y[i])
        assert xl[i].item() == want or (math.isnan(want) and math.isnan(xl[i].item())), (i, a, b)
        want_angle = a if math.isnan(a) else (pi32 if a < 0 else 0.0)
        assert an[i].item() == want_angle or math.isnan(a)
        if math.isfinite(a) and math.isfinite(b):
            step = round_bits_value(Fraction(tail[i]) * inv_ln2)
            assert la[i].item() == round_bits_value(Fraction(max(a, b)) + Fraction(step)), (i, a, b)
    for i, v in enumerate(p.tolist()):
        want = v if math.isnan(v) else 0.0 if v == 0 else -math.inf if v < 0 else (
            round_bits_value(-Fraction(v) * Fraction(log_p[i])) if math.isfinite(v) else -math.inf)
        assert en[i].item() == want or (math.isnan(v) and math.isnan(en[i].item())), (i, v)
    assert z.grad is not None and w.grad is not None


def test_scatter_with_a_reduction_is_refused_and_plain_scatter_runs():
    """docs/enable.md allows scatter "without reduction": scatter(..., reduce='add' / 'multiply') adds or
    multiplies one element at a time, in index order on the CPU and in the order of atomics on CUDA."""
    x, src = _randn(4, 3, seed=150), _randn(5, 3, seed=151)
    idx = torch.tensor([[0, 1, 2], [0, 0, 0], [3, 1, 0], [0, 2, 2], [1, 1, 1]])
    with carbon.enabled():
        for reduce in ("add", "multiply"):
            with pytest.raises(carbon.NotExactError, match="scatter"):
                torch.scatter(x, 0, idx, src, reduce=reduce)
            with pytest.raises(carbon.NotExactError, match="scatter"):
                x.clone().scatter_(0, idx, 2.0, reduce=reduce)
        assert torch.equal(torch.scatter(x, 0, idx[:1], src), x.scatter(0, idx[:1], src))
        assert torch.equal(torch.scatter_add(x, 0, idx, src), carbon.scatter_add(x, 0, idx, src))


# ---- copies and exact elementwise ops on the allow-list ---------------------------------------------------------

_EXACT_AS_TORCH = {
    "rot90": lambda x: torch.rot90(x, 1, [0, 1]),
    "block_diag": lambda x: torch.block_diag(x, x[:2]),
    "diag_embed": lambda x: torch.diag_embed(x),
    "heaviside": lambda x: torch.heaviside(x, torch.tensor(0.5)),
    "nextafter": lambda x: torch.nextafter(x, torch.zeros_like(x)),
    "hardshrink": lambda x: F.hardshrink(x, 0.3),
    "isin": lambda x: torch.isin(x, x[0]),
    "hash_tensor": lambda x: torch.hash_tensor(x).view(torch.int64),
    "nearest-exact": lambda x: F.interpolate(x[None, None], scale_factor=1.7, mode="nearest-exact"),
}


@pytest.mark.parametrize("name", sorted(_EXACT_AS_TORCH))
def test_exact_ops_run_strict_with_torchs_own_bits(name):
    """Copies, selections and bit-level operations: strict mode lets them run as torch's own kernels, whose
    results are the same on every device (one rounding of the same operands at most)."""
    x = _randn(5, 6, seed=120)
    x[0, 0], x[1, 1] = 0.0, -0.0
    want = _EXACT_AS_TORCH[name](x)
    with carbon.enabled():
        got = _EXACT_AS_TORCH[name](x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g.view(torch.int32) if g.dtype == F32 else g, w.view(torch.int32) if w.dtype == F32 else w)


def test_shape_only_index_tensors_are_built_once_per_shape(monkeypatch):
    """Pooling windows, interpolation weights and fold positions depend only on shapes: built on the host at
    the first call, then reused from the device (no host-to-device copy, so the route can be captured in a
    CUDA graph after a warm-up call). The second call with the same shapes builds nothing and gives the same
    bits; another shape builds anew."""
    from carbon import _enable_routes as routes
    monkeypatch.setattr(routes, "_SHAPE_CONSTANTS", type(routes._SHAPE_CONSTANTS)())
    x = _randn(2, 3, 7, 7, seed=130).requires_grad_()
    cols = _randn(2, 3 * 4, 64, seed=131)

    def step(t):
        y = F.avg_pool2d(t, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        z = F.interpolate(t, size=(11, 5), mode="bilinear", align_corners=False)
        (y.sum() + z.sum()).backward()
        return [y.detach(), z.detach(), F.fold(cols, (7, 7), 2, padding=1, stride=1), t.grad.clone()]
    with carbon.enabled():
        first = step(x)
        built = dict(routes._SHAPE_CONSTANTS)
        x.grad = None
        second = step(x)
    assert built and routes._SHAPE_CONSTANTS.keys() == built.keys()
    assert all(routes._SHAPE_CONSTANTS[k] is v for k, v in built.items())
    for a, b in zip(first, second):
        assert torch.equal(as_bits(a), as_bits(b))
    other = _randn(1, 1, 9, 9, seed=132)
    with carbon.enabled():
        F.avg_pool2d(other, 3, ceil_mode=True)
    assert len(routes._SHAPE_CONSTANTS) > len(built)


def test_softshrink_band_is_plus_zero_wherever_an_element_sits():
    """torch's CPU softshrink gives +0 in its vector body and −0 in its scalar tail for a negative x inside the
    band; the route gives +0 everywhere, x ∓ RN(λ) outside (one rounding), NaN kept; its gradient selects."""
    x = torch.full((70,), -0.1)
    x[:4] = torch.tensor([0.7, -0.9, math.nan, 0.3])
    leaf = x.clone().requires_grad_()
    with carbon.enabled():
        y = F.softshrink(leaf, 0.5)
        y.backward(torch.ones(70))
        short = F.softshrink(x[4:7], 0.5)
    lam = bits_to_float(round_bits(0.5, F32), F32)
    assert as_bits(y.detach())[4:].tolist() == [0] * 66 and as_bits(short).tolist() == [0] * 3
    assert y[0].item() == bits_to_float(round_bits(Fraction(x[0].item()) - Fraction(lam), F32), F32)
    assert y[1].item() == bits_to_float(round_bits(Fraction(x[1].item()) + Fraction(lam), F32), F32)
    assert math.isnan(y[2].item()) and y[3].item() == 0.0
    assert leaf.grad[:4].tolist()[:2] == [1.0, 1.0] and leaf.grad[4:].tolist() == [0.0] * 66


def test_frexp_pins_down_infinities_and_nan():
    """frexp's mantissa and exponent are x's own bits; ±∞ and NaN give themselves and exponent 0 (the CPU's
    convention; CUDA leaves it open), also into out= tensors."""
    x = torch.tensor([3.0, -0.0, 1e-40, math.inf, -math.inf, math.nan, -6.5])
    with carbon.enabled():
        m, e = torch.frexp(x)
        mo, eo = torch.empty(0), torch.empty(0, dtype=torch.int32)
        torch.frexp(x, out=(mo, eo))
    want = [math.frexp(v) if math.isfinite(v) else (v, 0) for v in x.tolist()]
    for (wm, we), gm, ge in zip(want, m.tolist(), e.tolist()):
        assert (gm == wm or (math.isnan(gm) and math.isnan(wm))) and ge == we
    assert torch.equal(as_bits(mo), as_bits(m)) and torch.equal(eo, e)
