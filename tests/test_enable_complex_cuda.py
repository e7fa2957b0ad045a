"""complex64 ops under carbon.enable on a GPU (products, quotients, exp, modulus, phase, draws, and an S4D training
step): the CPU's bits (CUDA's complex kernels fuse and scale differently). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits
from tests.test_enable_complex import S4D

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    return as_bits(torch.view_as_real(t) if t.is_complex() else t)


def _ops(z: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> list:
    return [z * w, z * r, 1j * r, z / w, z / r, r / w, 1 / w, torch.exp(z), z.abs(), z.angle(), z.sgn(), z.sum(0),
            z @ w.mT, torch.bmm(z.unsqueeze(0), w.mT.unsqueeze(0)), torch.polar(r.abs(), r),
            torch.linalg.vector_norm(z, dim=1), torch.linalg.vector_norm(z, 1)]


def test_complex_ops_on_the_gpu_equal_the_cpu():
    g = torch.Generator().manual_seed(1)
    z, w = (torch.randn(64, 48, dtype=torch.complex64, generator=g) for _ in range(2))
    r = torch.randn(64, 48, generator=g)
    with carbon.enabled():
        want = _ops(z, w, r)
        got = _ops(z.cuda(), w.cuda(), r.cuda())
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.device.type == "cuda" and torch.equal(_bits(a), _bits(b)), i


def test_complex_draws_on_the_gpu_equal_the_cpu():
    draws = {}
    for device in ("cpu", "cuda"):
        with carbon.enabled(seed=7):
            draws[device] = [torch.rand(5, 7, dtype=torch.cfloat, device=device),
                             torch.randn(9, dtype=torch.cfloat, device=device)]
    for a, b in zip(draws["cuda"], draws["cpu"]):
        assert torch.equal(_bits(a), _bits(b))


def test_an_s4d_step_on_the_gpu_has_the_cpus_fingerprint():
    prints = {}
    for device in ("cpu", "cuda"):
        with carbon.enabled(seed=4):
            model = S4D().to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            u = torch.randn(2, 8, 50, device=device)
            for _ in range(2):
                model(u).square().mean().backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        prints[device] = carbon.fingerprint(model, optimizer)
    assert prints["cuda"] == prints["cpu"]
