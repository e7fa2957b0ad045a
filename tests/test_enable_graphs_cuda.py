"""CUDA graphs under carbon.enable: routes whose index tensors depend only on shapes (pooling windows,
interpolation weights, fold positions) build them once and reuse the device copy, so after a warm-up call a
step that uses them can be captured, and its replays give the eager step's bits. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _step(x, cols):
    y = F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
    z = F.interpolate(x, size=(11, 5), mode="bilinear", align_corners=False)
    return y.sum(dim=1) + z[:, :, :4, :4].sum(dim=1), F.fold(cols, (7, 7), 2, padding=1)


def test_shape_routes_capture_in_a_cuda_graph_after_a_warm_up():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 7, generator=gen).cuda()
    cols = torch.randn(2, 12, 64, generator=gen).cuda()
    with carbon.enabled():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            want = _step(x, cols)  # warm-up: builds the index tensors on the device
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _step(x, cols)
        x.copy_(torch.randn(2, 3, 7, 7, generator=gen).cuda())
        graph.replay()
        again = _step(x, cols)
    for g, w in zip(captured, again):
        assert torch.equal(as_bits(g), as_bits(w))
