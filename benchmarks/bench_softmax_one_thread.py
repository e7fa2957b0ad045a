"""One-thread CPU times of carbon's softmax, log_softmax and cross_entropy against torch's, in one process.

    python benchmarks/bench_softmax_one_thread.py [--reps N] [--rounds R]

torch.set_num_threads(1); inputs as benchmarks/bench_softmax.py (randn * 3
logits, randn incoming gradients, random targets, mean reduction). Each case
runs R rounds; a round times torch then carbon, N calls each after one
warm-up, with time.process_time (CPU time, steadier than wall clock on a
shared machine). Printed: the medians over all calls, and the ratio of the
medians. Compare two builds by running this script with each, alternately,
in the same period (docs/benchmarks.md).
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


def interleaved(fns, reps, rounds):
    """Median CPU ms of each function, the functions alternating round by round."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times[i] += cpu_times(fn, reps)
    return [statistics.median(t) * 1e3 for t in times]


def cases():
    g = torch.Generator().manual_seed(0)
    for op, shape, dtype in [("softmax", (12288, 256), torch.float32), ("log_softmax", (12288, 256), torch.float32),
                             ("softmax", (4096, 1024), torch.float32), ("log_softmax", (4096, 1024), torch.float32),
                             ("cross_entropy", (64, 50257), torch.float32),
                             ("cross_entropy", (64, 50257), torch.bfloat16)]:
        x = (torch.randn(shape, generator=g) * 3).to(dtype)
        target = torch.randint(0, shape[-1], shape[:1], generator=g)
        grad = torch.randn(shape, generator=g).to(dtype)
        if op == "cross_entropy":
            tf, cf, gout = (lambda v: F.cross_entropy(v, target)), (lambda v: carbon.cross_entropy(v, target)), None
        else:
            tf = lambda v, op=op: getattr(torch, op)(v, -1)  # noqa: E731
            cf = lambda v, op=op: getattr(carbon, op)(v, -1)  # noqa: E731
            gout = grad
        yield f"{op} {'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')}", x, tf, cf, gout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; ms, medians of time.process_time, 1 thread")
    print("| case | torch ms | carbon ms | carbon/torch |")
    print("|---|---|---|---|")
    for name, x, tf, cf, gout in cases():
        xt, xc = x.clone().requires_grad_(), x.clone().requires_grad_()

        def train(fwd, leaf):
            def step():
                leaf.grad = None
                fwd(leaf).backward(gout)
            return step

        with torch.no_grad():
            t, c = interleaved([lambda: tf(x), lambda: cf(x)], args.reps, args.rounds)
        print(f"| {name} fwd | {t:.2f} | {c:.2f} | {c / t:.2f}x |", flush=True)
        t, c = interleaved([train(tf, xt), train(cf, xc)], args.reps, args.rounds)
        print(f"| {name} fwd+bwd | {t:.2f} | {c:.2f} | {c / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
