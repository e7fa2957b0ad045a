"""carbon.optim steps and carbon.nn.utils.clip_grad_norm_ against torch's
foreach and fused implementations, on a GPT-2-small-shaped parameter set.

    python benchmarks/bench_optim.py [--device cpu|cuda|all] [--budget S]
        [--adam-dtypes float32,bfloat16,float16] [--amsgrad]
    python benchmarks/bench_optim.py --per-element [--sizes N,N] [--reps R]

CUDA: the full GPT-2 small shapes (~124M float32 parameters); CPU: the same
layer shapes with 2 layers and an 8192-token vocabulary (~20M). Each row
times one step (or one clip) of every implementation in interleaved rounds
(benchmarks/_timing.py) and prints median ms and carbon / best-torch.
Target (issue 4): carbon <= 1.5x torch's fused / foreach step.

--per-element: one CPU thread, ns per element of one AdamW step
(``opt.step()``, Python included) on one tensor of each size, for float32 /
bfloat16 / float16 parameters, amsgrad off and on: torch fused, torch
foreach and carbon on the same data and sizes in one process, timed in
interleaved rounds by CPU time (time.process_time, steadier than the wall
clock on a shared machine); medians. torch keeps its states in the
parameter's dtype, carbon in float32 (more bytes per element for 16-bit
parameters).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import List, Optional

import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, time_interleaved  # noqa: E402


def gpt2_shapes(vocab: int, layers: int, d: int = 768, ctx: int = 1024) -> List[tuple]:
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


def make_params(shapes, device, dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(0)  # generated on the device: fast for 124M
    params = [torch.nn.Parameter((0.02 * torch.randn(s, generator=g, device=device)).to(dtype)) for s in shapes]
    for p in params:
        p.grad = (0.01 * torch.randn(p.shape, generator=g, device=device)).to(dtype)
    return params


def variants(kind: str, device: str, amsgrad: bool = False):
    """(label, optimizer class, kwargs) for torch foreach, torch fused, carbon."""
    hp = dict(lr=1e-4, weight_decay=0.1, amsgrad=amsgrad) if kind == "AdamW" else dict(lr=1e-3, momentum=0.9)
    out = [("torch foreach", getattr(torch.optim, kind), dict(hp, foreach=True))]
    if device == "cuda" or kind in ("AdamW", "SGD"):
        out.append(("torch fused", getattr(torch.optim, kind), dict(hp, fused=True)))
    out.append(("carbon", getattr(carbon.optim, kind), hp))
    return out


def bench(device: str, budget_s: float, adam_cases=(("float32", False),)) -> List[str]:
    shapes = gpt2_shapes(50257, 12) if device == "cuda" else gpt2_shapes(8192, 2)
    n = sum(torch.Size(s).numel() for s in shapes)
    rows = []
    cases = [("AdamW", dtype, amsgrad) for dtype, amsgrad in adam_cases] + [("SGD", "float32", False)]
    for kind, dtype, amsgrad in cases:
        labels, fns = [], []
        for label, cls, kw in variants(kind, device, amsgrad):
            try:
                params = make_params(shapes, device, getattr(torch, dtype))
                opt = cls(params, **kw)
                opt.step()  # allocate states
            except (RuntimeError, ValueError) as e:  # e.g. fused not available here
                print(f"skip {kind} {label}: {e}")
                continue
            labels.append(label)
            fns.append(opt.step)
        times = time_interleaved(fns, device, budget_s, 30)
        ms = [statistics.median(t) for t in times]
        suffix = "" if (dtype, amsgrad) == ("float32", False) else f" ({dtype}{', amsgrad' if amsgrad else ''})"
        rows.append((f"{kind} step{suffix}", labels, ms))
        del fns
    # gradient clipping
    params = make_params(shapes, device)
    fns = [lambda: torch.nn.utils.clip_grad_norm_(params, 1e9, foreach=True),
           lambda: carbon.nn.utils.clip_grad_norm_(params, 1e9)]
    times = time_interleaved(fns, device, budget_s, 30)
    rows.append(("clip_grad_norm_", ["torch foreach", "carbon"], [statistics.median(t) for t in times]))

    lines = [f"device {device}, {len(shapes)} tensors, {n / 1e6:.1f}M parameters",
             "| device | op | torch foreach ms | torch fused ms | carbon ms | carbon / best torch |",
             "|---|---|---|---|---|---|"]
    ratios = []
    for op, labels, ms in rows:
        by = dict(zip(labels, ms))
        best = min(v for k, v in by.items() if k != "carbon")
        fe = by.get("torch foreach")
        fu = by.get("torch fused")
        lines.append(f"| {device} | {op} | {fe:.2f} | {'-' if fu is None else f'{fu:.2f}'} | {by['carbon']:.2f} | "
                     f"{by['carbon'] / best:.2f}x |")
        ratios.append(f"RATIO {device} optim {op} carbon/best-torch = {by['carbon'] / best:.2f} (target <= 1.5)")
    return lines + [""] + ratios


def per_element(sizes: List[int], reps: int, dtypes: List[str]) -> List[str]:
    """One thread, ns per element of one AdamW step (lr 1e-4, wd 0.1; p ~
    0.02 N, g ~ 0.01 N), torch fused / foreach / carbon interleaved."""
    torch.set_num_threads(1)
    kinds = [("torch fused", torch.optim.AdamW, dict(fused=True)),
             ("torch foreach", torch.optim.AdamW, dict(foreach=True)),
             ("carbon", carbon.optim.AdamW, {})]
    lines = [f"one thread, ns per element (CPU time, median of {reps} interleaved rounds)",
             "| dtype | amsgrad | elements | torch fused | torch foreach | carbon | carbon / torch fused |",
             "|---|---|---|---|---|---|---|"]
    for dtype in (getattr(torch, d) for d in dtypes):
        for amsgrad in (False, True):
            for n in sizes:
                gen = torch.Generator().manual_seed(0)
                p0 = 0.02 * torch.randn(n, generator=gen)
                g0 = 0.01 * torch.randn(n, generator=gen)
                # calls per timed sample: ~4M elements' worth, so that the
                # clock's resolution and the call overhead's jitter stay small
                calls = max(1, (1 << 22) // n)
                steps = []
                for _, cls, kw in kinds:
                    # own copies: .to(float32) of a float32 tensor is the same tensor
                    p = torch.nn.Parameter(p0.to(dtype).clone())
                    p.grad = g0.to(dtype).clone()
                    opt = cls([p], lr=1e-4, weight_decay=0.1, amsgrad=amsgrad, **kw)
                    opt.step()  # allocate the states
                    steps.append(opt.step)
                times: List[List[float]] = [[] for _ in kinds]
                for _ in range(reps):
                    for t, step in zip(times, steps):
                        t0 = time.process_time()
                        for _ in range(calls):
                            step()
                        t.append((time.process_time() - t0) / calls / n * 1e9)
                ns = [statistics.median(t) for t in times]
                lines.append(f"| {str(dtype).replace('torch.', '')} | {'on' if amsgrad else 'off'} | {n} | "
                             f"{ns[0]:.2f} | {ns[1]:.2f} | {ns[2]:.2f} | {ns[2] / ns[0]:.2f}x |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per row")
    parser.add_argument("--adam-dtypes", default=None,
                        help="parameter dtypes of the AdamW rows (comma-separated: float32,bfloat16,float16; "
                             "default float32, and all three with --per-element)")
    parser.add_argument("--amsgrad", action="store_true", help="AdamW rows with amsgrad=True as well")
    parser.add_argument("--per-element", action="store_true",
                        help="one-thread ns per element table of the AdamW step (CPU) instead")
    parser.add_argument("--sizes", default="65536,4194304", help="--per-element: tensor sizes")
    parser.add_argument("--reps", type=int, default=9, help="--per-element: interleaved rounds")
    args = parser.parse_args(argv)
    if args.per_element:
        print(f"torch {torch.__version__}, carbon {carbon.__version__}, load {machine_load()}")
        dtypes = (args.adam_dtypes or "float32,bfloat16,float16").split(",")
        print("\n".join(per_element([int(x) for x in args.sizes.split(",")], args.reps, dtypes)))
        print(f"load {machine_load()}")
        return 0
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load {machine_load()}")
    adam_dtypes = (args.adam_dtypes or "float32").split(",")
    adam_cases = [(d, a) for d in adam_dtypes for a in ((False, True) if args.amsgrad else (False,))]
    for device in devices:
        print("\n".join(bench(device, args.budget, adam_cases)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
