"""carbon.rms_norm: per row, ms = RN32(sum x^2 / n) (exact), rstd = RN32(1 /
RN32(sqrt(RN32(ms + RN32(eps))))), y = RN(RN32(x * rstd) * w) in float64 steps
(docs/contract.md §7); eps None is torch's default, float32's epsilon 2^-23.
Every output (y, rstd, dx, dweight) is compared bit for bit with the
independent reference tests/norm_reference.py."""

import math
import zlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import carbon
from data import BF16, DTYPES, F16, F32, exact_tensor, generator, random_values
from norm_util import (
    NS, assert_same_bits, check_rms_norm, check_rms_norm_grads, norm_data, params, rows_for, tie_square,
)

INF, NAN = math.inf, math.nan


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


@pytest.mark.parametrize("affine", ("none", "weight"))
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_rows(dtype, n, affine):
    s = seed_of("rms", dtype, n, affine)
    x = norm_data(rows_for(n), n, dtype, s, offset=False)
    w, _ = params((n,), dtype, affine, s)
    check_rms_norm(x, (n,), w, context=f"{dtype} n={n} {affine}")


@pytest.mark.parametrize("eps", [None, 0.0, 1e-6, 0.5])
def test_eps_and_default(eps):
    x = norm_data(3, 48, BF16, seed_of("rms eps", eps)).reshape(3, 6, 8)
    w, _ = params((6, 8), BF16, "weight", 1)
    y, _ = check_rms_norm(x, (6, 8), w, eps=eps, context=f"eps={eps}")
    assert_same_bits(carbon.rms_norm(x, (6, 8), w, eps), y, "public function")
    if eps is None:  # torch's default eps is float32's epsilon for every dtype
        assert_same_bits(carbon.rms_norm(x, [6, 8], w, torch.finfo(torch.float32).eps), y, "explicit default")


def test_mean_square_ties_run_the_exact_tier():
    # a^2 with a = 1 + 2^-12 is halfway between two float32 values; so are
    # a^2 / 2 and 2 a^2 / 4. Ties never pass the float64 tier's test, so these
    # rows are decided by the exact accumulator (ties to even).
    a = tie_square()
    rows = [[a, 0.0, 0.0, 0.0], [a, -a, 0.0, 0.0], [0.0, 0.0, 0.0, -a], [a, a, a, a]]
    x = torch.tensor(rows, dtype=torch.float64).to(F32)
    check_rms_norm(x, (4,), eps=0.0, context="mean-square ties")
    near = torch.tensor([[a, 2.0**-30, 0.0, 0.0], [a, -a, -(2.0**-31), 0.0]], dtype=torch.float64).to(F32)
    check_rms_norm(near, (4,), eps=0.0, context="near ties")


@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_exponents(dtype):
    g = generator(seed_of("rms gaps", dtype))
    hi, lo = {F32: (60, -60), BF16: (60, -60), F16: (7, -14)}[dtype]
    e = torch.randint(lo, hi, (5, 40), generator=g).double()
    x = (torch.randn((5, 40), generator=g, dtype=torch.float64) * torch.pow(2.0, e)).to(dtype)
    w, _ = params((40,), dtype, "weight", 2)
    check_rms_norm(x, (40,), w, context="exponent gaps")


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype):
    tiny = {F32: 2.0**-149, BF16: 2.0**-133, F16: 2.0**-24}[dtype]
    rows = [
        [1.0, NAN, 2.0, 3.0],
        [1.0, INF, 2.0, 3.0],   # ms = inf -> rstd = 0: y = x * 0 (NaN where x = inf)
        [INF, -INF, 2.0, 3.0],
        [tiny, 2 * tiny, -tiny, 0.0],
        [0.0, -0.0, 0.0, -0.0],  # ms = +0: rstd = 1/sqrt(eps), or inf with eps = 0 (y = 0 * inf = NaN)
        [7.0, 7.0, 7.0, 7.0],
    ]
    x = torch.tensor(rows, dtype=torch.float64).to(dtype)
    w = exact_tensor([1.5, -2.0, 0.0, 1.0], dtype)
    for eps in (0.0, None, 1e-3):
        check_rms_norm(x, (4,), eps=eps, context=f"specials eps={eps}")
        check_rms_norm(x, (4,), w, eps=eps, context=f"specials weight eps={eps}")
    _, rstd = torch.ops.carbon.rms_norm(x, [4], None, 0.0)
    assert rstd[1].item() == 0.0 and rstd[4].item() == INF


def test_empty():
    for shape, ns in (((0, 5), (5,)), ((3, 0), (0,))):
        x = torch.zeros(shape)
        y, rstd = torch.ops.carbon.rms_norm(x, list(ns), None, None)
        assert y.shape == x.shape and rstd.shape == x.shape[:1]
        if rstd.numel():
            # contract §7 "Special values and empty inputs": n = 0 gives r = NaN (0/0), the canonical NaN (§1)
            assert rstd.dtype == F32 and (rstd.view(torch.int32) == 0x7FC00000).all(), rstd
        # R = 0: the weight gradient is +0 (empty sums), never -0
        for dtype in DTYPES:
            xr = torch.zeros(shape, dtype=dtype, requires_grad=True)
            w = torch.ones(ns, dtype=dtype, requires_grad=True)
            carbon.rms_norm(xr, ns, w).sum().backward()
            assert xr.grad.shape == x.shape and w.grad.shape == ns and w.grad.dtype == dtype
            if x.shape[0] == 0:
                assert (w.grad.view(torch.int32 if dtype == F32 else torch.int16) == 0).all(), (dtype, w.grad)


