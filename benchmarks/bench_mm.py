"""Time carbon.mm against torch.matmul, side by side in one run.

    python benchmarks/bench_mm.py [--device cpu|cuda|all] [--quick]

What is measured, per shape M x K x N (a is M x K, b is K x N, random normal
float32 entries, fixed seed):

* the median (and minimum) time of one product: one warm-up call each, then
  interleaved rounds that call every implementation once, 3-20 rounds as fit
  the time budget (CPU: time.perf_counter; CUDA: torch.cuda.Event around each
  call, synchronized before and after), for carbon.mm and the torch baselines:
    CPU:  torch fp32, and torch fp64 (carbon's fast path is an fp64 GEMM, so
          this is the floor for carbon's current algorithm);
    CUDA: torch fp32 with TF32 off (cuBLAS SGEMM), fp32 with TF32 on, fp64
          (DGEMM), and bf16 (compared with carbon.mm on the same bf16 inputs);
* "carbon / this": carbon's time divided by the row's time (fp32 carbon for
  the fp32/fp64 rows, bf16 carbon for the bf16 row), and TFLOP/s (2MNK / t);
* "exact": of a sample of outputs (64 by default), how many equal the
  correctly rounded exact result RN(sum_k a_ik b_kj) -- checked with the
  math.fsum-based reference in carbon/reference.py, independent of carbon's kernels.
  Carbon must score 100%; torch's score shows how often it is not exact.

The issue's targets: on the CPU, carbon <= 3x torch fp32 at 1024^3; on an
H200, carbon <= 1.2x cuBLAS fp32 with TF32 off (at 8192^3 and the GPT-2
shapes). The "RATIO" lines at the end restate these headline ratios in a
form that is easy to grep (scripts/device_check.sh does).

--quick runs a small subset (CPU 256^3 and 1024^3; CUDA 4096^3) in well under
a minute on 2 cores. Exit status 2 if any sampled carbon output is not
correctly rounded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install: use the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

from carbon.reference import correctly_rounded_reference, count_correctly_rounded, sample_indices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, time_interleaved  # noqa: E402

Shape = Tuple[int, int, int]  # (M, K, N)

CPU_SHAPES: List[Shape] = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 768, 3072), (2048, 3072, 768)]
CPU_QUICK: List[Shape] = [(256, 256, 256), (1024, 1024, 1024)]
CUDA_SHAPES: List[Shape] = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 768, 3072), (16384, 3072, 768)]
CUDA_QUICK: List[Shape] = [(4096, 4096, 4096)]

CPU_TARGET = ((1024, 1024, 1024), 3.0)  # carbon <= 3x torch fp32 at 1024^3


@contextlib.contextmanager
def _tf32(enabled: bool):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


class Row:
    def __init__(self, device: str, shape: Shape, impl: str, times_ms: List[float], exact: Optional[Tuple[int, int]]):
        self.device, self.shape, self.impl, self.exact = device, shape, impl, exact
        self.ms = statistics.median(times_ms)
        self.min_ms = min(times_ms)
        self.reps = len(times_ms)
        self.ratio: Optional[float] = None  # carbon's median time / this row's median time

    @property
    def tflops(self) -> float:
        m, k, n = self.shape
        return 2.0 * m * k * n / (self.ms * 1e-3) / 1e12


def _inputs(shape: Shape, device: str, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    m, k, n = shape
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    return a.to(device), b.to(device)


def bench_shape(device: str, shape: Shape, samples: int, budget_s: float, max_reps: int, seed: int = 0) -> List[Row]:
    m, k, n = shape
    a, b = _inputs(shape, device, seed)
    idx = sample_indices(m, n, samples, seed)
    ref32 = correctly_rounded_reference(a, b, idx)

    def run_group(specs: List[Tuple[str, Callable[[], torch.Tensor], Optional[List[float]]]]) -> List[Row]:
        exact = []
        for _, fn, ref in specs:
            exact.append((count_correctly_rounded(fn(), idx, ref), len(idx)) if ref is not None else None)
        times = time_interleaved([fn for _, fn, _ in specs], device, budget_s, max_reps)
        return [Row(device, shape, impl, t, e) for (impl, _, _), t, e in zip(specs, times, exact)]

    if device == "cpu":
        a64, b64 = a.double(), b.double()
        rows = run_group([
            ("carbon.mm fp32", lambda: carbon.mm(a, b), ref32),
            ("torch fp32", lambda: torch.matmul(a, b), ref32),
            ("torch fp64 (reference)", lambda: torch.matmul(a64, b64), None),
        ])
        for r in rows[1:]:
            r.ratio = rows[0].ms / r.ms
        return rows

    # CUDA. TF32 is switched per call so that the fp32 rows can interleave.
    def fp32(enabled: bool) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            with _tf32(enabled):
                return torch.matmul(a, b)
        return fn

    a64, b64 = a.double(), b.double()
    rows = run_group([
        ("carbon.mm fp32", lambda: carbon.mm(a, b), ref32),
        ("torch fp32, TF32 off", fp32(False), ref32),
        ("torch fp32, TF32 on", fp32(True), ref32),
        ("torch fp64 (DGEMM)", lambda: torch.matmul(a64, b64), None),
    ])
    del a64, b64
    for r in rows[1:]:
        r.ratio = rows[0].ms / r.ms
    a16, b16 = a.bfloat16(), b.bfloat16()
    ref16 = correctly_rounded_reference(a16, b16, idx)
    rows16 = run_group([
        ("carbon.mm bf16", lambda: carbon.mm(a16, b16), ref16),
        ("torch bf16", lambda: torch.matmul(a16, b16), ref16),
    ])
    rows16[1].ratio = rows16[0].ms / rows16[1].ms
    del a16, b16
    torch.cuda.empty_cache()
    return rows + rows16


def _markdown(rows: List[Row]) -> str:
    header = ["device", "shape M x K x N", "implementation", "median ms", "min ms", "TFLOP/s", "carbon / this", "exact (sample)", "reps"]
    body = []
    for r in rows:
        exact = "-" if r.exact is None else f"{r.exact[0]}/{r.exact[1]} ({100.0 * r.exact[0] / r.exact[1]:.0f}%)"
        body.append([
            r.device,
            "x".join(map(str, r.shape)),
            r.impl,
            f"{r.ms:.3f}" if r.ms < 10 else f"{r.ms:.1f}",
            f"{r.min_ms:.3f}" if r.min_ms < 10 else f"{r.min_ms:.1f}",
            f"{r.tflops:.3f}" if r.tflops < 1 else f"{r.tflops:.1f}",
            "-" if r.ratio is None else f"{r.ratio:.2f}x",
            exact,
            str(r.reps),
        ])
    widths = [max(len(h), *(len(b[c]) for b in body)) for c, h in enumerate(header)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    lines = [fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt(b) for b in body]
    return "\n".join(lines)


def _ratio_lines(rows: List[Row]) -> List[str]:
    lines = []
    by: Dict[Tuple[str, Shape, str], Row] = {(r.device, r.shape, r.impl): r for r in rows}
    for (device, shape, impl), r in by.items():
        s = "x".join(map(str, shape))
        if device == "cpu" and impl == "torch fp32":
            target = f" (target <= {CPU_TARGET[1]:.1f})" if shape == CPU_TARGET[0] else ""
            lines.append(f"RATIO cpu  {s:<17} carbon/torch_fp32 = {r.ratio:.2f}{target}")
        elif device == "cuda" and impl == "torch fp32, TF32 off":
            lines.append(f"RATIO cuda {s:<17} carbon/cublas_fp32_tf32off = {r.ratio:.2f} (target <= 1.2)")
        elif device == "cuda" and impl == "torch bf16":
            lines.append(f"RATIO cuda {s:<17} carbon_bf16/torch_bf16 = {r.ratio:.2f}")
    inexact = [r for r in rows if r.impl.startswith("carbon") and r.exact and r.exact[0] != r.exact[1]]
    for r in inexact:
        lines.append(f"RATIO WARNING {r.device} {'x'.join(map(str, r.shape))} {r.impl}: only "
                     f"{r.exact[0]}/{r.exact[1]} sampled outputs correctly rounded")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="a tiny subset (< 60 s on 2 CPU cores)")
    parser.add_argument("--samples", type=int, default=64, help="outputs checked against the exact result per row")
    args = parser.parse_args(argv)

    devices = []
    if args.device in ("cpu", "all"):
        devices.append("cpu")
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            devices.append("cuda")
        elif args.device == "cuda":
            print("bench_mm: CUDA is not available", file=sys.stderr)
            return 1

    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", GPU {torch.cuda.get_device_name()}" if "cuda" in devices else "")
          + f", load average at start {machine_load()}")
    rows: List[Row] = []
    for device in devices:
        if device == "cpu":
            shapes, budget, max_reps = (CPU_QUICK, 1.0, 10) if args.quick else (CPU_SHAPES, 4.0, 20)
        else:
            shapes, budget, max_reps = (CUDA_QUICK, 0.5, 10) if args.quick else (CUDA_SHAPES, 1.5, 20)
        for shape in shapes:
            t0 = time.perf_counter()
            new = bench_shape(device, shape, args.samples, budget, max_reps)
            rows += new
            summary = ", ".join(f"{r.impl} {r.ms:.2f} ms" for r in new)
            print(f"  {device} {'x'.join(map(str, shape))}: {summary} [{time.perf_counter() - t0:.1f} s]", flush=True)

    print()
    print(f"load average at end {machine_load()} (CPU timings are only meaningful on an otherwise idle machine)")
    print()
    print(_markdown(rows))
    print()
    print("\n".join(_ratio_lines(rows)))
    inexact = [r for r in rows if r.impl.startswith("carbon") and r.exact and r.exact[0] != r.exact[1]]
    return 2 if inexact else 0  # carbon must be exact on every sampled output


if __name__ == "__main__":
    sys.exit(main())
