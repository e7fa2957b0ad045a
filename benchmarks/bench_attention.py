"""carbon.scaled_dot_product_attention against torch's math attention, side by side.

    python benchmarks/bench_attention.py [--device cpu|cuda|all] [--quick] [--threads N]

For each shape, one run times forward and forward+backward of torch's math
attention (torch.nn.attention.SDPBackend.MATH: the same composition, matmul
+ softmax + matmul, without fused kernels) and of carbon's, in interleaved
rounds (benchmarks/_timing.py), and prints medians and the ratio carbon /
torch. Also printed: whether carbon's output equals its own output for the
first sequence alone (batch invariance) — torch's column shows the same
check for torch. The table ends with one RATIO line per case (the lines
scripts/device_check.sh's summary collects).

Targets (issue 3, benchmarks not tests): forward+backward <= 3x torch's math
attention in fp32 on an H200, <= 2x on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, print_report, time_interleaved  # noqa: E402

Case = Tuple[int, int, int, int, torch.dtype]  # batch, heads, sequence, head dim, dtype

CPU_CASES: List[Case] = [(4, 12, 256, 64, torch.float32), (1, 12, 1024, 64, torch.float32), (4, 12, 256, 64, torch.bfloat16)]
CUDA_CASES: List[Case] = [(16, 12, 1024, 64, torch.float32), (8, 16, 2048, 128, torch.float32), (16, 12, 1024, 64, torch.bfloat16)]


def torch_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def carbon_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return carbon.scaled_dot_product_attention(q, k, v, is_causal=True)


def forward_backward(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = fn(qq, kk, vv)
        return torch.autograd.grad(out, (qq, kk, vv), g)

    return run


def batch_invariant(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    with torch.no_grad():
        return torch.equal(fn(q, k, v)[:1], fn(q[:1], k[:1], v[:1]))


# forward+backward targets of the module docstring (fp32), shown on the RATIO lines
TARGETS = {"cpu": 2.0, "cuda": 3.0}


def bench(device: str, cases: List[Case], budget_s: float) -> Tuple[List[List[str]], List[str]]:
    """The table's rows and the RATIO lines of the cases on `device`."""
    rows, ratios = [], []
    for B, H, T, D, dtype in cases:
        gen = torch.Generator().manual_seed(0)
        q, k, v, g = (torch.randn(B, H, T, D, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
        with torch.no_grad():
            fwd = time_interleaved([lambda: torch_math(q, k, v), lambda: carbon_attention(q, k, v)], device, budget_s, 20)
        both = time_interleaved(
            [forward_backward(torch_math, q, k, v, g), forward_backward(carbon_attention, q, k, v, g)], device, budget_s, 10
        )
        tf, cf = (statistics.median(t) for t in fwd)
        tb, cb = (statistics.median(t) for t in both)
        rows.append([
            device, f"{B}x{H}x{T}x{D}", str(dtype).replace("torch.", ""),
            f"{tf:.2f}", f"{cf:.2f}", f"{cf / tf:.2f}x", f"{tb:.2f}", f"{cb:.2f}", f"{cb / tb:.2f}x",
            "yes" if batch_invariant(torch_math, q, k, v) else "no", "yes" if batch_invariant(carbon_attention, q, k, v) else "no",
        ])
        target = f" (target <= {TARGETS[device]:g})" if dtype == torch.float32 else ""
        ratios.append(f"RATIO {device} attention causal {B}x{H}x{T}x{D} {str(dtype).replace('torch.', '')} "
                      f"carbon/torch_math fwd = {cf / tf:.2f}, fwd+bwd = {cb / tb:.2f}{target}")
    return rows, ratios


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="the first case per device, short budget")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads(N) first (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    budget = 1.0 if args.quick else 4.0
    rows: List[List[str]] = []
    ratios: List[str] = []
    devices = [d for d in ("cpu", "cuda") if args.device in (d, "all") and (d == "cpu" or torch.cuda.is_available())]
    for device in devices:
        cases = CPU_CASES if device == "cpu" else CUDA_CASES
        device_rows, device_ratios = bench(device, cases[:1] if args.quick else cases, budget)
        rows += device_rows
        ratios += device_ratios
    header = ["device", "BxHxTxD", "dtype", "torch fwd ms", "carbon fwd ms", "ratio",
              "torch f+b ms", "carbon f+b ms", "ratio", "torch batch-inv", "carbon batch-inv"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print(f"causal attention, torch {torch.__version__}, threads {torch.get_num_threads()}, load {machine_load()}")
    return print_report(["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header] + rows], ratios)


if __name__ == "__main__":
    sys.exit(main())
