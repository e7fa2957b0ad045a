"""The samplers that draw by rejection (gamma, Dirichlet, Poisson, binomial) under carbon.enable on a CUDA GPU:
the CPU's bits (the same draws of carbon.Generator and the same binary64 steps with carbon's float64 log, exp
and pow). Skipped without a GPU."""

import pytest
import torch
from torch import distributions as D

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU


def _samples(device: str):
    with carbon.enabled(seed=9):
        a = torch.linspace(0.05, 40.0, 5000, device=device)
        b = torch.linspace(6.0, 0.3, 5000, device=device)
        return [torch._standard_gamma(a), torch._standard_gamma(a.half()), torch._sample_dirichlet(torch.stack([a, b], -1)),
                D.Beta(a, b).sample(), D.StudentT(a + 1).sample(), torch.poisson(a), torch.poisson(a * 1000),
                torch.binomial(torch.floor(a * 100), b / 6.0), D.Binomial(7, b / 6.0).sample()]


def test_samples_on_the_gpu_equal_the_cpu(carbon_disabled_after):
    for gpu, cpu in zip(_samples("cuda"), _samples("cpu")):
        assert torch.equal(as_bits(gpu.cpu()), as_bits(cpu))
