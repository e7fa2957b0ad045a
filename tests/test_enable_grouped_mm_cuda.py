"""torch._grouped_mm under carbon.enable on a GPU: the CPU's bits, forward and backward. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _step(x, w, offs, g):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = torch._grouped_mm(x, w, offs=offs)
    out.backward(g)
    return [as_bits(t) for t in (out, x.grad, w.grad)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_on_the_gpu_equals_the_cpu(dtype):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 64, generator=gen).to(dtype), torch.randn(8, 64, 48, generator=gen).to(dtype)
    g = torch.randn(300, 48, generator=gen).to(dtype)
    offs = torch.tensor([40, 40, 100, 180, 181, 250, 290, 296], dtype=torch.int32)
    with carbon.enabled():
        want = _step(x, w, offs, g)
        got = _step(x.cuda(), w.cuda(), offs.cuda(), g.cuda())
    for name, a, b in zip(("out", "dx", "dw"), got, want):
        assert torch.equal(a, b), name