def test_batch_invariance_layouts_threads(restore_num_threads):
    x = norm_data(9, 130, BF16, 3, offset=False)
    w, _ = params((130,), BF16, "weight", 3)
    y, rstd = torch.ops.carbon.rms_norm(x, [130], w, None)
    for i in (0, 5, 8):
        assert_same_bits(torch.ops.carbon.rms_norm(x[i:i + 1], [130], w, None)[0], y[i:i + 1], f"row {i} alone")
    xt = x.t().contiguous().t()
    assert_same_bits(carbon.rms_norm(xt, (130,), w), y, "transposed storage")
    dy = random_values((9, 130), BF16, generator(4))
    out = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        yy = carbon.rms_norm(xr, (130,), wr)
        yy.backward(dy)
        out.append((yy, xr.grad, wr.grad))
    for a, c in zip(*out):
        assert_same_bits(a, c, "1 vs 2 threads")


@pytest.mark.parametrize("affine", ("none", "weight"))
@pytest.mark.parametrize("n", (1, 7, 64, 768))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients(dtype, n, affine):
    s = seed_of("rms-grad", dtype, n, affine)
    x = norm_data(3, n, dtype, s, offset=False)
    w, _ = params((n,), dtype, affine, s)
    check_rms_norm_grads(x, (n,), w, seed=s, context=f"{dtype} n={n} {affine}")


def test_gradients_special_and_nd():
    x = exact_tensor([[1.0, 2.0, 4.0, 8.0], [0.0, 0.0, 0.0, 0.0], [1.0, INF, 0.0, 1.0]], F32)
    w = exact_tensor([1.0, -1.0, 0.5, 2.0], F32)
    dy = exact_tensor([[1.0, 0.0, -1.0, 2.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], F32)
    check_rms_norm_grads(x, (4,), w, dy=dy, context="specials")
    x4 = norm_data(4, 6, F16, 5).reshape(4, 2, 3)
    w4, _ = params((2, 3), F16, "weight", 5)
    check_rms_norm_grads(x4, (2, 3), w4, eps=1e-4, seed=3, context="2-D normalized_shape")


def test_opcheck():
    x = norm_data(3, 8, F32, 1).reshape(3, 2, 4)
    w, _ = params((2, 4), F32, "weight", 1)
    torch.library.opcheck(torch.ops.carbon.rms_norm.default, (x, [2, 4], w, None))
    torch.library.opcheck(torch.ops.carbon.rms_norm.default, (x.half(), [4], None, 0.25))
    _, rstd = torch.ops.carbon.rms_norm(x, [2, 4], w, None)
    torch.library.opcheck(torch.ops.carbon.norm_backward.default, (torch.ones_like(x), x, [2, 4], None, rstd, w))
    torch.library.opcheck(torch.ops.carbon.norm_backward.default, (torch.ones_like(x), x, [2, 4], None, rstd, w,
                                                                  [True, False, False]))


def test_errors():
    x = torch.randn(2, 4)
    cases = [
        (TypeError, lambda: carbon.rms_norm(x.double(), (4,))),
        (ValueError, lambda: carbon.rms_norm(x, (5,))),
        (ValueError, lambda: carbon.rms_norm(x, (4,), torch.ones(2, 2))),
        (TypeError, lambda: carbon.rms_norm(x, (4,), torch.ones(4, dtype=F16))),
        (ValueError, lambda: carbon.rms_norm(x, (4,), eps=-1.0)),
    ]
    for fake in (False, True):
        for exc, fn in cases:
            with pytest.raises(exc, match=r"^carbon\.rms_norm: "):
                if fake:
                    with FakeTensorMode(allow_non_fake_inputs=True):
                        fn()
                else:
                    fn()


def test_module():
    torch.manual_seed(1)
    ref = torch.nn.RMSNorm(16)
    with torch.no_grad():
        ref.weight.normal_()
    mod = carbon.nn.RMSNorm(16)
    assert set(mod.state_dict()) == set(ref.state_dict())
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(5, 16)
    torch.testing.assert_close(mod(x), ref(x), rtol=2e-6, atol=2e-6)
    twin = carbon.nn.RMSNorm.from_torch(ref)
    assert twin.weight is ref.weight
    assert_same_bits(twin(x), mod(x), "from_torch")
    twin(x).sum().backward()
    assert ref.weight.grad is not None
    eps_mod = carbon.nn.RMSNorm((4, 4), eps=1e-3, elementwise_affine=False)
    assert eps_mod.weight is None
    xx = torch.randn(2, 4, 4)
    assert_same_bits(eps_mod(xx), torch.ops.carbon.rms_norm(xx, [4, 4], None, 1e-3)[0], "no affine")
    with pytest.raises(TypeError):
        carbon.nn.RMSNorm.from_torch(torch.nn.LayerNorm(4))
