"""carbon.lgamma, carbon.digamma and carbon.trigamma and their gradients on a CUDA GPU: the CPU's bits (one
shared host/device implementation, csrc/elementwise/gamma_math.h), for every kind of float32 / bfloat16 /
float16 value and next to the zeros and poles. Skipped without a GPU."""

import math

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU
NAMES = ("lgamma", "digamma", "trigamma")


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    n = 1 << 16
    bits_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    top = 2**31 if dtype == torch.float32 else 2**15
    patterns = torch.randint(-top, top - 1, (n,), generator=g, dtype=torch.int64).to(bits_dtype).view(dtype)
    moderate = (torch.rand(n, generator=g) * 40 - 20).to(dtype)  # the poles, zeros and reflection
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 2.0, -1.0, -2.5, 1.4616321, -2.4570248,
                             -2.7476826, 2.0**-25, 16.0], dtype=dtype)
    return torch.cat([patterns, moderate, specials])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_forward_and_gradient_on_the_gpu_equal_the_cpu(name, dtype):
    x = _inputs(dtype)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    fn = getattr(carbon, name)
    assert torch.equal(as_bits(fn(x.cuda()).cpu()), as_bits(fn(x)))
    back = torch.ops.carbon.elementwise_backward
    assert torch.equal(as_bits(back(g.cuda(), x.cuda(), name).cpu()), as_bits(back(g, x, name)))


def test_distributions_under_enable_on_the_gpu_equal_the_cpu(carbon_disabled_after):
    D = torch.distributions
    gen = torch.Generator().manual_seed(2)
    a, b = torch.rand(256, generator=gen) * 4 + 0.2, torch.rand(256, generator=gen) * 4 + 0.2
    p = torch.rand(256, generator=gen) * 0.98 + 0.01

    def terms(device):
        with carbon.enabled():
            A, B, P = (t.to(device) for t in (a, b, p))
            return [D.Beta(A, B).log_prob(P), D.Beta(A, B).entropy(), D.Gamma(A, B).log_prob(P * 5),
                    D.Poisson(A).log_prob(torch.floor(P * 10))]

    for gpu, cpu in zip(terms("cuda"), terms("cpu")):
        assert torch.equal(as_bits(gpu.cpu()), as_bits(cpu))
