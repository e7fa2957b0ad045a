"""Convolutions under carbon.enable against torch's, side by side.

    python benchmarks/bench_conv.py [--device cpu|cuda|all] [--budget S]

Forward + backward (input, weight and bias gradients) of F.conv1d / F.conv2d:
torch's own kernels (oneDNN on the CPU, cuDNN on CUDA; TF32 off) vs the same
call under carbon.enable, where each convolution is im2col copies plus
carbon.mm per group (docs/contract.md §3, "Convolutions"). Times are medians
of interleaved rounds (benchmarks/_timing.py).
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import List, Optional

import torch
import torch.nn.functional as F

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, parse_device_args, print_report, time_interleaved  # noqa: E402

# (name, conv, input shape, weight shape, stride, padding, groups)
CASES = [
    ("conv2d 3x3, 64->64 ch, 32x32, batch 8", F.conv2d, (8, 64, 32, 32), (64, 64, 3, 3), 1, 1, 1),
    ("conv2d 3x3 stride 2, 3->32 ch, 64x64, batch 8", F.conv2d, (8, 3, 64, 64), (32, 3, 3, 3), 2, 1, 1),
    ("conv2d depthwise 3x3, 128 ch, 32x32, batch 8", F.conv2d, (8, 128, 32, 32), (128, 1, 3, 3), 1, 1, 128),
    ("conv1d k=3, 256->256 ch, length 512, batch 8", F.conv1d, (8, 256, 512), (256, 256, 3), 1, 1, 1),
]


def bench(device: str, budget_s: float) -> List[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, conv, xs, ws, stride, padding, groups in CASES:
        x = torch.randn(xs, generator=g).to(device).requires_grad_()
        w = (torch.randn(ws, generator=g) * 0.1).to(device).requires_grad_()
        b = torch.randn(ws[0], generator=g).to(device).requires_grad_()
        with torch.no_grad():
            grad = torch.randn_like(conv(x, w, b, stride, padding, 1, groups))

        def step():
            x.grad = w.grad = b.grad = None
            conv(x, w, b, stride, padding, 1, groups).backward(grad)

        def carbon_step():
            with carbon.enabled():
                step()

        times = time_interleaved([step, carbon_step], device, budget_s, 20)
        ms = [statistics.median(t) for t in times]
        rows.append({"case": name, "torch": ms[0], "carbon": ms[1]})
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    args, devices = parse_device_args(__doc__.split("\n")[0], 1.5, argv)
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    lines = ["| device | case (fwd+bwd) | torch ms | carbon.enable ms | carbon/torch |", "|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        for r in bench(device, args.budget):
            ratio = r["carbon"] / r["torch"]
            lines.append(f"| {device} | {r['case']} | {r['torch']:.3f} | {r['carbon']:.3f} | {ratio:.2f}x |")
            ratios.append(f"RATIO {device} conv {r['case']} carbon/torch = {ratio:.2f}")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
