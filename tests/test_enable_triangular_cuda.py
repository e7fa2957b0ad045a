"""torch.linalg.solve_triangular, torch.linalg.cholesky and MultivariateNormal under carbon.enable on a GPU:
the CPU's bits (cuBLAS's trsm and cuSOLVER's potrf would differ). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributions as D

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _spd(batch: int, n: int) -> torch.Tensor:
    m = torch.randn(batch, n, n, generator=torch.Generator().manual_seed(n))
    return m @ m.mT + torch.eye(n)


@pytest.mark.parametrize("n", [3, 17, 64])
def test_cholesky_and_solves_on_the_gpu_equal_the_cpu(n):
    a = _spd(4, n)
    b = torch.randn(4, n, 5, generator=torch.Generator().manual_seed(1))
    with carbon.enabled():
        for device in ("cpu", "cuda"):
            low, info = torch.linalg.cholesky_ex(a.to(device))
            x = torch.linalg.solve_triangular(low, b.to(device), upper=False)
            y = torch.linalg.solve_triangular(low.mT, b.mT.to(device), upper=True, left=False)
            if device == "cpu":
                want = (low, info, x, y)
    assert info.device.type == "cuda" and torch.equal(info.cpu(), want[1])
    for got, w in zip((low, x, y), want[::2] + want[3:]):
        assert got.device.type == "cuda" and torch.equal(as_bits(got.cpu()), as_bits(w))


def test_multivariate_normal_log_prob_on_the_gpu_equals_the_cpu():
    cov = _spd(8, 4)
    loc = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    with carbon.enabled():
        want = D.MultivariateNormal(loc, covariance_matrix=cov).log_prob(x)
        got = D.MultivariateNormal(loc.cuda(), covariance_matrix=cov.cuda()).log_prob(x.cuda())
    assert torch.equal(as_bits(got.cpu()), as_bits(want))
