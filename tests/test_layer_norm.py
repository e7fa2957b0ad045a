"""carbon.layer_norm: per row, mean = RN32(sum x / n), var = RN32(sum (x - mean)^2
/ n) (exact), rstd = RN32(1 / RN32(sqrt(RN32(var + RN32(eps))))), y =
RN((RN32((x - mean) * rstd) * w) + b) in float64 steps (docs/contract.md §7).
Every output (y, mean, rstd, dx, dweight, dbias) is compared bit for bit with
the independent reference tests/norm_reference.py."""

import math
import zlib

import pytest
import torch

import carbon
from torch._subclasses.fake_tensor import FakeTensorMode
from data import BF16, DTYPES, F16, F32, exact_tensor, generator, random_values
from norm_reference import layer_norm_backward_ref, rms_norm_backward_ref
from norm_util import (
    AFFINE, NS, assert_same_bits, check_layer_norm, check_layer_norm_grads, norm_data, params, rows_for, tie_square,
)
from oracle import assert_bits_equal

INF, NAN = math.inf, math.nan


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------- random data

@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_rows(dtype, n, affine):
    s = seed_of("ln", dtype, n, affine)
    x = norm_data(rows_for(n), n, dtype, s)
    w, b = params((n,), dtype, affine, s)
    check_layer_norm(x, (n,), w, b, context=f"{dtype} n={n} {affine}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_dim_normalized_shape_and_public_function(dtype):
    s = seed_of("ln-nd", dtype)
    x = norm_data(6, 12, dtype, s).reshape(2, 3, 3, 4)
    w, b = params((3, 4), dtype, "both", s)
    y, mean, rstd = check_layer_norm(x, (3, 4), w, b, eps=1e-3, context="2-D normalized_shape")
    assert mean.shape == (2, 3) and rstd.shape == (2, 3) and y.shape == x.shape
    assert_same_bits(carbon.layer_norm(x, (3, 4), w, b, eps=1e-3), y, "carbon.layer_norm")
    assert_same_bits(carbon.layer_norm(x, torch.Size([3, 4]), w, b, 1e-3), y, "torch.Size")
    x1 = x.reshape(-1)[:4].contiguous()
    check_layer_norm(x1, (4,), context="1-D x: 0-dim statistics")


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-5, 0.1, 3.0])
def test_eps_values(eps):
    x = norm_data(4, 64, F32, seed_of("eps", eps))
    check_layer_norm(x, (64,), eps=eps, context=f"eps={eps}")


# ---------------------------------------------------------------- cases that defeat float64

def test_huge_cancellation():
    # Values 1e30 * (+-1, +-3) that cancel, plus small ones: the mean is tiny,
    # the centring cancels catastrophically in any float64 formula.
    rows = []
    for k, small in enumerate([1.0, 1e-3, 3.25, 1e-20]):
        big = [1e30, -1e30, 3e30, -3e30] * 4
        row = big + [small * (j + 1) * (-1) ** j for j in range(8)] + [small * k]
        rows.append(row[:25])
    x = torch.tensor(rows, dtype=torch.float64).to(F32)
    check_layer_norm(x, (25,), context="1e30 cancellation")
    w = exact_tensor([0.5] * 25, F32)
    check_layer_norm(x, (25,), w, -w, context="1e30 cancellation, affine")


def test_variance_ties_run_the_exact_tier():
    # x = c +- a with a = 1 + 2^-12: the exact mean is c and var = a^2 (n = 2,
    # or a^2 / 2^k padded with copies of c) lies exactly halfway between two
    # float32 values. A tie is never decided by the float64 tier (the rounding
    # test needs both ends of an interval around it to round alike), so every
    # such row is computed by the exact accumulator; ties to even decide it.
    a = tie_square()
    rows = []
    for c in (0.0, 3.0, -1000.0, 2.0**20):
        rows.append([c - a, c + a] + [c] * 62)
        rows.append([c + a] + [c] * 30 + [c - a] + [c] * 32)
    x = torch.tensor(rows, dtype=torch.float64).to(F32)
    check_layer_norm(x, (64,), eps=0.0, context="variance ties (n = 64)")
    x2 = torch.tensor([[3.0 - a, 3.0 + a], [-a, a]], dtype=torch.float64).to(F32)
    _, _, rstd = check_layer_norm(x2, (2,), eps=0.0, context="variance ties (n = 2)")
    # var = RN32(1 + 2^-11 + 2^-24) = 1 + 2^-11 (even): rstd is the same for both rows
    assert rstd[0].item() == rstd[1].item()


