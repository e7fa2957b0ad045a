"""Selections among equal values under carbon.enable on a GPU: the CPU's indices and value bits (stable sorts,
the first equal element for order statistics), for small rows (torch's in-register sort) and long ones (its
radix sort). Skipped without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _tied(rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (rows, n), generator=g).to(torch.float32)
    x = torch.where(torch.rand(rows, n, generator=g) < 0.5, x, -x)
    x[torch.rand(rows, n, generator=g) < 0.05] = math.nan
    return x


def _selections(x):
    return {"sort": torch.sort(x, dim=1), "sort desc": torch.sort(x, dim=1, descending=True),
            "topk": torch.topk(x, 17, dim=1), "bottomk": torch.topk(x, 17, dim=1, largest=False),
            "median": x.median(dim=1), "nanmedian": x.nanmedian(dim=1), "kthvalue": x.kthvalue(7, dim=1),
            "cummax": x.cummax(dim=1), "cummin": x.cummin(dim=1), "mode": x.mode(dim=1)}


@pytest.mark.parametrize("n", [100, 3000, 200_000])
def test_selections_on_the_gpu_equal_the_cpu(n):
    x = _tied(3, n, seed=n)
    with carbon.enabled():
        want = _selections(x)
        got = _selections(x.cuda())
    for name in want:
        assert torch.equal(got[name].indices.cpu(), want[name].indices), name
        assert torch.equal(as_bits(got[name].values), as_bits(want[name].values)), name
