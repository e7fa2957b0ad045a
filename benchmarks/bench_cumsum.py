"""carbon's exact prefix sums (torch.ops.carbon.cumsum_rows, what torch.cumsum runs under carbon.enable)
against torch.cumsum, side by side.

    python benchmarks/bench_cumsum.py [--device cpu|cuda|all] [--budget S]

Cases: one row of a GPT-2 vocabulary (50257: top-p sampling's cumsum of sorted probabilities, batch 1) and 64
such rows, a large square tensor, and many short rows (128: the one-thread-per-row kernel on CUDA; longer rows
run in chunks of 64 there). Times are medians of interleaved rounds (benchmarks/_timing.py). On CUDA the last
column says whether carbon's GPU bits equal its CPU bits (the contract). No target: the table shows what the
exact prefix costs.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import List, Optional, Tuple

import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, parse_device_args, print_report, time_interleaved  # noqa: E402

Case = Tuple[Tuple[int, int], torch.dtype]
CPU_CASES: List[Case] = [((1, 50257), torch.float32), ((64, 4096), torch.float32), ((4096, 128), torch.bfloat16)]
CUDA_CASES: List[Case] = [((1, 50257), torch.float32), ((64, 50257), torch.float32), ((4096, 4096), torch.float32),
                          ((65536, 128), torch.bfloat16)]


def bench_case(device: str, case: Case, budget_s: float) -> Tuple[str, float, float, str]:
    shape, dtype = case
    g = torch.Generator().manual_seed(0)
    x = torch.rand(shape, generator=g).to(dtype)
    x = x / x.float().sum(-1, keepdim=True).to(dtype)  # probability-like rows
    xd = x.to(device)
    times = time_interleaved([lambda: torch.cumsum(xd, -1), lambda: torch.ops.carbon.cumsum_rows(xd, None)],
                             device, budget_s, 30)
    same = "-"
    if device == "cuda":
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        gpu, cpu = torch.ops.carbon.cumsum_rows(xd, None).cpu(), torch.ops.carbon.cumsum_rows(x, None)
        same = "yes" if torch.equal(gpu.view(bits), cpu.view(bits)) else "NO"
    name = f"{shape[0]}x{shape[1]} {str(dtype).replace('torch.', '')}"
    return name, statistics.median(times[0]), statistics.median(times[1]), same


def main(argv: Optional[List[str]] = None) -> int:
    args, devices = parse_device_args(__doc__.split("\n")[0], 1.0, argv)
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load {machine_load()}")
    lines = ["| device | rows x n | torch.cumsum ms | carbon ms | carbon/torch | GPU bits = CPU bits |",
             "|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        for case in CPU_CASES if device == "cpu" else CUDA_CASES:
            name, torch_ms, carbon_ms, same = bench_case(device, case, args.budget)
            lines.append(f"| {device} | {name} | {torch_ms:.3f} | {carbon_ms:.3f} | {carbon_ms / torch_ms:.2f}x | {same} |")
            ratios.append(f"RATIO {device} cumsum {name} carbon/torch = {carbon_ms / torch_ms:.2f}"
                          + (f" (GPU bits = CPU bits: {same})" if device == "cuda" else ""))
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
