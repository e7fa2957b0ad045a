"""carbon.layer_norm / carbon.rms_norm against torch's, side by side.

    python benchmarks/bench_norm.py [--device cpu|cuda|all] [--quick] [--threads N]

For each shape and dtype, one run times torch and carbon in interleaved
rounds (benchmarks/_timing.py): forward, and forward + backward (gradients
of x, weight and bias). It prints a table of median times, the ratio
carbon / torch, the forward's effective bandwidth (x read, y written) and,
on CUDA, that bandwidth as a share of a device-to-device copy of the same
bytes measured in the same run.

Targets (issue 3; benchmarks, not tests): CPU carbon <= 2x torch; on an
H200, layer_norm forward at large sizes >= 70% of the copy bandwidth.
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

Case = Tuple[int, int, torch.dtype]  # rows, n, dtype

CPU_CASES: List[Case] = [(4096, 768, torch.float32), (4096, 4096, torch.float32), (16384, 1024, torch.float32),
                         (4096, 768, torch.bfloat16), (4096, 4096, torch.bfloat16)]
CUDA_CASES: List[Case] = [(4096, 768, torch.float32), (16384, 1024, torch.float32), (16384, 4096, torch.float32),
                          (16384, 4096, torch.bfloat16)]
F = torch.nn.functional


def bench_case(device: str, case: Case, budget_s: float, backward: bool) -> List[dict]:
    rows, n, dtype = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn((rows, n), generator=g).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype).to(device)
    b = (0.1 * torch.randn(n, generator=g)).to(dtype).to(device)
    dy = torch.randn((rows, n), generator=g).to(dtype).to(device)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def fwd_bwd(fn, with_bias):
        def run():
            xg.grad = wg.grad = bg.grad = None
            y = fn(xg, (n,), wg, bg) if with_bias else fn(xg, (n,), wg)
            y.backward(dy)
        return run

    ops = [("layer_norm", F.layer_norm, carbon.layer_norm, True), ("rms_norm", F.rms_norm, carbon.rms_norm, False)]
    out = []
    for name, tfn, cfn, with_bias in ops:
        args = (x, (n,), w, b) if with_bias else (x, (n,), w)
        fns = [lambda: tfn(*args), lambda: cfn(*args)]
        if backward:
            fns += [fwd_bwd(tfn, with_bias), fwd_bwd(cfn, with_bias)]
        if device == "cuda":
            fns.append(lambda: x.clone())
        times = time_interleaved(fns, device, budget_s, 20)
        ms = [statistics.median(t) for t in times]
        moved = 2 * x.numel() * x.element_size()
        row = {"op": name, "case": f"{rows}x{n} {str(dtype).replace('torch.', '')}", "torch": ms[0], "carbon": ms[1],
               "gbps": moved / (ms[1] * 1e-3) / 1e9}
        if backward:
            row["torch_fb"], row["carbon_fb"] = ms[2], ms[3]
        if device == "cuda":
            row["copy_share"] = row["gbps"] / (moved / (ms[-1] * 1e-3) / 1e9)
        out.append(row)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="two small cases, forward only")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timing per case and op")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave the default)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    lines = ["| device | op | case | torch fwd ms | carbon fwd ms | carbon/torch | torch fwd+bwd ms | carbon fwd+bwd ms | carbon/torch | carbon fwd GB/s | share of copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        cases = CPU_CASES if device == "cpu" else CUDA_CASES
        if args.quick:
            cases = [(1024, 768, torch.float32), (1024, 768, torch.bfloat16)]
        for case in cases:
            for r in bench_case(device, case, 0.5 if args.quick else args.budget, backward=not args.quick):
                share = f"{100 * r['copy_share']:.0f}%" if "copy_share" in r else "-"
                fb = (f"| {r['torch_fb']:.3f} | {r['carbon_fb']:.3f} | {r['carbon_fb'] / r['torch_fb']:.2f}x "
                      if "torch_fb" in r else "| - | - | - ")
                lines.append(f"| {device} | {r['op']} | {r['case']} | {r['torch']:.3f} | {r['carbon']:.3f} | "
                             f"{r['carbon'] / r['torch']:.2f}x {fb}| {r['gbps']:.1f} | {share} |")
                ratios.append(f"RATIO {device} {r['op']} {r['case']} carbon/torch = {r['carbon'] / r['torch']:.2f}"
                              + (f" (copy share {100 * r['copy_share']:.0f}%, target >= 70%)" if "copy_share" in r else ""))
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
