"""On a CUDA GPU the float64 exp, log, sin, cos and pow return the CPU's bits
(one double-double implementation for both), for random values over all
exponents, the reduction's hard cases, specials and gradients; the GPU run
is also checked against mpmath on a sample. Skipped without a GPU."""

import math

import mpmath
import pytest
import torch

import carbon
from conftest import ON_GPU
from test_elementwise_binary64 import HARD_SIN_COS, RNG, check, near_quarter_turns, pow_ref, rn, spread

pytestmark = ON_GPU


def inputs() -> torch.Tensor:
    xs = spread(-1074, 1023, 20_000) + near_quarter_turns(300) + HARD_SIN_COS
    xs += [math.inf, -math.inf, math.nan, -0.0, 5e-324, -745.14, 709.78, 709.79]
    g = torch.Generator().manual_seed(3)
    patterns = torch.randint(-(2**62), 2**62, (1 << 16,), generator=g, dtype=torch.int64).view(torch.float64)
    return torch.cat([torch.tensor(xs, dtype=torch.float64), patterns])


def same_bits(gpu: torch.Tensor, cpu: torch.Tensor, what: str) -> None:
    got, want = gpu.cpu().view(torch.int64), cpu.view(torch.int64)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{what}: {bad.numel()} elements differ, first at {bad[:5].tolist()}"


@pytest.mark.parametrize("name", ["exp", "log", "sin", "cos"])
def test_float64_functions_same_bits_as_cpu(name):
    x = inputs()
    fn = getattr(carbon, name)
    same_bits(fn(x.cuda()), fn(x), name)
    # a sample of finite arguments inside each function's domain, against mpmath
    xs = [v for v in x[:3000].tolist() if math.isfinite(v) and (name != "log" or v > 0) and (name != "exp" or -746 < v < 709)]
    xs = [v for v in xs if v != 0.0]
    ref = getattr(mpmath, name)
    check(fn(torch.tensor(xs, dtype=torch.float64).cuda()).cpu(), xs, lambda v: rn(ref(mpmath.mpf(v))),
          f"{name} on the GPU vs mpmath")


@pytest.mark.parametrize("name", ["exp", "log", "sin", "cos"])
def test_float64_gradients_same_bits_as_cpu(name):
    x = inputs()[:5000]
    g = torch.tensor(spread(-10, 10, x.numel()), dtype=torch.float64)
    cpu = torch.ops.carbon.elementwise_backward(g, x, name)
    same_bits(torch.ops.carbon.elementwise_backward(g.cuda(), x.cuda(), name), cpu, f"{name} backward")


def test_float64_pow_same_bits_as_cpu():
    e = torch.tensor([i / 32 for i in range(32)] + spread(-8, 8, 4000), dtype=torch.float64)
    for base in (10000.0, 2.0, 0.5, -3.0):
        same_bits(torch.ops.carbon.pow_scalar_tensor(base, e.cuda()), torch.ops.carbon.pow_scalar_tensor(base, e),
                  f"{base} ** e")
    x = inputs()
    for p in (1.7, -0.37, 3.0, 0.5):
        same_bits(torch.ops.carbon.pow_tensor_scalar(x.cuda(), p), torch.ops.carbon.pow_tensor_scalar(x, p),
                  f"x ** {p}")
    es = [RNG.uniform(-20, 20) for _ in range(500)]
    got = torch.ops.carbon.pow_scalar_tensor(10000.0, torch.tensor(es, dtype=torch.float64).cuda()).cpu()
    check(got, es, lambda v: pow_ref(10000.0, v), "10000 ** e on the GPU vs mpmath")
