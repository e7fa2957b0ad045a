"""One-thread CPU times of carbon's layer_norm, sum and mm against torch's, in one process.

    python benchmarks/bench_cpu_one_thread.py [--reps N]

torch.set_num_threads(1); for each case torch and carbon run back to back,
each timed with time.process_time (CPU time, steadier than wall clock on a
shared machine) over N calls after one warm-up; the minimum and the median
are printed, and the ratio of the minima. "fwd+bwd" is
carbon.layer_norm(x, (n,), w, b).backward(dy) (gradients of x, w and b) and
the same through torch.nn.functional.layer_norm. Inputs random normal,
w ~ 1 + 0.1 N, b ~ 0.1 N. The mm rows are shapes whose CPU path has its own
handling: tall, narrow products (the fp64 GEMM as its transpose), small K
with a large output (row chunks), an LM head. Compare two builds by running this script with
each, alternately, in the same period (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import cpu_times  # noqa: E402

F = torch.nn.functional


def cpu_ms(fn, reps):
    times = cpu_times(fn, reps)
    return min(times) * 1e3, statistics.median(times) * 1e3


def norm_cases(reps):
    g = torch.Generator().manual_seed(0)
    for rows, n, dtype in [(4096, 768, torch.float32), (4096, 768, torch.bfloat16), (4096, 4096, torch.float32),
                           (4096, 4096, torch.bfloat16)]:
        x = torch.randn((rows, n), generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
        b = (0.1 * torch.randn(n, generator=g)).to(dtype)
        dy = torch.randn((rows, n), generator=g).to(dtype)
        r = reps if n < 1000 else max(3, reps // 4)
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

        def fwd_bwd(fn):
            def run():
                xg.grad = wg.grad = bg.grad = None
                fn(xg, (n,), wg, bg).backward(dy)
            return run

        name = f"layer_norm {rows}x{n} {str(dtype).replace('torch.', '')}"
        t = cpu_ms(lambda: F.layer_norm(x, (n,), w, b), r)
        c = cpu_ms(lambda: carbon.layer_norm(x, (n,), w, b), r)
        tb = cpu_ms(fwd_bwd(F.layer_norm), max(3, r // 2))
        cb = cpu_ms(fwd_bwd(carbon.layer_norm), max(3, r // 2))
        print(f"| {name} fwd | {t[0]:.2f} / {t[1]:.2f} | {c[0]:.2f} / {c[1]:.2f} | {c[0] / t[0]:.2f}x |")
        print(f"| {name} fwd+bwd | {tb[0]:.2f} / {tb[1]:.2f} | {cb[0]:.2f} / {cb[1]:.2f} | {cb[0] / tb[0]:.2f}x |")


def sum_cases(reps):
    g = torch.Generator().manual_seed(0)
    for rows, n, dtype, dim in [(4096, 768, torch.float32, 1), (4096, 768, torch.bfloat16, 1),
                                (4096, 4096, torch.float32, 1), (4096, 4096, torch.bfloat16, 1),
                                (4096, 4096, torch.float32, None), (4096, 4096, torch.bfloat16, None),
                                (16384, 768, torch.float32, 1), (4096, 768, torch.float16, 1),
                                (4096, 768, torch.float16, 0), (4096, 4096, torch.float16, 0)]:
        x = torch.randn((rows, n), generator=g).to(dtype)
        name = f"sum {rows}x{n} {str(dtype).replace('torch.', '')} dim={dim}"
        t = cpu_ms(lambda: x.sum(dim) if dim is not None else x.sum(), reps)
        c = cpu_ms(lambda: carbon.sum(x, dim) if dim is not None else carbon.sum(x), reps)
        print(f"| {name} | {t[0]:.2f} / {t[1]:.2f} | {c[0]:.2f} / {c[1]:.2f} | {c[0] / t[0]:.2f}x |")


def mm_cases(reps):
    g = torch.Generator().manual_seed(0)
    for m, k, n in [(8192, 576, 64), (8192, 576, 128), (8192, 16, 4096), (1024, 256, 8192), (8192, 768, 768)]:
        a, b = torch.randn((m, k), generator=g), 0.02 * torch.randn((k, n), generator=g)
        r = max(3, reps // 5)
        t = cpu_ms(lambda: torch.mm(a, b), r)
        c = cpu_ms(lambda: carbon.mm(a, b), r)
        print(f"| mm {m}x{k}x{n} float32 | {t[0]:.2f} / {t[1]:.2f} | {c[0]:.2f} / {c[1]:.2f} | {c[0] / t[0]:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; ms, min / median of time.process_time")
    print("| case | torch ms | carbon ms | carbon/torch (min) |")
    print("|---|---|---|---|")
    norm_cases(args.reps)
    sum_cases(args.reps)
    mm_cases(args.reps)


if __name__ == "__main__":
    main()