def test_near_ties_and_mean_ties():
    # Just off a variance tie by 2^-60 relative: far inside the float64 tier's
    # error bound, so again only the exact tier can decide.
    a, t = tie_square(), 2.0**-30
    rows = [[3.0 - a, 3.0 + a, 3.0 - t, 3.0 + t], [3.0 + a, 3.0 + t, 3.0 - a, 3.0 - t]]
    # mean ties: (2 + 2^-23) / 2 = 1 + 2^-24, halfway between 1 and 1 + 2^-23
    rows.append([2.0, 2.0**-23, 2.0, 2.0**-23])
    rows.append([-2.0, -(2.0**-23), 2.0**-22, -2.0])
    x = torch.tensor(rows, dtype=torch.float64).to(F32)
    for eps in (0.0, 1e-5):
        check_layer_norm(x, (4,), eps=eps, context=f"near ties eps={eps}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_exponent_gaps_beyond_float64(dtype):
    # Elements 2^e apart with e > 29: x - mean is not exact in float64 and the
    # squares span more than 53 bits.
    g = generator(seed_of("gaps", dtype))
    hi = {F32: 60, BF16: 60, F16: 7}[dtype]
    lo = {F32: -60, BF16: -60, F16: -14}[dtype]
    rows = []
    for r in range(6):
        e = torch.randint(lo, hi, (48,), generator=g).double()
        m = torch.randn(48, generator=g, dtype=torch.float64)
        rows.append((m * torch.pow(2.0, e)).tolist())
    x = torch.tensor(rows, dtype=torch.float64).to(dtype)
    w, b = params((48,), dtype, "both", 3)
    check_layer_norm(x, (48,), w, b, context="exponent gaps")


# ---------------------------------------------------------------- special values

@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype):
    tiny = {F32: 2.0**-149, BF16: 2.0**-133, F16: 2.0**-24}[dtype]
    rows = [
        [1.0, NAN, 2.0, 3.0],
        [1.0, INF, 2.0, 3.0],
        [-INF, 1.0, 2.0, 3.0],
        [INF, -INF, 2.0, 3.0],
        [tiny, 2 * tiny, -tiny, 5 * tiny],  # subnormals
        [tiny, 0.0, 0.0, 0.0],
        [0.0, -0.0, 0.0, -0.0],
        [-0.0, -0.0, -0.0, -0.0],
        [5.0, 5.0, 5.0, 5.0],  # constant: var = +0
        [-3.5, -3.5, -3.5, -3.5],
    ]
    x = torch.tensor(rows, dtype=torch.float64).to(dtype)  # all representable (NaN: any sign)
    w = exact_tensor([1.5, -2.0, 0.0, 1.0], dtype)
    b = exact_tensor([0.25, -0.0, 1.0, -1.0], dtype)
    for eps in (0.0, 1e-5):
        y, mean, rstd = check_layer_norm(x, (4,), eps=eps, context=f"specials eps={eps}")
        check_layer_norm(x, (4,), w, b, eps=eps, context=f"specials affine eps={eps}")
        for r in range(4):  # a row with an inf or a NaN: NaN everywhere
            assert torch.isnan(y[r].float()).all() and math.isnan(rstd[r].item())
    y, _, rstd = torch.ops.carbon.layer_norm(x, [4], None, None, 0.0)
    assert rstd[8].item() == INF and torch.isnan(y[8].float()).all()  # constant row, eps = 0: 0 * inf


