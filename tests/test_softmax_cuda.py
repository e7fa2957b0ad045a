"""On a CUDA GPU carbon.softmax / log_softmax / cross_entropy return the same
bits as on the CPU, forward and backward (both are the exactly defined
result of docs/contract.md §8): random rows of many lengths (up to 50257
classes), masked rows, special values, sums on float32 ties, every dtype,
batch invariance. A few results are also checked against the reference of
tests/softmax_reference.py. Skipped without a GPU."""

import math
import zlib

import pytest
import torch

import carbon
from cuda_graphs import capture
from data import BF16, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, generator, random_values, softmax_tie_rows
from oracle import as_bits, assert_bits_equal
from softmax_reference import cross_entropy_bits, log_softmax_bits, softmax_bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
INF, NAN = math.inf, math.nan
OPS = {"softmax": carbon.softmax, "log_softmax": carbon.log_softmax}
REF = {"softmax": softmax_bits, "log_softmax": log_softmax_bits}


def same_bits(gpu, cpu, context=""):
    assert gpu.device.type == "cuda", context
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, f"{context}: {gpu.dtype} {gpu.shape} vs {cpu.dtype} {cpu.shape}"
    # Flattened: on a 0-dim tensor nonzero() has shape (1, 0) when the bits
    # differ, so its numel() is 0 and a 0-dim mismatch would pass unseen.
    got, want = as_bits(gpu).reshape(-1), as_bits(cpu).reshape(-1)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{context}: {bad.numel()} of {got.numel()} outputs differ between GPU and CPU, first at flat index "
        f"{bad[:5].tolist()}: GPU {gpu.detach().cpu().reshape(-1)[bad[0]].item()!r} vs "
        f"CPU {cpu.detach().reshape(-1)[bad[0]].item()!r}")


def values(shape, dtype, g, wide=False):
    return random_values(shape, dtype, g, spread=20 if wide and dtype != F16 else 3)


def forward_backward(op, x, dim, dtype, grad):
    """(y, x.grad) of op on x's device."""
    xl = x.detach().clone().requires_grad_()
    y = OPS[op](xl, dim, dtype=dtype)
    y.backward(grad)
    return y, xl.grad


