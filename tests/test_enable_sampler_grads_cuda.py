"""The reparameterized gradients of the gamma family under carbon.enable on a GPU: the CPU's bits (torch's CUDA
kernels evaluate the same approximations in float with the device's libm). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def test_standard_gamma_grad_and_dirichlet_grad_on_the_gpu_equal_the_cpu():
    gen = torch.Generator().manual_seed(0)
    alpha = torch.cat([torch.rand(3000, generator=gen) * 0.9 + 0.05, torch.rand(3000, generator=gen) * 60 + 0.1])
    x = torch._standard_gamma(alpha.double(), generator=gen).float().clamp_min(1e-30)
    conc = torch.rand(2000, 3, generator=gen) * 20 + 0.05
    sample = torch._sample_dirichlet(conc.double(), generator=gen).float().clamp(1e-30, 1 - 2 ** -24)
    total = conc.sum(-1, keepdim=True).expand_as(conc).contiguous()
    with carbon.enabled():
        want = [torch._standard_gamma_grad(alpha, x), torch._dirichlet_grad(sample, conc, total)]
        got = [torch._standard_gamma_grad(alpha.cuda(), x.cuda()),
               torch._dirichlet_grad(sample.cuda(), conc.cuda(), total.cuda())]
    for g, w in zip(got, want):
        assert g.device.type == "cuda" and torch.equal(as_bits(g.cpu()), as_bits(w))


def test_beta_rsample_gradients_on_the_gpu_equal_the_cpu():
    grads = []
    for device in ("cpu", "cuda"):
        params = torch.tensor([[0.7, 2.0], [3.0, 9.0], [12.0, 15.0]], device=device, requires_grad=True)
        with carbon.enabled(seed=4, strict=True):
            D.Beta(params[:, 0], params[:, 1]).rsample((64,)).square().sum().backward()
        grads.append(params.grad)
    assert torch.equal(as_bits(grads[1].cpu()), as_bits(grads[0]))