def test_variance_overflow():
    # |x - mean| = 2^127: var overflows float32 -> rstd = 0, xhat = 0, y = bias.
    x = exact_tensor([[2.0**127, -(2.0**127), 2.0**127, -(2.0**127)]], F32)
    b = exact_tensor([1.0, 2.0, 3.0, 4.0], F32)
    y, _, rstd = check_layer_norm(x, (4,), None, b, context="var overflow")
    assert rstd.item() == 0.0 and y.tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_empty():
    for shape, ns in (((0, 5), (5,)), ((3, 0), (0,)), ((2, 0, 4), (4,))):
        x = torch.zeros(shape)
        y, mean, rstd = torch.ops.carbon.layer_norm(x, list(ns), None, None, 1e-5)
        ref = torch.native_layer_norm(x, list(ns), None, None, 1e-5)
        assert y.shape == ref[0].shape and y.dtype == x.dtype
        assert mean.shape == x.shape[: x.dim() - len(ns)] and rstd.shape == mean.shape
        if mean.numel():
            assert torch.isnan(mean).all() and torch.isnan(rstd).all()  # n = 0: 0 / 0
        xr = x.clone().requires_grad_()
        carbon.layer_norm(xr, ns).sum().backward()
        assert xr.grad.shape == x.shape
        # contract §7 "Special values and empty inputs": with R = 0 rows, dweight and dbias are +0
        # (empty sums), never -0: compared as bits
        rows = math.prod(x.shape[: x.dim() - len(ns)])
        for dtype in DTYPES:
            xr = torch.zeros(shape, dtype=dtype, requires_grad=True)
            w = torch.ones(ns, dtype=dtype, requires_grad=True)
            b = torch.zeros(ns, dtype=dtype, requires_grad=True)
            carbon.layer_norm(xr, ns, w, b).sum().backward()
            assert xr.grad.shape == x.shape
            for name, g in (("dweight", w.grad), ("dbias", b.grad)):
                assert g.shape == ns and g.dtype == dtype, (name, dtype)
                if rows == 0:
                    bits = g.view(torch.int32 if dtype == F32 else torch.int16)
                    assert g.numel() and (bits == 0).all(), (name, dtype, g)


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariance_and_layouts(dtype):
    s = seed_of("inv", dtype)
    x = norm_data(9, 96, dtype, s)
    w, b = params((96,), dtype, "both", s)
    y, mean, rstd = torch.ops.carbon.layer_norm(x, [96], w, b, 1e-5)
    for i in (0, 4, 8):
        yi, mi, ri = torch.ops.carbon.layer_norm(x[i:i + 1], [96], w, b, 1e-5)
        assert_same_bits(yi, y[i:i + 1], f"row {i} alone")
        assert_same_bits(mi, mean[i:i + 1], f"mean of row {i}")
    # non-contiguous views of the same values
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    assert_same_bits(torch.ops.carbon.layer_norm(xt, [96], w, b, 1e-5)[0], y, "transposed storage")
    big = torch.zeros((9, 200), dtype=dtype)
    big[:, 50:146] = x
    assert_same_bits(carbon.layer_norm(big[:, 50:146], (96,), w, b), y, "sliced")
    wide = torch.zeros(192, dtype=dtype)
    wide[::2] = w
    assert_same_bits(carbon.layer_norm(x, (96,), wide[::2], b), y, "strided weight")
    check_layer_norm(x[::2], (96,), w, b, context="every other row")


def test_thread_count(restore_num_threads):
    x = norm_data(64, 1000, F32, 5)
    w, b = params((1000,), F32, "both", 5)
    dy = random_values((64, 1000), F32, generator(9))
    out = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        y = carbon.layer_norm(xr, (1000,), wr, br)
        y.backward(dy)
        out.append((y, xr.grad, wr.grad, br.grad))
    for a, c in zip(*out):
        assert_same_bits(a, c, "1 vs 2 threads")


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("n", (1, 7, 64, 768))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients(dtype, n, affine):
    s = seed_of("ln-grad", dtype, n, affine)
    x = norm_data(3, n, dtype, s)
    w, b = params((n,), dtype, affine, s)
    check_layer_norm_grads(x, (n,), w, b, seed=s, context=f"{dtype} n={n} {affine}")


