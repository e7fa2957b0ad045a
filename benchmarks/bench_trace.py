"""Overhead of carbon.trace on one training step of a small model (CPU).

One step = forward, backward and an AdamW step of a 2-block MLP-with-LayerNorm model (d=256,
hidden 1024, batch 128 x 16 tokens) in plain PyTorch. Timed, in the same interleaved rounds:

* plain   — the step alone;
* hash    — the step inside ``with carbon.trace(path):`` (a fresh trace file per step);
* tensors — the step inside ``with carbon.trace(path, save="tensors")`` (values of every output
  written to the sidecar).

Also measured: the per-op cost on tiny tensors (a chain of 2000 ``add`` on 16 elements), which is
the fixed Python cost of recording one op. Usage: ``python benchmarks/bench_trace.py [--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, time_interleaved  # noqa: E402

import carbon  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, d: int = 256, h: int = 1024, n: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(d, h) for _ in range(n)])
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timing per table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, 16, 256)
    target = torch.randint(0, 10, (128 * 16,))
    tmp = tempfile.mkdtemp(prefix="bench-trace-")
    path = os.path.join(tmp, "t.jsonl")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 10), target)
        loss.backward()
        opt.step()

    info = {}

    def traced(save):
        def run():
            with carbon.trace(path, save=save, max_bytes=1 << 31) as tr:
                step()
            info[save] = (tr.ops, os.path.getsize(path) + (os.path.getsize(tr.tensors_path) if tr.tensors_path else 0))
        return run

    times = time_interleaved([step, traced("hash"), traced("tensors")], "cpu", args.budget, 50)
    med = [statistics.median(t) for t in times]
    print(f"carbon.trace overhead, one training step (2 blocks d=256 h=1024, batch 128x16, AdamW), CPU, "
          f"{args.threads} threads, torch {torch.__version__}, load {machine_load()}, {len(times[0])} rounds")
    print()
    print("| mode | median ms / step | vs plain | ops / step | trace bytes / step |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain | {med[0]:.1f} | 1.00x | - | - |")
    for name, m in (("hash", med[1]), ("tensors", med[2])):
        ops, nbytes = info[name]
        print(f"| {name} | {m:.1f} | {m / med[0]:.2f}x | {ops} | {nbytes / 2**20:.1f} MiB |")

    # the fixed cost per op: a chain of tiny adds
    a = torch.randn(16)

    def chain():
        y = a
        for _ in range(2000):
            y = y + 1.0

    def chain_traced():
        with carbon.trace(path):
            chain()

    t = time_interleaved([chain, chain_traced], "cpu", args.budget / 4, 20)
    c0, c1 = (statistics.median(v) for v in t)
    print()
    print(f"per-op cost on 16-element tensors: {c0 / 2000 * 1e3:.1f} us plain, {c1 / 2000 * 1e3:.1f} us traced "
          f"(+{(c1 - c0) / 2000 * 1e3:.1f} us per op)")
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
