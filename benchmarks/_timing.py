"""Timing helpers shared by the benchmarks: every implementation is timed in
the same interleaved rounds, so drifts in machine load hit all alike.

Importing this module also keeps glibc's heap steady (`steady_heap`): with
glibc's defaults a freed output of a few MB is often handed back to the
kernel, and the next allocation of that size touches fresh pages -- ~1 us per
4 KiB page, 3 ms for a 4096 x 768 float32 output, more than the layer_norm
that fills it. Which side of a comparison pays depends on the order of frees
(measured: carbon's layer_norm forward 4096 x 768 at a median 4.9 ms when
timed after torch's, 1.0 ms alone), so the benchmarks time kernels with the
memory kept by the process instead, for torch and carbon alike.
CARBON_BENCH_DEFAULT_MALLOC=1 keeps glibc's defaults.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from typing import Callable, List, Optional, Tuple

import torch


def timer(device: str) -> Callable[[Callable[[], object]], float]:
    def once(fn: Callable[[], object]) -> float:
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return once


def time_interleaved(fns: List[Callable[[], object]], device: str, budget_s: float, max_reps: int) -> List[List[float]]:
    """Times in ms of each fn over the same rounds: one warm-up call each, then
    rounds that call every fn once in turn (so slow drifts in machine load hit
    all of them alike), as many rounds as fit in ~budget_s (3 to max_reps)."""
    once = timer(device)
    for fn in fns:
        once(fn)  # warm-up (allocator, BLAS handles, kernel selection)
    probe = sum(once(fn) for fn in fns)
    reps = int(max(3, min(max_reps, budget_s * 1e3 / max(probe, 1e-3))))
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(times, fns):
            t.append(once(fn))
    return times


def steady_heap() -> bool:
    """Ask glibc never to trim its heap and never to serve an allocation by mmap (so freed memory is reused
    without page faults); False where the C library is not glibc, or CARBON_BENCH_DEFAULT_MALLOC=1."""
    if os.environ.get("CARBON_BENCH_DEFAULT_MALLOC") == "1":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return mallopt(m_trim_threshold, 2**31 - 1) == 1 and mallopt(m_mmap_max, 0) == 1


_STEADY_HEAP = steady_heap()


def machine_load() -> str:
    """The load averages, and whether the heap is kept (printed in each benchmark's header)."""
    try:
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return load + (" (heap kept: glibc trim and mmap off)" if _STEADY_HEAP else " (glibc malloc defaults)")


def print_report(lines: List[str], ratios: List[str]) -> int:
    """Print a benchmark's table, then its RATIO lines (the summary device_check
    greps); returns 0, the benchmark's exit status."""
    print("\n".join(lines))
    print()
    print("\n".join(ratios))
    return 0


def cpu_times(fn: Callable[[], object], reps: int) -> List[float]:
    """Seconds of CPU time (time.process_time: steadier than the wall clock on a shared machine) of reps
    calls of fn, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return times


def parse_device_args(description: str, budget: float, argv: Optional[List[str]] = None) -> Tuple[argparse.Namespace, List[str]]:
    """The common command line (--device cpu|cuda|all, --budget S): the arguments and the devices to run on (CUDA
    only where present)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--budget", type=float, default=budget, help="seconds of timing per case")
    args = parser.parse_args(argv)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    return args, [d for d in devices if d == "cpu" or torch.cuda.is_available()]
