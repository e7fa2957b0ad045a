"""torch.linalg.matrix_exp under carbon.enable on a GPU: the CPU's bits, forward and backward. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def test_matrix_exp_on_the_gpu_equals_the_cpu():
    a = torch.randn(4, 9, 9, generator=torch.Generator().manual_seed(0)) * torch.tensor([1e-3, 0.3, 3.0, 40.0]).reshape(4, 1, 1)
    results = []
    for device in ("cpu", "cuda"):
        x = a.to(device).requires_grad_()
        with carbon.enabled(strict=True):
            y = torch.linalg.matrix_exp(x)
            y.square().sum().backward()
        results.append((as_bits(y.detach().cpu()), as_bits(x.grad.cpu())))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
