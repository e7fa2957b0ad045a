"""carbon.sum / carbon.mean against torch.sum / torch.mean, side by side.

    python benchmarks/bench_reduce.py [--device cpu|cuda|all] [--quick]

For each shape and reduced dimension, one run times torch and carbon in
interleaved rounds (benchmarks/_timing.py) and prints a table with the
median times, the ratio carbon / torch, the effective bandwidth (bytes read
and written / time) and, on CUDA, that bandwidth as a share of a
device-to-device copy of the same bytes measured in the same run. Every
carbon result is also checked on a sample of outputs against the math.fsum
reference of carbon/reference.py (the exact sum, correctly rounded).

Targets (issue 3, benchmarks not tests): on an H200, sum at large sizes
reaches >= 70% of the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
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
from _timing import machine_load, print_report, time_interleaved  # noqa: E402

from carbon.reference import correctly_rounded_reference, count_correctly_rounded  # noqa: E402

Case = Tuple[Tuple[int, ...], Optional[int], torch.dtype]  # shape, dim (None: all), dtype

CPU_CASES: List[Case] = [
    ((16 * 1024 * 1024,), None, torch.float32),
    ((4096, 4096), 1, torch.float32),
    ((4096, 4096), 0, torch.float32),
    ((16384, 768), -1, torch.float32),
    ((16384, 768), 0, torch.float32),
    ((4096, 4096), 1, torch.bfloat16),
]
CUDA_CASES: List[Case] = [
    ((256 * 1024 * 1024,), None, torch.float32),
    ((65536, 4096), 1, torch.float32),
    ((65536, 4096), 0, torch.float32),
    ((65536, 768), -1, torch.bfloat16),
]


def _exact_check(x: torch.Tensor, dim: Optional[int], out: torch.Tensor, samples: int = 8) -> Tuple[int, int]:
    """How many of `samples` outputs equal the correctly rounded exact sum: a
    row's sum is its product with a column of ones, checked with the fsum
    reference of carbon/reference.py (independent of carbon's kernels)."""
    rows = x.reshape(1, -1) if dim is None else x.movedim(dim, -1).reshape(-1, x.shape[dim])
    picked = torch.linspace(0, rows.shape[0] - 1, min(samples, rows.shape[0])).long()
    ones = torch.ones(rows.shape[1], 1, dtype=rows.dtype)
    idx = [(i, 0) for i in range(len(picked))]
    ref = correctly_rounded_reference(rows[picked], ones, idx, out_dtype=out.dtype)
    return count_correctly_rounded(out.reshape(-1, 1)[picked], idx, ref), len(idx)


def bench_case(device: str, case: Case, budget_s: float) -> dict:
    shape, dim, dtype = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype).to(device)
    dims = () if dim is None else dim
    fns = [
        lambda: torch.sum(x, dims) if dim is not None else torch.sum(x),
        lambda: carbon.sum(x, dim),
        lambda: torch.mean(x, dims) if dim is not None else torch.mean(x),
        lambda: carbon.mean(x, dim),
    ]
    if device == "cuda":
        fns.append(lambda: x.clone())
    times = time_interleaved(fns, device, budget_s, 30)
    ms = [statistics.median(t) for t in times]
    out = carbon.sum(x, dim)
    moved = x.numel() * x.element_size() + out.numel() * out.element_size()
    row = {
        "case": f"{'x'.join(map(str, shape))} dim={dim} {str(dtype).replace('torch.', '')}",
        "torch_sum": ms[0], "carbon_sum": ms[1], "torch_mean": ms[2], "carbon_mean": ms[3],
        "gbps": moved / (ms[1] * 1e-3) / 1e9,
        "exact": _exact_check(x.cpu(), dim, out.cpu()),
    }
    if device == "cuda":
        copy_gbps = 2 * x.numel() * x.element_size() / (ms[4] * 1e-3) / 1e9
        row["copy_share"] = row["gbps"] / copy_gbps
    return row


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="two small CPU cases only")
    args = parser.parse_args(argv)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    lines = ["| device | case | torch.sum ms | carbon.sum ms | carbon/torch | torch.mean ms | carbon.mean ms | carbon/torch | carbon.sum GB/s | share of copy | exact (sample) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        cases = CPU_CASES[:2] if args.quick else (CPU_CASES if device == "cpu" else CUDA_CASES)
        for case in cases:
            r = bench_case(device, case, 0.5 if args.quick else 2.0)
            ok, total = r["exact"]
            share = f"{100 * r['copy_share']:.0f}%" if "copy_share" in r else "-"
            lines.append(
                f"| {device} | {r['case']} | {r['torch_sum']:.3f} | {r['carbon_sum']:.3f} | {r['carbon_sum'] / r['torch_sum']:.2f}x "
                f"| {r['torch_mean']:.3f} | {r['carbon_mean']:.3f} | {r['carbon_mean'] / r['torch_mean']:.2f}x "
                f"| {r['gbps']:.1f} | {share} | {f'{ok}/{total}' if total else '-'} |")
            ratios.append(f"RATIO {device} sum {r['case']} carbon/torch = {r['carbon_sum'] / r['torch_sum']:.2f}"
                          + (f" (copy share {100 * r['copy_share']:.0f}%, target >= 70%)" if "copy_share" in r else ""))
            if total and ok != total:
                print(f"ERROR: carbon.sum not correctly rounded for {r['case']} on {device}")
                return 2
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
