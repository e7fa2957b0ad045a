"""carbon.mm with few rows (a decoding step, a small batch) on the CPU, side by side with torch.

    python benchmarks/bench_mm_few_rows.py [--quick]

Products of M rows (M = 1, 8, 32) by GPT-2 small's weights: 768 -> 768
(attention projections), 768 -> 3072 and 3072 -> 768 (the MLP), and the
language-model head 768 -> 50257 for one row. Each in both layouts of the
weight: x @ W with W [K, N] (b's rows contiguous; HF's Conv1D) and x @ W.T
with W [N, K] (b's columns contiguous; nn.Linear, tied embeddings). Columns:
torch's float32 product, carbon's direct few-rows path
(csrc/matmul/matmul_few_rows_cpu.cpp, M <= 32) and carbon's general path on
the same product (CARBON_MATMUL_GENERAL=1: fp64 copy of b with its
statistics, then a BLAS GEMM), timed in interleaved rounds
(benchmarks/_timing.py); medians in ms and the ratios carbon / torch. Both
carbon columns give the same bits (tests/test_mm_few_rows.py); the first
row's result is checked to be close to torch's here as a sanity check.
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

Case = Tuple[int, int, int, str]  # M, K, N, layout ("x@W" or "x@W.T")

CASES: List[Case] = [
    (m, k, n, layout)
    for (k, n) in ((768, 768), (768, 3072), (3072, 768))
    for m in (1, 8, 32)
    for layout in ("x@W", "x@W.T")
] + [(1, 768, 50257, "x@W.T")]
QUICK_CASES: List[Case] = [(1, 768, 768, "x@W"), (8, 768, 768, "x@W.T")]


def general(fn):
    """fn run with carbon's general matmul path (the env switch is read per call)."""
    def run():
        os.environ["CARBON_MATMUL_GENERAL"] = "1"
        try:
            return fn()
        finally:
            del os.environ["CARBON_MATMUL_GENERAL"]
    return run


def bench_case(case: Case, budget_s: float) -> dict:
    M, K, N, layout = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(K, N, generator=g) / K**0.5
    b = w if layout == "x@W" else w.t().contiguous().t()  # same values, columns contiguous
    fns = [lambda: x @ b, lambda: carbon.mm(x, b), general(lambda: carbon.mm(x, b))]
    torch.testing.assert_close(fns[1](), fns[0](), rtol=1e-4, atol=1e-4)
    times = time_interleaved(fns, "cpu", budget_s, 50)
    ms = [statistics.median(t) for t in times]
    return {"case": f"{M}x{K}x{N} {layout}", "torch": ms[0], "direct": ms[1], "general": ms[2]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small cases only")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load {machine_load()}")
    lines = ["| case M x K x N | torch ms | carbon direct ms | carbon general ms | direct / torch | general / torch |",
             "|---|---|---|---|---|---|"]
    ratios = []
    for case in QUICK_CASES if args.quick else CASES:
        r = bench_case(case, 0.3 if args.quick else 1.0)
        d, gen = r["direct"] / r["torch"], r["general"] / r["torch"]
        lines.append(f"| {r['case']} | {r['torch']:.3f} | {r['direct']:.3f} | {r['general']:.3f} | {d:.2f}x | {gen:.2f}x |")
        ratios.append(f"RATIO cpu mm few rows {r['case']} carbon/torch = {d:.2f} (general path {gen:.2f})")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