SHAPES = [((1, 1), 1), ((3, 7), 1), ((64, 100), -1), ((17, 1000), 1), ((4, 5000), 1), ((3, 50257), 1),
          ((1000, 64), 1), ((100, 33), 0), ((2, 3, 4), 0), ((5, 6, 7), 1), ((0, 5), 1), ((5, 0), 1)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_gpu_equals_cpu(op, in_dtype, out_dtype):
    # crc32, not hash(): str hashes change with each process (PYTHONHASHSEED), and a
    # failure seen in the scarce GPU time must be reproducible with the same data.
    g = generator(zlib.crc32(f"{op} {in_dtype} {out_dtype}".encode()))
    for shape, dim in SHAPES:
        for wide in (False, True):
            x = values(shape, in_dtype, g, wide)
            grad = values(shape, out_dtype or in_dtype, g)
            y_cpu, dx_cpu = forward_backward(op, x, dim, out_dtype, grad)
            y_gpu, dx_gpu = forward_backward(op, x.cuda(), dim, out_dtype, grad.cuda())
            ctx = f"{op} {shape} dim={dim} {in_dtype}->{out_dtype} wide={wide}"
            same_bits(y_gpu, y_cpu, ctx)
            same_bits(dx_gpu, dx_cpu, "grad " + ctx)


def special_rows(dtype):
    rows = [
        [1.0, 2.0, -INF, 0.5], [-INF] * 4, [-INF, 3.0, -INF, -INF], [1.0, NAN, 2.0, 3.0], [INF, 1.0, 2.0, 3.0],
        [-INF, INF, -INF, 0.0], [NAN, -INF, -INF, -INF], [0.0, -0.0, 0.0, -0.0], [49152.0, -49152.0, 1.0, -INF],
        [2.0**-24, -(2.0**-24), 2.0**-14, -INF],
    ]
    nan = torch.tensor(rows).isnan()
    return exact_tensor([[0.0 if v != v else v for v in r] for r in rows], dtype).masked_fill(nan, NAN)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_and_special_rows(op, dtype):
    g = generator(1)
    x = special_rows(dtype)
    big = values((300, 2000), dtype, g)
    big[::3, 1000:] = -INF  # half-masked long rows
    big[7] = -INF  # a fully masked long row
    big[11, 5] = NAN
    big[13, 1999] = INF
    for t, dim in ((x, 1), (x.t().contiguous(), 0), (big, 1)):
        for out_dtype in (None, F32, BF16):
            grad = values(t.shape, out_dtype or dtype, g)
            grad[0, 0] = INF
            y_cpu, dx_cpu = forward_backward(op, t, dim, out_dtype, grad)
            y_gpu, dx_gpu = forward_backward(op, t.cuda(), dim, out_dtype, grad.cuda())
            same_bits(y_gpu, y_cpu, f"{op} specials {tuple(t.shape)} {dtype}->{out_dtype}")
            same_bits(dx_gpu, dx_cpu, f"grad {op} specials {tuple(t.shape)} {dtype}->{out_dtype}")
    assert_bits_equal(OPS[op](x.cuda(), 1), REF[op](x, 1), f"{op} specials vs reference")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_on_ties(op, dtype):
    x = softmax_tie_rows(dtype)
    for out_dtype in (None, F32):
        y = OPS[op](x.cuda(), 1, dtype=out_dtype)
        same_bits(y, OPS[op](x, 1, dtype=out_dtype), f"{op} ties {dtype}")
    assert_bits_equal(OPS[op](x[:12].cuda(), 1), REF[op](x[:12], 1), f"{op} ties vs reference")


def warp_row_threshold():
    """Rows from which softmax_cuda.cu gives each row of at most 1024 a warp: 32 per SM."""
    return 32 * torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", (F32, BF16))
def test_many_short_rows_warp_kernels(op, dtype):
    """Attention-like row counts: the warp-per-row kernels forward and backward, on both sides of their row
    threshold and of n = 1024, with masked, NaN, +inf, one-survivor, zero-gradient and float32-tie rows."""
    g = generator(zlib.crc32(f"warp rows {op} {dtype}".encode()))
    threshold = warp_row_threshold()
    ties = softmax_tie_rows(dtype)
    for rows, n in ((threshold - 1, 64), (threshold, 64), (threshold + 5, 1024), (threshold, 1025), (threshold, 7)):
        x = values((rows, n), dtype, g, wide=True)
        x[3] = -INF
        x[5, n // 2] = NAN
        x[6, 0] = INF
        x[7, : n - 1] = -INF
        if n >= ties.shape[1]:
            x[10 : 10 + ties.shape[0], : ties.shape[1]] = ties
            x[10 : 10 + ties.shape[0], ties.shape[1]:] = -INF
        grad = values((rows, n), dtype, g)
        grad[2] = -0.0
        grad[4, ::2] = 0.0
        y, dx = forward_backward(op, x.cuda(), 1, None, grad.cuda())
        y_cpu, dx_cpu = forward_backward(op, x, 1, None, grad)
        same_bits(y, y_cpu, f"{op} {rows} rows of {n}")
        same_bits(dx, dx_cpu, f"{op} backward, {rows} rows of {n}")


@pytest.mark.parametrize("op", OPS)
def test_backward_rows_without_gradient(op):
    """Rows of ±0 gradient (padded positions) take the block-wide zero test: the CPU's bits, signs of zero too."""
    g0 = generator(5)
    x = values((6, 3000), F32, g0)
    grad = values((6, 3000), F32, g0)
    grad[1:5] = 0.0
    grad[2] = -0.0
    grad[3, ::3] = -0.0
    grad[4] = -grad[4]  # −(+0) = −0
    y, dx = forward_backward(op, x.cuda(), 1, None, grad.cuda())
    y_cpu, dx_cpu = forward_backward(op, x, 1, None, grad)
    same_bits(dx, dx_cpu, f"{op} backward, zero rows")


@pytest.mark.parametrize("op", OPS)
def test_batch_invariance(op):
    g = generator(2)
    x = values((1000, 50257 // 8), F32, g).cuda()
    full = as_bits(OPS[op](x, 1))
    for i in (0, 1, 499, 999):
        assert torch.equal(as_bits(OPS[op](x[i : i + 1].clone(), 1)), full[i : i + 1]), f"row {i} alone"
    long = values((2, 50257), BF16, g).cuda()
    assert torch.equal(as_bits(OPS[op](long[:1], 1)), as_bits(OPS[op](long, 1))[:1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ("none", "mean", "sum"))
def test_cross_entropy_gpu_equals_cpu(dtype, reduction):
    g = generator(3)
    for N, C in ((1, 1), (7, 13), (64, 1000), (16, 50257), (300, 10)):
        x = values((N, C), dtype, g)
        t = torch.randint(0, C, (N,), generator=g)
        t[:: max(1, N // 3)] = -100
        if N > 1:
            x[1, :] = -INF if C > 1 else 0.0
            x[N - 1, 0] = -INF
        for eps in (0.0, 0.1, 1.0):
            outs = []
            for dev in ("cpu", "cuda"):
                xl = x.detach().to(dev).clone().requires_grad_()
                loss = carbon.cross_entropy(xl, t.to(dev), reduction, label_smoothing=eps)
                grad = random_values(loss.shape, loss.dtype, generator(4), spread=2).to(dev)
                loss.backward(grad)
                outs.append((loss, xl.grad))
            ctx = f"cross_entropy {dtype} N={N} C={C} {reduction} eps={eps}"
            same_bits(outs[1][0], outs[0][0], ctx)
            same_bits(outs[1][1], outs[0][1], "grad " + ctx)
    x = values((5, 9), dtype, g)
    t = torch.tensor([0, 8, -100, 3, 3])
    assert_bits_equal(carbon.cross_entropy(x.cuda(), t.cuda(), reduction, label_smoothing=0.1),
                      cross_entropy_bits(x, t, reduction, -100, 0.1), "cross_entropy vs reference")


def test_cross_entropy_layouts_and_ignored():
    g = generator(5)
    x = values((3, 6, 4, 2), BF16, g)
    t = torch.randint(0, 6, (3, 4, 2), generator=g)
    t[0, 0, 0] = -100
    for reduction in ("none", "mean", "sum"):
        a = carbon.cross_entropy(x, t, reduction, label_smoothing=0.1)
        b = carbon.cross_entropy(x.cuda(), t.cuda(), reduction, label_smoothing=0.1)
        same_bits(b, a, f"[N,C,d1,d2] {reduction}")
    all_ignored = torch.full((4,), -100)
    x = values((4, 5), F32, g)
    xl = x.cuda().requires_grad_()
    loss = carbon.cross_entropy(xl, all_ignored.cuda(), "mean")
    assert as_bits(loss).item() == 0x7FC00000
    loss.backward()
    assert (as_bits(xl.grad) == 0).all()


def test_cross_entropy_out_of_range_target_is_nan_on_cuda():
    """Documented: checking the targets would need a host synchronization, so
    CUDA gives NaN for an out-of-range target (the CPU raises IndexError)."""
    x = torch.zeros(3, 4, device="cuda", requires_grad=True)
    t = torch.tensor([0, 4, 1], device="cuda")
    losses = carbon.cross_entropy(x, t, "none")
    assert math.isnan(losses[1].item()) and not math.isnan(losses[0].item())
    mean = carbon.cross_entropy(x, t, "mean")
    assert math.isnan(mean.item())
    mean.backward()
    assert x.grad[1].isnan().all() and not x.grad[0].isnan().any()


def test_non_contiguous_inputs_and_gradients():
    """Views of a GPU tensor (transposed, strided, offset) along either dim,
    with a non-contiguous incoming gradient: the CPU's bits."""
    g = generator(6)
    base = values((40, 300), F32, g, wide=True)
    grad_base = values((300, 40), F32, g)
    views = [(lambda t: t.t(), 0), (lambda t: t.t(), 1), (lambda t: t[:, ::3], 1), (lambda t: t[3:, 5:], 0)]
    for op in OPS:
        for view, dim in views:
            x_cpu, x_gpu = view(base), view(base.to(DEV))
            grad_cpu = view(grad_base.t())
            grad_gpu = view(grad_base.to(DEV).t())
            y_cpu, dx_cpu = forward_backward(op, x_cpu, dim, None, grad_cpu)
            y_gpu, dx_gpu = forward_backward(op, x_gpu, dim, None, grad_gpu)
            ctx = f"{op} view {tuple(x_cpu.shape)} strides {x_gpu.stride()} dim={dim}"
            same_bits(OPS[op](x_gpu, dim), y_cpu, ctx + " (the view itself)")
            same_bits(y_gpu, y_cpu, ctx)
            same_bits(dx_gpu, dx_cpu, "grad " + ctx)
        x = values((6, 50, 7), BF16, g)
        y = OPS[op](x.to(DEV).permute(2, 0, 1), 2, dtype=F32)
        same_bits(y, OPS[op](x.permute(2, 0, 1), 2, dtype=F32), f"{op} permuted 3-D")


def _softmax_family_ops(x, t, g, gl):
    """Every CUDA kernel of csrc/softmax/softmax_cuda.cu, through the raw ops
    (no autograd): softmax, log_softmax, their gradients, cross-entropy
    (mean with label smoothing) and its gradient."""
    ops = torch.ops.carbon
    y = ops.softmax(x, 1, None)
    ly = ops.log_softmax(x, 1, BF16)
    dy = ops.softmax_backward(g, y, 1, F32)
    dly = ops.log_softmax_backward(g.to(BF16), ly, 1, F32)
    loss, log_probs, count = ops.cross_entropy(x, t, 1, -100, 0.1)
    dx = ops.cross_entropy_backward(gl, log_probs, t, count, 1, -100, 0.1, F32)
    losses, _, _ = ops.cross_entropy(x, t, 0, -100, 0.0)
    return [y, ly, dy, dly, loss, log_probs, count, dx, losses]


def test_no_host_synchronization_and_cuda_graph_replay():
    """The kernels never wait for the device (CUDA graph capture needs it):
    an eager run under sync-debug "error", then one capture replayed on new
    data, each result the CPU's bits."""
    g = generator(7)
    N, C = 33, 517

    def data():
        x = values((N, C), F32, g, wide=True)
        x[4] = -INF  # a fully masked row
        t = torch.randint(0, C, (N,), generator=g)
        t[::5] = -100
        t[4] = -100  # (its loss would be +inf, and so every mean)
        return x, t, values((N, C), F32, g), torch.tensor(1.5)

    def check(got, inputs, context):
        want = _softmax_family_ops(*inputs)
        for k, (a, b) in enumerate(zip(got, want)):
            if b.dtype == torch.int64:
                assert torch.equal(a.cpu(), b), f"{context}: count"
            else:
                same_bits(a, b, f"{context}: result {k}")

    inputs = data()
    static = [v.to(DEV) for v in inputs]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = _softmax_family_ops(*static)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check(eager, inputs, "eager")
    graph, captured = capture(lambda: _softmax_family_ops(*static))
    for replay in range(2):
        new = data()
        for s_, v in zip(static, new):
            s_.copy_(v.to(DEV))
        graph.replay()
        torch.cuda.synchronize()
        check(captured, new, f"graph replay {replay}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_a_device_that_is_not_current():
    """Inputs on cuda:1 while cuda:0 is current: the kernels run on cuda:1
    (CUDAGuard) and return the CPU's bits."""
    g = generator(8)
    x = values((17, 1000), BF16, g)
    t = torch.randint(0, 1000, (17,), generator=g)
    t[2] = -100
    grad = values((17, 1000), BF16, g)
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        for op in OPS:
            y_cpu, dx_cpu = forward_backward(op, x, 1, None, grad)
            y_gpu, dx_gpu = forward_backward(op, x.to(dev), 1, None, grad.to(dev))
            assert y_gpu.device == dev and dx_gpu.device == dev
            same_bits(y_gpu, y_cpu, f"{op} on cuda:1")
            same_bits(dx_gpu, dx_cpu, f"grad {op} on cuda:1")
        for reduction in ("none", "mean"):
            outs = []
            for device in ("cpu", dev):
                xl = x.to(device).requires_grad_()
                loss = carbon.cross_entropy(xl, t.to(device), reduction, label_smoothing=0.1)
                loss.backward(torch.ones_like(loss))
                outs.append((loss, xl.grad))
            assert outs[1][0].device == dev
            same_bits(outs[1][0], outs[0][0], f"cross_entropy {reduction} on cuda:1")
            same_bits(outs[1][1], outs[0][1], f"grad cross_entropy {reduction} on cuda:1")
        with pytest.raises(ValueError, match="one device"):
            carbon.cross_entropy(x.to(dev), t.to("cuda:0"))


def test_tensors_on_the_cpu_and_a_gpu_raise():
    """Tensors on different devices raise ValueError("carbon.<op>: expected all tensors on one device…",
    contract §8), with a CPU and a single GPU: cross_entropy's input and target (either way round, also through
    autograd), the softmax gradients' grad and y, cross_entropy_backward's grad, target and count against its
    log_probs. (test_tensors_on_a_device_that_is_not_current covers two GPUs.)"""
    g = generator(9)
    x = values((5, 7), F32, g)
    t = torch.randint(0, 7, (5,), generator=g)
    one_device = "expected all tensors on one device"
    for x_dev, t_dev in ((DEV, "cpu"), ("cpu", DEV)):
        for requires_grad in (False, True):
            with pytest.raises(ValueError, match=rf"^carbon\.cross_entropy: {one_device}"):
                carbon.cross_entropy(x.detach().to(x_dev).requires_grad_(requires_grad), t.to(t_dev))
    ops = torch.ops.carbon
    grad = values((5, 7), F32, g)
    for name, forward in (("softmax_backward", ops.softmax), ("log_softmax_backward", ops.log_softmax)):
        y = forward(x, 1, None)
        for g_dev, y_dev in ((DEV, "cpu"), ("cpu", DEV)):
            with pytest.raises(ValueError, match=rf"^carbon\.{name}: {one_device}"):
                getattr(ops, name)(grad.to(g_dev), y.to(y_dev), 1, F32)
    _, log_probs, count = ops.cross_entropy(x.to(DEV), t.to(DEV), 1, -100, 0.0)
    g_loss, t_dev = torch.tensor(1.0, device=DEV), t.to(DEV)
    for args in ((g_loss.cpu(), log_probs, t_dev, count), (g_loss, log_probs, t, count),
                 (g_loss, log_probs, t_dev, count.cpu())):
        with pytest.raises(ValueError, match=rf"^carbon\.cross_entropy_backward: {one_device}"):
            ops.cross_entropy_backward(*args, 1, -100, 0.0, F32)
