"""DDP on gloo (CPU processes): carbon.allreduce_hook against DDP's default
all-reduce — time per training step and bytes each rank sends per step.

    python benchmarks/bench_distributed.py [--world 3] [--steps 10] [--width 512]

A 4-layer MLP (width x width linears) on random data, the same steps for both
hooks in the same processes. Bytes per rank: what each scheme sends by its
construction — DDP's default hook on gloo runs a ring all-reduce (2(W-1)/W of
the gradient bytes); carbon's all_to_all + all_gather sends the same, plus 16
bytes per bucket for the shape check. Also reported: whether the final
weights of the two ranks-to-shards assignments agree (carbon: always).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])


def _run(rank: int, world: int, port: int, steps: int, width: int, hook: bool, shift: int):
    model = nn.parallel.DistributedDataParallel(_model(width))
    if hook:
        model.register_comm_hook(None, carbon.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + (rank + shift) % world)
        x = torch.randn(32, width, generator=g)
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        times.append((time.perf_counter() - t0) * 1e3)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12]
    return statistics.median(times[1:]), digest, model


def worker(rank: int, world: int, port: int, steps: int, width: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    rows = []
    for name, hook in (("DDP default (gloo ring)", False), ("carbon.allreduce_hook", True)):
        ms, digest_a, model = _run(rank, world, port, steps, width, hook, shift=0)
        _, digest_b, _ = _run(rank, world, port, steps, width, hook, shift=1)
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        buckets = len(model._get_ddp_logging_data().get("bucket_sizes", "1").split(", ")) if hasattr(
            model, "_get_ddp_logging_data") else 1
        sent = 2 * (world - 1) / world * n_bytes + (16 * buckets if hook else 0)
        rows.append((name, ms, sent, digest_a == digest_b))
    if rank == 0:
        print(f"\nDDP, {world} gloo ranks, 4x Linear({width}, {width}) ({n_bytes / 1e6:.1f} MB of gradients), "
              f"{steps} steps, 1 thread per rank")
        print(f"| {'all-reduce':<24} | {'ms/step':>8} | {'MB sent/rank/step':>17} | {'same weights when shards move':>29} |")
        print(f"|{'-' * 26}|{'-' * 10}|{'-' * 19}|{'-' * 31}|")
        base = rows[0][1]
        for name, ms, sent, same in rows:
            print(f"| {name:<24} | {ms:8.1f} | {sent / 1e6:17.2f} | {str(same):>29} |")
        print(f"carbon / default time: {rows[1][1] / base:.2f}x")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args.steps, args.width), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
