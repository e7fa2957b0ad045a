"""The host cost carbon.enable adds per op: tiny CPU tensors (4 x 4), where the arithmetic is negligible, so each
row is the Python dispatch (TorchDispatchMode / TorchFunctionMode, carbon's routing) on top of torch's own call;
and one training step of a 12-layer GPT on tiny tensors (host time per step). On a GPU this is the time the host
needs to launch a step's kernels: it is hidden while it stays below the GPU's time for the step.

    python benchmarks/bench_enable_overhead.py [--reps N]

Times are minima over 5 runs of N calls, one thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_enable  # noqa: E402
from _timing import machine_load, print_report  # noqa: E402


def best_us(fn: Callable[[], object], reps: int) -> float:
    for _ in range(min(reps, 200)):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best * 1e6


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    a, b, w, bias = torch.randn(4, 4), torch.randn(4, 4), torch.ones(4), torch.zeros(4)
    cases = {
        "a + b (allow-listed)": lambda: a + b,
        "view + transpose": lambda: a.view(2, 8).transpose(0, 1),
        "a @ b (carbon.mm)": lambda: a @ b,
        "F.linear": lambda: F.linear(a, b, bias),
        "F.layer_norm": lambda: F.layer_norm(a, (4,), w, bias),
        "softmax": lambda: a.softmax(-1),
        "F.gelu tanh": lambda: F.gelu(a, approximate="tanh"),
        "sum": lambda: a.sum(),
    }
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, 1 CPU thread, load {machine_load()}")
    lines = ["| op (4 x 4 float32) | plain us | carbon.enable us | added us |", "|---|---|---|---|"]
    ratios = []
    for name, fn in cases.items():
        plain = best_us(fn, args.reps)
        with carbon.enabled(seed=0):
            enabled = best_us(fn, args.reps)
        lines.append(f"| {name} | {plain:.1f} | {enabled:.1f} | {enabled - plain:.1f} |")
        ratios.append(f"RATIO cpu host {name} carbon/torch = {enabled / plain:.2f}")
    cfg = dict(vocab=64, d=32, heads=4, layers=12, ctx=16, batch=1)
    torch.manual_seed(0)
    model = bench_enable.GPT(**cfg)
    plain_ms, enabled_ms = (best_us(bench_enable.make_step(cfg, "cpu", mode, model), 10) / 1e3
                            for mode in ("fp32", "carbon.enable"))
    lines.append(f"| one step of a 12-layer GPT on tiny tensors (ms) | {plain_ms:.1f} | {enabled_ms:.1f} | "
                 f"{enabled_ms - plain_ms:.1f} |")
    ratios.append(f"RATIO cpu host GPT step carbon/torch = {enabled_ms / plain_ms:.2f}")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
