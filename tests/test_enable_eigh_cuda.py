"""torch.linalg.eigh under carbon.enable on a GPU: the CPU's bits, forward and backward (cuSOLVER's syevd / syevj
would differ, eigenvector signs included). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


@pytest.mark.parametrize("n", [3, 16, 33])
def test_eigh_on_the_gpu_equals_the_cpu(n):
    m = torch.randn(4, n, n, generator=torch.Generator().manual_seed(n))
    a = m + m.mT
    results = []
    for device in ("cpu", "cuda"):
        x = a.to(device).requires_grad_()
        with carbon.enabled(strict=True):
            values, vectors = torch.linalg.eigh(x)
            (values.square().sum() + vectors.abs().sum()).backward()
        results.append([as_bits(t.detach().cpu()) for t in (values, vectors, x.grad)])
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
