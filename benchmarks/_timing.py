"""Timing helpers shared by the benchmarks: every implementation is timed in
the same interleaved rounds, so drifts in machine load hit all alike."""

from __future__ import annotations

import argparse
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


def machine_load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


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
