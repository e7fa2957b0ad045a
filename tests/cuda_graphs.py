"""Capturing carbon's ops in a CUDA graph, as the *_cuda tests do to show that an op never waits for
the host and that its replays give the CPU's bits."""

from __future__ import annotations

from typing import Callable, Tuple, TypeVar

import torch

T = TypeVar("T")


def capture(fn: Callable[[], T], warmups: int = 1) -> Tuple[torch.cuda.CUDAGraph, T]:
    """Run `fn` `warmups` times on a side stream (lazy initialization and first allocations happen
    outside the capture), then capture one call; returns the graph and that call's outputs, which
    each replay overwrites."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
