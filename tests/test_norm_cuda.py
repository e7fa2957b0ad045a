"""On a CUDA GPU, carbon.layer_norm / carbon.rms_norm return the same bits as
on the CPU (both implement docs/contract.md §7 exactly): forward outputs,
statistics and gradients, random and adversarial rows, every dtype, batch
invariance. Skipped without a GPU."""

import pytest
import torch

import carbon
from cuda_graphs import capture
from data import BF16, DTYPES, F32, generator, random_values
from norm_util import adversarial_norm_rows, assert_same_bits, norm_data, params

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def same(gpu, cpu, context):
    assert gpu.device.type == "cuda", context
    assert_same_bits(gpu.cpu(), cpu, context)


def same_all(gpus, cpus, context):
    for name, g, c in zip(("dx", "dweight", "dbias"), gpus, cpus):
        same(g, c, f"{context} {name}")


backward = torch.ops.carbon.norm_backward
# dx alone, the column sums alone, and all three: on the CPU the first two take
# separate kernels and the last the fused pass.
MASKS = ([True, False, False], [False, True, True], [True, True, True])


@pytest.mark.parametrize("n", (1, 7, 64, 768, 1000, 4096, 4097))  # cached rows up to 4096
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_and_backward_match_cpu(dtype, n):
    rows = 33 if n <= 1000 else 2000  # large n: more rows than resident warps (grid-stride loop)
    x = norm_data(rows, n, dtype, n)
    w, b = params((n,), dtype, "both", n)
    dy = random_values((rows, n), dtype, generator(n + 1), spread=2)
    for eps in (1e-5, 0.0):
        cpu = torch.ops.carbon.layer_norm(x, [n], w, b, eps)
        gpu = torch.ops.carbon.layer_norm(x.cuda(), [n], w.cuda(), b.cuda(), eps)
        for name, g, c in zip(("y", "mean", "rstd"), gpu, cpu):
            same(g, c, f"layer_norm {name} n={n} eps={eps}")
        for mask in MASKS:
            same_all(backward(dy.cuda(), x.cuda(), [n], gpu[1], gpu[2], w.cuda(), mask),
                     backward(dy, x, [n], cpu[1], cpu[2], w, mask), f"layer_norm backward n={n} mask={mask}")
        rc = torch.ops.carbon.rms_norm(x, [n], w, eps)
        rg = torch.ops.carbon.rms_norm(x.cuda(), [n], w.cuda(), eps)
        same(rg[0], rc[0], f"rms_norm y n={n}")
        same(rg[1], rc[1], f"rms_norm rstd n={n}")
        for mask in MASKS:
            same_all(backward(dy.cuda(), x.cuda(), [n], None, rg[1], w.cuda(), mask),
                     backward(dy, x, [n], None, rc[1], w, mask), f"rms_norm backward n={n} mask={mask}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_rows(dtype):
    x = adversarial_norm_rows(dtype, 64)
    w, b = params((64,), dtype, "both", 1)
    dy = random_values(tuple(x.shape), dtype, generator(2), spread=1)
    for weight, bias in ((None, None), (w, b)):
        wc = None if weight is None else weight.cuda()
        bc = None if bias is None else bias.cuda()
        for eps in (0.0, 1e-5):
            cpu = torch.ops.carbon.layer_norm(x, [64], weight, bias, eps)
            gpu = torch.ops.carbon.layer_norm(x.cuda(), [64], wc, bc, eps)
            for name, g, c in zip(("y", "mean", "rstd"), gpu, cpu):
                same(g, c, f"adversarial layer_norm {name}")
            same_all(backward(dy.cuda(), x.cuda(), [64], gpu[1], gpu[2], wc),
                     backward(dy, x, [64], cpu[1], cpu[2], weight), "adversarial backward")
            for g, c in zip(torch.ops.carbon.rms_norm(x.cuda(), [64], wc, eps), torch.ops.carbon.rms_norm(x, [64], weight, eps)):
                same(g, c, "adversarial rms_norm")


def test_autograd_and_batch_invariance():
    x = norm_data(64, 512, BF16, 5)
    w, b = params((512,), BF16, "both", 5)
    dy = random_values((64, 512), BF16, generator(6), spread=1)
    grads = []
    for dev in ("cpu", "cuda"):
        xr, wr, br = (t.to(dev).requires_grad_() for t in (x, w, b))
        y = carbon.layer_norm(xr, (512,), wr, br)
        y.backward(dy.to(dev))
        grads.append((y, xr.grad, wr.grad, br.grad))
        xr, wr = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        y = carbon.rms_norm(xr, (512,), wr)
        y.backward(dy.to(dev))
        grads[-1] += (y, xr.grad, wr.grad)
    for i, (g, c) in enumerate(zip(*reversed(grads))):
        same(g, c, f"autograd output {i}")
    xc = x.cuda()
    full = carbon.layer_norm(xc, (512,), w.cuda(), b.cuda())
    for i in (0, 17, 63):
        same(carbon.layer_norm(xc[i:i + 1], (512,), w.cuda(), b.cuda()), full[i:i + 1].cpu(), f"row {i} alone")


def same_outputs(gpus, cpus, context):
    for i, (g, c) in enumerate(zip(gpus, cpus)):
        same(g, c, f"{context} output {i}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_inputs(dtype):
    """No rows (nothing to launch) and empty rows (statistics NaN, y empty)."""
    for rows, n in ((0, 16), (4, 0)):
        x = torch.empty((rows, n), dtype=dtype)
        dy = torch.empty((rows, n), dtype=dtype)
        w, b = params((n,), dtype, "both", 1)
        cpu = torch.ops.carbon.layer_norm(x, [n], w, b, 1e-5)
        gpu = torch.ops.carbon.layer_norm(x.cuda(), [n], w.cuda(), b.cuda(), 1e-5)
        same_outputs(gpu, cpu, f"layer_norm rows={rows} n={n}")
        rc = torch.ops.carbon.rms_norm(x, [n], w, None)
        rg = torch.ops.carbon.rms_norm(x.cuda(), [n], w.cuda(), None)
        same_outputs(rg, rc, f"rms_norm rows={rows} n={n}")
        for mask in MASKS:
            same_all(backward(dy.cuda(), x.cuda(), [n], gpu[1], gpu[2], w.cuda(), mask),
                     backward(dy, x, [n], cpu[1], cpu[2], w, mask), f"layer_norm backward rows={rows} n={n} {mask}")
            same_all(backward(dy.cuda(), x.cuda(), [n], None, rg[1], w.cuda(), mask),
                     backward(dy, x, [n], None, rc[1], w, mask), f"rms_norm backward rows={rows} n={n} {mask}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_and_multi_dim_inputs(dtype):
    """Strided x, dy, weight and bias (the op makes them contiguous) and a
    normalized_shape of two dimensions: the same bits as the CPU."""
    x = norm_data(96, 6, dtype, 21).t()  # (6, 96), not contiguous
    dy = random_values((96, 6), dtype, generator(22), spread=2).t()
    w2, b2 = params((192,), dtype, "both", 23)
    w, b = w2[::2], b2[1::2]
    cpu = torch.ops.carbon.layer_norm(x, [96], w, b, 1e-5)
    gpu = torch.ops.carbon.layer_norm(x.cuda(), [96], w.cuda(), b.cuda(), 1e-5)
    same_outputs(gpu, cpu, "strided layer_norm")
    for mask in MASKS:
        same_all(backward(dy.cuda(), x.cuda(), [96], gpu[1], gpu[2], w.cuda(), mask),
                 backward(dy, x, [96], cpu[1], cpu[2], w, mask), f"strided backward {mask}")
    same_outputs(torch.ops.carbon.rms_norm(x.cuda(), [96], w.cuda(), None), torch.ops.carbon.rms_norm(x, [96], w, None),
                 "strided rms_norm")
    x4 = norm_data(12, 40, dtype, 24).reshape(2, 6, 8, 5)
    w4, b4 = params((8, 5), dtype, "both", 25)
    same_outputs(torch.ops.carbon.layer_norm(x4.cuda(), [8, 5], w4.cuda(), b4.cuda(), 1e-5),
                 torch.ops.carbon.layer_norm(x4, [8, 5], w4, b4, 1e-5), "layer_norm over two dims")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_a_non_current_device():
    """The kernels run on x's device (a device guard), not the current one."""
    x = norm_data(33, 768, BF16, 31)
    w, b = params((768,), BF16, "both", 31)
    dy = random_values((33, 768), BF16, generator(32), spread=1)
    cpu = torch.ops.carbon.layer_norm(x, [768], w, b, 1e-5)
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        gpu = torch.ops.carbon.layer_norm(x.to(dev), [768], w.to(dev), b.to(dev), 1e-5)
        grads = backward(dy.to(dev), x.to(dev), [768], gpu[1], gpu[2], w.to(dev), [True, True, True])
        var_mean = torch.ops.carbon.var_mean_rows(x.to(dev), 1)
    assert all(t.device == dev for t in (*gpu, *grads, *var_mean))
    same_outputs(gpu, cpu, "layer_norm on cuda:1")
    same_all(grads, backward(dy, x, [768], cpu[1], cpu[2], w, [True, True, True]), "backward on cuda:1")
    same_outputs(var_mean, torch.ops.carbon.var_mean_rows(x, 1), "var_mean_rows on cuda:1")


@pytest.mark.parametrize("dtype", DTYPES)
def test_var_mean_rows_match_cpu(dtype):
    """var_mean_rows' warp kernel: random rows of several lengths (tier 1 and
    the exact tier), every kind of correction (divisor 0 included), special
    rows (NaN, infinities: bits of the one NaN), empty inputs, strided input."""
    var_mean = torch.ops.carbon.var_mean_rows
    for rows, n in ((5, 1), (9, 33), (4, 1000), (3, 5000)):
        x = norm_data(rows, n, dtype, n)
        for correction in (0, 1, n, n + 1):
            same_outputs(var_mean(x.cuda(), correction), var_mean(x, correction), f"n={n} correction={correction}")
    x = adversarial_norm_rows(dtype, 64)
    for correction in (0, 1):
        same_outputs(var_mean(x.cuda(), correction), var_mean(x, correction), f"adversarial correction={correction}")
    for shape in ((3, 0), (0, 5)):
        x = torch.empty(shape, dtype=dtype)
        same_outputs(var_mean(x.cuda(), 1), var_mean(x, 1), f"empty {shape}")
    x = norm_data(40, 7, dtype, 3).t()  # (7, 40), not contiguous
    same_outputs(var_mean(x.cuda(), 1), var_mean(x, 1), "strided")


def test_mixed_devices_are_refused():
    x = norm_data(4, 8, F32, 41).cuda()
    w, b = params((8,), F32, "both", 41)
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        torch.ops.carbon.layer_norm(x, [8], w, None, 1e-5)
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        torch.ops.carbon.rms_norm(x, [8], w, None)
    y, mean, rstd = torch.ops.carbon.layer_norm(x, [8], w.cuda(), b.cuda(), 1e-5)
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        backward(torch.ones(4, 8), x, [8], mean, rstd, w.cuda(), [True, True, True])
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        backward(torch.ones(4, 8, device="cuda"), x, [8], mean, rstd.cpu(), w.cuda(), [True, True, True])


def test_cuda_graph_capture_and_replay_of_forward_and_backward():
    """layer_norm and rms_norm, forward and backward (dx by the row kernel, dweight / dbias by the column kernels,
    whose fp64 scratch then comes from the graph's pool), captured in a CUDA graph and replayed on new inputs:
    the CPU's bits after every replay."""
    rows, n = 300, 96
    w, b = params((n,), F32, "both", 303)
    inputs = [(norm_data(rows, n, F32, 301 + k), random_values((rows, n), F32, generator(302 + k), spread=2))
              for k in range(3)]
    sx, sdy = inputs[0][0].cuda(), inputs[0][1].cuda()
    sw, sb = w.cuda(), b.cuda()

    def step(x, dy, w, b):
        y, mean, rstd = torch.ops.carbon.layer_norm(x, [n], w, b, 1e-5)
        ry, rrstd = torch.ops.carbon.rms_norm(x, [n], w, None)
        return (y, *backward(dy, x, [n], mean, rstd, w, [True, True, True]), ry,
                *backward(dy, x, [n], None, rrstd, w, [True, True, False]))

    graph, out = capture(lambda: step(sx, sdy, sw, sb), warmups=2)
    for x, dy in inputs:
        sx.copy_(x.cuda())
        sdy.copy_(dy.cuda())
        graph.replay()
        torch.cuda.synchronize()
        for k, (got, want) in enumerate(zip(out, step(x, dy, w, b))):
            same(got, want, f"graph replay, output {k}")

