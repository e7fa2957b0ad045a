"""Copies to repeated indices under carbon.enable on a GPU: the CPU's last-write-wins result, on every run
(without carbon, CUDA's winners vary from run to run). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 1000, (400_000,), generator=g), torch.randn(400_000, 8, generator=g),
            torch.randint(0, 64, (512, 256), generator=g), torch.randn(512, 256, generator=g))


def _writes(index, values, scatter_index, src, device):
    rows = torch.zeros(1000, 8, device=device)
    rows[index.to(device)] = values.to(device)
    cols = torch.zeros(64, 256, device=device).scatter(0, scatter_index.to(device), src.to(device))
    return rows.cpu(), cols.cpu()


def test_repeated_writes_on_the_gpu_equal_the_cpu_every_run():
    data = _data(0)
    with carbon.enabled():
        want = _writes(*data, "cpu")
        for run in range(5):
            got = _writes(*data, "cuda")
            for g, w, name in zip(got, want, ("index_put", "scatter")):
                assert torch.equal(g, w), f"{name}, run {run}"
