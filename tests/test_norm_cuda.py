"""On a CUDA GPU, carbon.layer_norm / carbon.rms_norm return the same bits as
on the CPU (both implement docs/contract.md §7 exactly): forward outputs,
statistics and gradients, random and adversarial rows, every dtype, batch
invariance. Skipped without a GPU."""

import math

import pytest
import torch

import carbon
from data import BF16, DTYPES, F16, F32, generator, random_values
from norm_util import assert_same_bits, norm_data, params, tie_square

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

INF, NAN = math.inf, math.nan


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


def adversarial_rows(dtype):
    a = tie_square() if dtype == F32 else 1.0
    rows = [
        [3.0 - a, 3.0 + a] + [3.0] * 62,           # variance tie (float32): exact tier
        [2.0, 2.0**-23] * 32,                      # mean tie (float32)
        [1.0, NAN] + [2.0] * 62,
        [1.0, INF] + [2.0] * 62,
        [INF, -INF] + [2.0] * 62,
        [5.0] * 64,                                # constant row
        [0.0, -0.0] * 32,
        [1e30 if dtype != F16 else 1e4, -(1e30 if dtype != F16 else 1e4)] * 31 + [1.0, 3.0],
    ]
    return torch.tensor(rows, dtype=torch.float64).to(dtype)


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
    x = adversarial_rows(dtype)
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