def test_gradients_special_and_3d():
    x = exact_tensor([[1.0, 2.0, 4.0, 8.0], [5.0, 5.0, 5.0, 5.0], [1.0, INF, 0.0, 1.0]], F32)
    w = exact_tensor([1.0, -1.0, 0.5, 2.0], F32)
    dy = exact_tensor([[1.0, 0.0, -1.0, 2.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], F32)
    check_layer_norm_grads(x, (4,), w, -w, dy=dy, context="specials")
    x3 = norm_data(6, 8, BF16, 4).reshape(2, 3, 8)
    w3, b3 = params((8,), BF16, "both", 4)
    check_layer_norm_grads(x3, (8,), w3, b3, seed=2, context="3-D x")
    x4 = norm_data(4, 6, F16, 5).reshape(4, 2, 3)
    w4, b4 = params((2, 3), F16, "both", 5)
    check_layer_norm_grads(x4, (2, 3), w4, b4, seed=3, context="2-D normalized_shape")


# ---------------------------------------------------------------- torch integration

def test_opcheck():
    x = norm_data(3, 8, F32, 1).reshape(3, 2, 4)
    w, b = params((2, 4), F32, "both", 1)
    torch.library.opcheck(torch.ops.carbon.layer_norm.default, (x, [2, 4], w, b, 1e-5))
    torch.library.opcheck(torch.ops.carbon.layer_norm.default, (x.bfloat16(), [4], None, None, 0.1))
    _, mean, rstd = torch.ops.carbon.layer_norm(x, [2, 4], w, b, 1e-5)
    dy = norm_data(3, 8, F32, 2).reshape(3, 2, 4)
    for mask in ([True, True, True], [True, False, True], [False, True, False], [False, False, False]):
        torch.library.opcheck(torch.ops.carbon.norm_backward.default, (dy, x, [2, 4], mean, rstd, w, mask))
    _, rstd_rms = torch.ops.carbon.rms_norm(x, [2, 4], w, None)
    torch.library.opcheck(torch.ops.carbon.norm_backward.default, (dy, x, [2, 4], None, rstd_rms, None, [True, True, False]))


def test_torch_compile_fullgraph():
    x = norm_data(4, 32, F32, 2)
    w, b = params((32,), F32, "both", 2)

    def f(x, w, b):
        return carbon.rms_norm(carbon.layer_norm(x, (32,), w, b) * 2.0, (32,), w)

    compiled = torch.compile(f, fullgraph=True)
    assert_same_bits(compiled(x, w, b), f(x, w, b), "compiled forward")
    grads = []
    for fn in (f, compiled):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        fn(*leaves).sum().backward()
        grads.append([t.grad for t in leaves])
    for g, e in zip(*grads):
        assert_same_bits(g, e, "compiled backward")


def test_errors():
    x = torch.randn(2, 4)
    w = torch.ones(4)
    cases = [
        (TypeError, lambda: carbon.layer_norm(x.double(), (4,))),
        (TypeError, lambda: carbon.layer_norm(x.int(), (4,))),
        (ValueError, lambda: carbon.layer_norm(x, (3,))),
        (ValueError, lambda: carbon.layer_norm(x, (2, 2))),
        (ValueError, lambda: carbon.layer_norm(x, (1, 2, 4))),
        (ValueError, lambda: carbon.layer_norm(x, ())),
        (ValueError, lambda: carbon.layer_norm(x, (4,), torch.ones(3))),
        (ValueError, lambda: carbon.layer_norm(x, (4,), None, torch.ones(2, 2))),
        (TypeError, lambda: carbon.layer_norm(x, (4,), w.bfloat16())),
        (TypeError, lambda: carbon.layer_norm(x, (4,), w, w.half())),
        (ValueError, lambda: carbon.layer_norm(x, (4,), eps=-1e-5)),
        (ValueError, lambda: carbon.layer_norm(x, (4,), eps=math.nan)),
    ]
    for fake in (False, True):  # the kernels' checks and the fakes' agree
        for exc, fn in cases:
            with pytest.raises(exc, match=r"^carbon\.layer_norm: "):
                if fake:
                    with FakeTensorMode(allow_non_fake_inputs=True):
                        fn()
                else:
                    fn()


def test_fused_backward_outputs():
    # carbon.norm_backward: the outputs asked for, each against the reference;
    # one not asked for is empty.
    x = norm_data(70, 12, F32, 3)
    w, b = params((12,), F32, "both", 3)
    dy = random_values((70, 12), F32, generator(4), spread=2)
    _, mean, rstd = torch.ops.carbon.layer_norm(x, [12], w, b, 1e-5)
    edx, edw, edb = layer_norm_backward_ref(dy, x, (12,), w, True)
    for mask in ([True, True, True], [True, True, False], [True, False, True], [False, True, True], [True, False, False]):
        dx, dw, db = torch.ops.carbon.norm_backward(dy, x, [12], mean, rstd, w, mask)
        for got, want, on, name in ((dx, edx, mask[0], "dx"), (dw, edw, mask[1], "dweight"), (db, edb, mask[2], "dbias")):
            if on:
                assert_bits_equal(got, want, f"{mask} {name}", dtype=F32)
            else:
                assert got.numel() == 0, f"{mask} {name} not asked for"
    _, rstd_rms = torch.ops.carbon.rms_norm(x, [12], w, None)
    edx, edw = rms_norm_backward_ref(dy, x, (12,), w)
    dx, dw, db = torch.ops.carbon.norm_backward(dy, x, [12], None, rstd_rms, w, [True, True, False])
    assert_bits_equal(dx, edx, "rms dx", dtype=F32)
    assert_bits_equal(dw, edw, "rms dweight", dtype=F32)
    empty = torch.ops.carbon.norm_backward(dy[:0], x[:0], [12], mean[:0], rstd[:0], w, [True, True, True])
    assert empty[0].shape == (0, 12) and torch.equal(empty[1], torch.zeros(12)) and torch.equal(empty[2], torch.zeros(12))
    assert not torch.signbit(empty[1]).any() and not torch.signbit(empty[2]).any()


@pytest.mark.parametrize("dtype", (F32, BF16))
def test_fused_gradients_row_blocks_and_threads(dtype, restore_num_threads):
    # The CPU's fused backward sums dweight / dbias per block of 64 rows; the
    # blocks are split over threads. 197 rows = three whole blocks and a
    # partial one; every thread count must give the exact values.
    s = seed_of("fused blocks", dtype)
    x = norm_data(197, 40, dtype, s)
    w, b = params((40,), dtype, "both", s)
    dy = random_values((197, 40), dtype, generator(s + 1), spread=6)
    dy[:, 5] = 0.0
    dy[::2, 7], dy[1::2, 7] = 1.0, -1.0  # a column whose dy cancels: exact tier
    edx, edw, edb = layer_norm_backward_ref(dy, x, (40,), w, True)
    rdx, rdw = rms_norm_backward_ref(dy, x, (40,), w)
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        _, mean, rstd = torch.ops.carbon.layer_norm(x, [40], w, b, 1e-5)
        dx, dw, db = torch.ops.carbon.norm_backward(dy, x, [40], mean, rstd, w, [True, True, True])
        assert_bits_equal(dx, edx, f"{threads} threads dx", dtype=dtype)
        assert_bits_equal(dw, edw, f"{threads} threads dweight", dtype=dtype)
        assert_bits_equal(db, edb, f"{threads} threads dbias", dtype=dtype)
        _, rstd = torch.ops.carbon.rms_norm(x, [40], w, None)
        dx, dw, _ = torch.ops.carbon.norm_backward(dy, x, [40], None, rstd, w, [True, True, False])
        assert_bits_equal(dx, rdx, f"{threads} threads rms dx", dtype=dtype)
        assert_bits_equal(dw, rdw, f"{threads} threads rms dweight", dtype=dtype)


def test_fused_backward_errors():
    x = torch.randn(2, 4)
    _, mean, rstd = torch.ops.carbon.layer_norm(x, [4], None, None, 1e-5)
    op = torch.ops.carbon.norm_backward
    cases = [
        (TypeError, lambda: op(torch.ones(2, 4, dtype=BF16), x, [4], mean, rstd, None, [True, True, True])),
        (ValueError, lambda: op(torch.ones(2, 5), x, [4], mean, rstd, None, [True, True, True])),
        (ValueError, lambda: op(torch.ones(2, 4), x, [4], mean[:1], rstd, None, [True, True, True])),
        (TypeError, lambda: op(torch.ones(2, 4), x, [4], mean, rstd.double(), None, [True, True, True])),
        (ValueError, lambda: op(torch.ones(2, 4), x, [4], mean, rstd, torch.ones(3), [True, True, True])),
    ]
    for fake in (False, True):  # the kernel's checks and the fake's agree
        for exc, fn in cases:
            with pytest.raises(exc, match=r"^carbon\.norm_backward: "):
                if fake:
                    with FakeTensorMode(allow_non_fake_inputs=True):
                        fn()
                else:
                    fn()


def test_backward_errors():
    x = torch.randn(2, 4)
    _, mean, rstd = torch.ops.carbon.layer_norm(x, [4], None, None, 1e-5)
    op = torch.ops.carbon.norm_backward
    with pytest.raises(TypeError, match=r"^carbon\.norm_backward: "):
        op(torch.ones(2, 4, dtype=BF16), x, [4], mean, rstd, None)
    with pytest.raises(ValueError, match=r"^carbon\.norm_backward: "):
        op(torch.ones(2, 5), x, [4], mean, rstd, None)
    with pytest.raises(ValueError, match=r"^carbon\.norm_backward: "):
        op(torch.ones(2, 4), x, [4], mean[:1], rstd, None)
    with pytest.raises(TypeError, match=r"^carbon\.norm_backward: "):
        op(torch.ones(2, 4), x, [4], mean.double(), rstd, None)
    with pytest.raises(ValueError, match=r"^carbon\.norm_backward: "):
        op(torch.ones(2, 4), x, [4], None, rstd[:1], None)


# ---------------------------------------------------------------- module

def test_module():
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm((8, 16), eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    mod = carbon.nn.LayerNorm((8, 16), eps=1e-6)
    assert set(mod.state_dict()) == set(ref.state_dict())
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(3, 8, 16)
    torch.testing.assert_close(mod(x), ref(x), rtol=2e-6, atol=2e-6)
    twin = carbon.nn.LayerNorm.from_torch(ref)
    assert twin.weight is ref.weight and twin.bias is ref.bias
    assert_same_bits(twin(x), mod(x), "from_torch")
    y = twin(x)
    y.sum().backward()
    assert ref.weight.grad is not None and ref.bias.grad is not None
    plain = carbon.nn.LayerNorm(16, elementwise_affine=False)
    assert plain.weight is None and list(plain.state_dict()) == list(torch.nn.LayerNorm(16, elementwise_affine=False).state_dict())
    check_layer_norm(x.reshape(-1, 16), (16,), context="module input")
    assert_same_bits(plain(x), torch.ops.carbon.layer_norm(x, [16], None, None, 1e-5)[0], "no affine")
    nobias = carbon.nn.LayerNorm(16, bias=False)
    assert nobias.bias is None and set(nobias.state_dict()) == {"weight"}
    with pytest.raises(TypeError):
        carbon.nn.LayerNorm.from_torch(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- build

NORM_OPS = ["layer_norm", "rms_norm", "norm_backward", "var_mean_rows"]


@pytest.mark.parametrize("op", NORM_OPS)
def test_kernels_registered(op):
    import os
    import shutil

    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", "CPU")
    nvcc = shutil.which("nvcc") or os.path.exists(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    if torch.version.cuda is not None and nvcc and os.environ.get("CARBON_BUILD_CUDA") != "0":
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", "CUDA")


def test_exports():
    assert carbon.layer_norm is carbon.norm.layer_norm and carbon.rms_norm is carbon.norm.rms_norm
    assert "layer_norm" in carbon.__all__ and "rms_norm" in carbon.__all__
    assert issubclass(carbon.nn.LayerNorm, torch.nn.LayerNorm) and issubclass(carbon.nn.RMSNorm, torch.nn.RMSNorm)


@pytest.mark.parametrize("dtype", (F32, BF16))
def test_gradients_many_rows(dtype):
    # dweight / dbias sum over 1100 rows: several row chunks of the CPU column kernel.
    s = seed_of("many rows", dtype)
    x = norm_data(1100, 6, dtype, s)
    w, b = params((6,), dtype, "both", s)
    check_layer_norm_grads(x, (6,), w, b, seed=s, context=f"{dtype} 1100 rows")
    dy = torch.ones_like(x)
    dy[::3] = -1.0  # cancelling columns of dy: exact zeros and near-zero dbias
    check_layer_norm_grads(x, (6,), w, b, dy=dy, context="cancelling dy")
