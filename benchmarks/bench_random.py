"""carbon's random numbers against torch's, side by side.

    python benchmarks/bench_random.py [--device cpu|cuda|all] [--quick] [--budget S] [--threads N]

For each size and dtype, one run times torch and carbon in interleaved rounds
(benchmarks/_timing.py): rand, randn, dropout forward, dropout forward +
backward, bernoulli (scalar p), trunc_normal (torch.nn.init.trunc_normal_).
It prints a table of median times and the ratio carbon / torch.
(Carbon's draws are the same bits on every device; torch's are not.)
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

Case = Tuple[int, torch.dtype]
CPU_CASES: List[Case] = [(1 << 20, torch.float32), (1 << 22, torch.float32), (1 << 22, torch.bfloat16)]
CUDA_CASES: List[Case] = [(1 << 22, torch.float32), (1 << 26, torch.float32), (1 << 26, torch.bfloat16)]
F = torch.nn.functional


def bench_case(device: str, case: Case, budget_s: float) -> List[dict]:
    n, dtype = case
    x = torch.randn(n).to(dtype).to(device)
    dy = torch.randn(n).to(dtype).to(device)
    xg = x.clone().requires_grad_()
    gen = carbon.Generator(seed=1)

    def fwd_bwd(fn):
        def run():
            xg.grad = None
            fn(xg).backward(dy)
        return run

    ops = [
        ("rand", lambda: torch.rand(n, dtype=dtype, device=device), lambda: carbon.rand(n, dtype=dtype, device=device, generator=gen)),
        ("randn", lambda: torch.randn(n, dtype=dtype, device=device), lambda: carbon.randn(n, dtype=dtype, device=device, generator=gen)),
        ("dropout", lambda: F.dropout(x, 0.1), lambda: carbon.dropout(x, 0.1, generator=gen)),
        ("dropout fwd+bwd", fwd_bwd(lambda t: F.dropout(t, 0.1)), fwd_bwd(lambda t: carbon.dropout(t, 0.1, generator=gen))),
        ("bernoulli", lambda: torch.bernoulli(x, 0.3), lambda: carbon.bernoulli(x, 0.3, generator=gen)),
        ("trunc_normal", lambda: torch.nn.init.trunc_normal_(torch.empty(n, dtype=dtype, device=device), 0.0, 0.02, -0.04, 0.04),
         lambda: carbon.random.trunc_normal((n,), 0.0, 0.02, -0.04, 0.04, generator=gen, dtype=dtype, device=device)),
    ]
    out = []
    for name, tfn, cfn in ops:
        times = time_interleaved([tfn, cfn], device, budget_s, 30)
        ms = [statistics.median(t) for t in times]
        out.append({"op": name, "case": f"{n} {str(dtype).replace('torch.', '')}", "torch": ms[0], "carbon": ms[1]})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="one small case")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per case and op")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    lines = ["| device | op | n dtype | torch ms | carbon ms | carbon/torch |", "|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        cases = CPU_CASES if device == "cpu" else CUDA_CASES
        if args.quick:
            cases = cases[:1]
        for case in cases:
            for r in bench_case(device, case, 0.3 if args.quick else args.budget):
                ratio = r["carbon"] / r["torch"]
                lines.append(f"| {device} | {r['op']} | {r['case']} | {r['torch']:.3f} | {r['carbon']:.3f} | {ratio:.2f}x |")
                ratios.append(f"RATIO {device} {r['op']} {r['case']} carbon/torch = {ratio:.2f}")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
