"""torch.linalg.qr and nn.init.orthogonal_ under carbon.enable on a GPU: the CPU's bits (cuSOLVER's would
differ). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


@pytest.mark.parametrize("shape", [(64, 64), (300, 40), (40, 300)])
def test_qr_on_the_gpu_equals_the_cpu(shape):
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with carbon.enabled():
        want = torch.linalg.qr(a, mode="complete")
        got = torch.linalg.qr(a.cuda(), mode="complete")
    for g, w in zip(got, want):
        assert torch.equal(as_bits(g), as_bits(w))


def test_orthogonal_init_on_the_gpu_equals_the_cpu():
    weights = []
    for device in ("cpu", "cuda"):
        with carbon.enabled(seed=5):
            layer = torch.nn.Linear(128, 64, device=device)
            torch.nn.init.orthogonal_(layer.weight, gain=0.01)
        weights.append(as_bits(layer.weight))
    assert torch.equal(weights[0], weights[1])


def test_geqrf_and_householder_product_on_the_gpu_equal_the_cpu():
    a = torch.randn(3, 50, 20, generator=torch.Generator().manual_seed(1))
    with carbon.enabled():
        want = torch.geqrf(a)
        want_q = torch.linalg.householder_product(*want)
        got = torch.geqrf(a.cuda())
        got_q = torch.linalg.householder_product(*got)
    for g, w in zip(list(got) + [got_q], list(want) + [want_q]):
        assert g.device.type == "cuda" and torch.equal(as_bits(g.cpu()), as_bits(w))
