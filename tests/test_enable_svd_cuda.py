"""torch.linalg.svd, pinv and lstsq under carbon.enable on a GPU: the CPU's bits, forward and backward (cuSOLVER's
gesvdj would differ, signs included). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


@pytest.mark.parametrize("shape", [(9, 4), (4, 9), (16, 16)])
def test_svd_and_pinv_on_the_gpu_equal_the_cpu(shape):
    a = torch.randn(3, *shape, generator=torch.Generator().manual_seed(sum(shape)))
    results = []
    for device in ("cpu", "cuda"):
        x = a.to(device).requires_grad_()
        with carbon.enabled(strict=True):
            u, s, vh = torch.linalg.svd(x, full_matrices=True)
            p = torch.linalg.pinv(x)
            solution = torch.linalg.lstsq(x, torch.ones(3, shape[0], 2, device=device), driver="gelsd")
            (s.square().sum() + p.square().sum() + solution.solution.square().sum()).backward()
        results.append([as_bits(t.detach().cpu()) for t in (u, s, vh, p, solution.solution, x.grad)])
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
