"""The LU family under carbon.enable on a GPU (lu_factor, lu, lu_solve, solve, inv, det, slogdet, cholesky_solve,
cholesky_inverse and their gradients): the CPU's bits (cuSOLVER's and MAGMA's getrf would differ). Skipped without a
GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _outputs(a: torch.Tensor, b: torch.Tensor) -> list:
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    spd = a @ a.mT + torch.eye(a.shape[-1], device=a.device)
    low = torch.linalg.cholesky(spd)
    return [lu, pivots, info, *torch.linalg.lu(a), torch.linalg.lu_solve(lu, pivots, b),
            torch.linalg.lu_solve(lu, pivots, b, adjoint=True), torch.linalg.solve(a, b), torch.linalg.inv(a),
            torch.linalg.det(a), *torch.linalg.slogdet(a), torch.cholesky_solve(b, low), torch.cholesky_inverse(low),
            torch.linalg.lu_factor_ex(a, pivot=False).LU]


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if not got.is_floating_point():
        return torch.equal(got.cpu(), want)
    return torch.equal(as_bits(got.cpu()), as_bits(want))


@pytest.mark.parametrize("n", [3, 17, 48])
def test_the_lu_family_on_the_gpu_equals_the_cpu(n):
    a = torch.randn(4, n, n, generator=torch.Generator().manual_seed(n)) + 2 * torch.eye(n)
    b = torch.randn(4, n, 3, generator=torch.Generator().manual_seed(n + 1))
    with carbon.enabled():
        want = _outputs(a, b)
        got = _outputs(a.cuda(), b.cuda())
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "cuda" and _same(g, w), i


def test_gradients_on_the_gpu_equal_the_cpu():
    a = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(1)) + 2 * torch.eye(5)
    b = torch.randn(3, 5, 2, generator=torch.Generator().manual_seed(2))
    grads = {}
    for device in ("cpu", "cuda"):
        x, y = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        with carbon.enabled(strict=True):
            loss = (torch.linalg.det(x).sum() + torch.linalg.slogdet(x).logabsdet.sum()
                    + torch.linalg.solve(x, y).square().sum() + torch.linalg.inv(x).sum())
            loss.backward()
        grads[device] = (x.grad, y.grad)
    for g, w in zip(grads["cuda"], grads["cpu"]):
        assert _same(g, w)
