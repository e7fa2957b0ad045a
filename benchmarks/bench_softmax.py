"""carbon.softmax / log_softmax / cross_entropy against torch, side by side.

    python benchmarks/bench_softmax.py [--device cpu|cuda|all] [--quick]

For each case one run times torch and carbon in interleaved rounds
(benchmarks/_timing.py) and prints one table: median times of the forward
pass and of forward + backward, and the ratios carbon / torch. Every carbon
result is also checked to be close to torch's (a sanity check; the bits are
tested in tests/test_softmax.py and tests/test_cross_entropy.py).

Shapes: softmax and log_softmax over the last dim of [4096, 1024],
[rows, 50257] (a GPT-2 vocabulary) and [B*12*256, 256] (attention scores),
float32, and the attention-score shape in bfloat16 too; cross_entropy over [N, 50257] logits, float32 and bfloat16. The CPU
uses fewer rows for the two largest shapes (see CPU_CASES).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, print_report, time_interleaved  # noqa: E402

Case = Tuple[str, Tuple[int, ...], torch.dtype]  # op, shape, dtype

CPU_CASES: List[Case] = [
    ("softmax", (4096, 1024), torch.float32),
    ("log_softmax", (4096, 1024), torch.float32),
    ("softmax", (128, 50257), torch.float32),
    ("log_softmax", (128, 50257), torch.float32),
    ("softmax", (4 * 12 * 256, 256), torch.float32),
    ("log_softmax", (4 * 12 * 256, 256), torch.float32),
    ("softmax", (4 * 12 * 256, 256), torch.bfloat16),
    ("log_softmax", (4 * 12 * 256, 256), torch.bfloat16),
    ("cross_entropy", (256, 50257), torch.float32),
    ("cross_entropy", (256, 50257), torch.bfloat16),
]
CUDA_CASES: List[Case] = [
    ("softmax", (4096, 1024), torch.float32),
    ("log_softmax", (4096, 1024), torch.float32),
    ("softmax", (1024, 50257), torch.float32),
    ("log_softmax", (1024, 50257), torch.float32),
    ("softmax", (64 * 12 * 256, 256), torch.float32),
    ("log_softmax", (64 * 12 * 256, 256), torch.float32),
    ("softmax", (64 * 12 * 256, 256), torch.bfloat16),
    ("log_softmax", (64 * 12 * 256, 256), torch.bfloat16),
    ("cross_entropy", (4096, 50257), torch.float32),
    ("cross_entropy", (4096, 50257), torch.bfloat16),
]
QUICK_CASES: List[Case] = [
    ("softmax", (1024, 1024), torch.float32),
    ("cross_entropy", (64, 50257), torch.bfloat16),
]

TORCH_OPS = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}
CARBON_OPS = {"softmax": carbon.softmax, "log_softmax": carbon.log_softmax}


def _fns(op: str, x: torch.Tensor, target: torch.Tensor, grad: torch.Tensor) -> Tuple[List[Callable[[], object]], list]:
    """[torch fwd, carbon fwd, torch fwd+bwd, carbon fwd+bwd], and the forward outputs for a sanity check."""
    if op == "cross_entropy":
        tfwd = lambda inp: F.cross_entropy(inp, target)  # noqa: E731
        cfwd = lambda inp: carbon.cross_entropy(inp, target)  # noqa: E731
        gout = None
    else:
        tfwd = lambda inp: TORCH_OPS[op](inp, -1)  # noqa: E731
        cfwd = lambda inp: CARBON_OPS[op](inp, -1)  # noqa: E731
        gout = grad
    xt, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()

    def train(fwd, leaf):
        def step():
            leaf.grad = None
            out = fwd(leaf)
            out.backward(gout)
        return step

    with torch.no_grad():
        outs = [tfwd(x), cfwd(x)]
    fns = [lambda: tfwd(x), lambda: cfwd(x), train(tfwd, xt), train(cfwd, xc)]
    return fns, outs


def bench_case(device: str, case: Case, budget_s: float) -> dict:
    op, shape, dtype = case
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(device)
    target = torch.randint(0, shape[-1], shape[:1], generator=g).to(device)
    grad = torch.randn(shape, generator=g).to(dtype).to(device)
    fns, outs = _fns(op, x, target, grad)
    # torch's 16-bit log_softmax rounds its intermediates to the format (it
    # gives 0 where the exact value is -0.0025), hence the absolute tolerance
    # of a few bfloat16 ulps of 1 there.
    wide = dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(outs[1].float(), outs[0].float(), rtol=1e-4 if wide else 2e-2,
                                   atol=1e-5 if wide else 2e-2)
    times = time_interleaved(fns, device, budget_s, 20)
    ms = [statistics.median(t) for t in times]
    return {"case": f"{op} {'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')}",
            "torch_fwd": ms[0], "carbon_fwd": ms[1], "torch_train": ms[2], "carbon_train": ms[3]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="two small CPU cases only")
    args = parser.parse_args(argv)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load {machine_load()}" + (f", {torch.cuda.get_device_name()}" if "cuda" in devices else ""))
    lines = ["| device | case | torch fwd ms | carbon fwd ms | carbon/torch | torch fwd+bwd ms | carbon fwd+bwd ms | carbon/torch |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        cases = QUICK_CASES if args.quick else (CPU_CASES if device == "cpu" else CUDA_CASES)
        for case in cases:
            r = bench_case(device, case, 0.5 if args.quick else (1.5 if device == "cpu" else 2.0))
            fwd, train = r["carbon_fwd"] / r["torch_fwd"], r["carbon_train"] / r["torch_train"]
            lines.append(f"| {device} | {r['case']} | {r['torch_fwd']:.3f} | {r['carbon_fwd']:.3f} | {fwd:.2f}x "
                         f"| {r['torch_train']:.3f} | {r['carbon_train']:.3f} | {train:.2f}x |")
            ratios.append(f"RATIO {device} {r['case']} carbon/torch fwd = {fwd:.2f}, fwd+bwd = {train:.2f}")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
