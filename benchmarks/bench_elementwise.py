"""carbon's elementwise math against torch's, side by side.

    python benchmarks/bench_elementwise.py [--device cpu|cuda|all] [--quick] [--float64]

For each function and size, one run times torch and carbon in interleaved
rounds (benchmarks/_timing.py) and prints one table: median times, the ratio
carbon / torch, carbon's throughput in elements/s, and how many of a sample of
carbon's float32 outputs equal the float32 rounding of Python's math.* in
fp64 away from midpoints (a sanity check, not the accuracy proof: see
scripts/elementwise_ulp.py and tests/test_elementwise.py).

--float64 times the float64 functions instead (exp, log, sin, cos,
sqrt (IEEE's root) and pow = 10000 ** x: double-double cores, contract §6 "float64"); their sample
column counts agreement with Python's math.* (the platform libm, not an
oracle: tests/test_elementwise_binary64.py checks against mpmath).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional, Tuple

import mpmath  # ships with torch's sympy: digamma and trigamma references for the sample column
import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, print_report, time_interleaved  # noqa: E402

F = torch.nn.functional
# name: (carbon fn, torch fn, fp64 reference on one float, input transform)
FUNCTIONS: Dict[str, Tuple[Callable, Callable, Callable]] = {
    "exp": (carbon.exp, torch.exp, math.exp),
    "log": (carbon.log, torch.log, math.log),
    "tanh": (carbon.tanh, torch.tanh, math.tanh),
    "sigmoid": (carbon.sigmoid, torch.sigmoid, lambda v: 1 / (1 + math.exp(-v))),
    "erf": (carbon.erf, torch.erf, math.erf),
    "gelu": (carbon.gelu, F.gelu, lambda v: v * 0.5 * math.erfc(-v / math.sqrt(2))),
    "gelu_tanh": (lambda x: carbon.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
                  lambda v: v / (1 + math.exp(-2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))),
    "silu": (carbon.silu, F.silu, lambda v: v / (1 + math.exp(-v))),
    "sin": (carbon.sin, torch.sin, math.sin),
    "cos": (carbon.cos, torch.cos, math.cos),
    "lgamma": (carbon.lgamma, torch.lgamma, math.lgamma),
    "digamma": (carbon.digamma, torch.digamma, lambda v: float(mpmath.psi(0, v))),
    "trigamma": (carbon.trigamma, lambda x: torch.polygamma(1, x), lambda v: float(mpmath.psi(1, v))),
}
FLOAT64_FUNCTIONS: Dict[str, Tuple[Callable, Callable, Callable]] = {
    "exp": (carbon.exp, torch.exp, math.exp),
    "log": (carbon.log, torch.log, math.log),
    "sin": (carbon.sin, torch.sin, math.sin),
    "cos": (carbon.cos, torch.cos, math.cos),
    "pow": (lambda x: torch.ops.carbon.pow_scalar_tensor(10000.0, x), lambda x: torch.pow(10000.0, x),
            lambda v: math.pow(10000.0, v)),
    "sqrt": (torch.ops.carbon.sqrt, torch.sqrt, math.sqrt),  # IEEE's root: carbon.sqrt is exact by construction
}
CPU_SIZES: List[Tuple[int, ...]] = [(1 << 16,), (1 << 22,), (4096, 3072)]
FLOAT64_SIZES: List[Tuple[int, ...]] = [(1 << 16,), (1 << 20,)]
CUDA_SIZES: List[Tuple[int, ...]] = [(4096, 3072), (1 << 26,)]


def _sample_check(name: str, x: torch.Tensor, out: torch.Tensor, samples: int = 64) -> Tuple[int, int]:
    ref = FUNCTIONS[name][2]
    xs, ys = x.flatten().cpu(), out.flatten().cpu()
    idx = torch.linspace(0, xs.numel() - 1, samples).long().tolist()
    ok = total = 0
    for i in idx:
        v = xs[i].item()
        r = ref(v)
        want = torch.tensor(r, dtype=torch.float64)
        lo, hi = want.to(torch.float32), torch.tensor(r * (1 + 2**-30), dtype=torch.float64).to(torch.float32)
        if lo.item() != hi.item() or lo.item() != torch.tensor(r * (1 - 2**-30), dtype=torch.float64).to(torch.float32).item():
            continue  # too close to a midpoint for an fp64 reference to decide
        total += 1
        ok += int(ys[i].item() == lo.item())
    return ok, total


def _sample_agreement_float64(name: str, x: torch.Tensor, out: torch.Tensor, samples: int = 64) -> Tuple[int, int]:
    ref = FLOAT64_FUNCTIONS[name][2]
    xs, ys = x.flatten().cpu(), out.flatten().cpu()
    idx = torch.linspace(0, xs.numel() - 1, samples).long().tolist()
    return sum(int(ys[i].item() == ref(xs[i].item())) for i in idx), len(idx)


def bench(device: str, name: str, shape: Tuple[int, ...], budget_s: float, float64: bool = False) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64 if float64 else torch.float32) * 3
    if name in ("log", "sqrt"):
        x = x.abs() + 1e-3
    if name in ("lgamma", "digamma", "trigamma"):
        x = x.abs() + 0.1  # the distributions' parameters; x < 0 takes the double-double path (~20x slower)
    x = x.to(device)
    carbon_fn, torch_fn, _ = (FLOAT64_FUNCTIONS if float64 else FUNCTIONS)[name]
    times = time_interleaved([lambda: torch_fn(x), lambda: carbon_fn(x)], device, budget_s, 30)
    t_torch, t_carbon = (statistics.median(t) for t in times)
    check = (_sample_agreement_float64 if float64 else _sample_check)(name, x, carbon_fn(x))
    return {"torch": t_torch, "carbon": t_carbon, "melems": x.numel() / (t_carbon * 1e-3) / 1e6, "check": check}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="the smallest size only")
    parser.add_argument("--functions", default=None, help="comma-separated subset")
    parser.add_argument("--float64", action="store_true", help="the float64 functions (exp, log, sin, cos, pow)")
    args = parser.parse_args(argv)
    functions = args.functions or ",".join(FLOAT64_FUNCTIONS if args.float64 else FUNCTIONS)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    dtype_name = "float64" if args.float64 else "float32"
    check_name = "sample = math.* (libm)" if args.float64 else "sample = RN(fp64 ref)"
    lines = [f"| device | function | shape ({dtype_name}) | torch ms | carbon ms | carbon/torch | carbon Melem/s | {check_name} |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        sizes = FLOAT64_SIZES if args.float64 else (CPU_SIZES if device == "cpu" else CUDA_SIZES)
        if args.quick:
            sizes = sizes[:1]
        for name in functions.split(","):
            for shape in sizes:
                r = bench(device, name, shape, 0.3 if args.quick or device == "cuda" else 1.0, args.float64)
                ok, total = r["check"]
                case = "x".join(map(str, shape))
                lines.append(f"| {device} | {name} | {case} | {r['torch']:.3f} | {r['carbon']:.3f} | "
                             f"{r['carbon'] / r['torch']:.2f}x | {r['melems']:.0f} | {ok}/{total} |")
                ratios.append(f"RATIO {device} {name} {case} carbon/torch = {r['carbon'] / r['torch']:.2f}")
                if ok != total and not args.float64:
                    print(f"ERROR: carbon.{name} disagrees with the fp64 reference on {device} {case}")
                    return 2
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
