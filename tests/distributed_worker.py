"""The rank side of tests/test_distributed.py: one spawn of WORLD gloo
processes runs every scenario and writes what it saw to <outdir>/rank<r>.json
(bit patterns as ints); the test process checks them against exact
references. Kept in one spawn because each costs seconds."""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta
from fractions import Fraction
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import carbon
import carbon.distributed as cd

WORLD = 3
PERMUTATIONS = [(0, 1, 2), (2, 0, 1), (1, 2, 0)]  # rank r trains on shard PERMUTATIONS[k][r]
STEPS = 3
SHARD = 4  # samples per rank and step


def collective_input(rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank r's tensor: wide dynamic range (2^-60 .. 2^60), cancellation, and
    columns built so the exact sum sits on or next to a rounding midpoint."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(37, generator=g, dtype=torch.float64)
    x = x * torch.pow(2.0, torch.randint(-60, 61, (37,), generator=g).double())
    special = {  # column: values of ranks 0, 1, 2
        0: (1.0, 2.0 ** -24, 0.0),              # exact tie: 1 + 2^-24 -> 1 (even)
        1: (1.0, 2.0 ** -24, 2.0 ** -80),       # just above the tie -> 1 + 2^-23 (double rounding would miss it)
        2: (3.0, -3.0, 2.0 ** -140),            # cancellation to a subnormal
        3: (2.0 ** 100, -(2.0 ** 100), 1.0),    # huge cancellation
        4: (-0.0, -0.0, -0.0),                  # signed zero
    }
    for col, vals in special.items():
        x[col] = vals[rank]
    return x.to(dtype)


def bits(t: torch.Tensor) -> List[int]:
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    return t.detach().contiguous().view(view).reshape(-1).tolist()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def batch(step: int, shard: int):
    g = torch.Generator().manual_seed(1000 * step + shard)
    return torch.randn(SHARD, 8, generator=g), torch.randint(0, 4, (SHARD,), generator=g)


def make_model() -> nn.Module:
    with carbon.enabled(seed=0):
        return MLP()


def exact_mean(grads: List[torch.Tensor]) -> torch.Tensor:
    """RN32 of the exact mean, with Fractions (the test-side reference)."""
    from tests.oracle import bits_tensor, round_bits

    flat = [g.reshape(-1).tolist() for g in grads]
    out = [round_bits(sum(Fraction(v[i]) for v in flat) / len(flat), torch.float32) for i in range(len(flat[0]))]
    return bits_tensor(out, torch.float32).view(torch.float32).reshape(grads[0].shape)


def reference_training() -> Dict[str, List[int]]:
    """Single process: each shard's gradient, their exact mean, the optimizer step."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        per_shard = []
        for shard in range(WORLD):
            model.zero_grad()
            x, y = batch(step, shard)
            with carbon.enabled():
                F.cross_entropy(model(x), y).backward()
            per_shard.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = exact_mean([grads[i] for grads in per_shard])
        with carbon.enabled():
            opt.step()
    return {k: bits(v) for k, v in model.state_dict().items()}


def ddp_training(rank: int, perm, gradient_as_bucket_view: bool) -> Dict[str, List[int]]:
    model = make_model()
    # tiny buckets: several per step, rebuilt after the first iteration (DDP's default)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005,
                                              gradient_as_bucket_view=gradient_as_bucket_view)
    ddp.register_comm_hook(None, carbon.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(step, perm[rank])
        with carbon.enabled():
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        opt.zero_grad()
    return {k: bits(v) for k, v in model.state_dict().items()}


def scenarios(rank: int) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        for op in (cd.ReduceOp.SUM, cd.ReduceOp.AVG):
            t = collective_input(rank, dtype)
            cd.all_reduce(t, op)
            out[f"all_reduce/{name}/{op.value}"] = bits(t)
        full = torch.cat([collective_input(rank, dtype)] * WORLD)[: 12 * WORLD]
        shard = torch.empty(12, dtype=dtype)
        cd.reduce_scatter(shard, full, cd.ReduceOp.AVG)
        out[f"reduce_scatter/{name}"] = bits(shard)
    t = collective_input(rank)
    with carbon.enabled():
        dist.all_reduce(t)  # routed to carbon's exact all-reduce
    out["enabled/dist.all_reduce"] = bits(t)
    try:
        cd.all_reduce(torch.ones(5 if rank == 0 else 6))
    except cd.CollectiveError as e:
        out["error/mismatch"] = str(e)
    try:
        cd.all_reduce(torch.ones(3, dtype=torch.int64))
    except TypeError as e:
        out["error/int"] = str(e)
    for view in (False, True):
        for k, perm in enumerate(PERMUTATIONS):
            out[f"ddp/view={view}/perm={k}"] = ddp_training(rank, perm, view)
    # last: a rank that never joins makes the others fail within the group's timeout
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=3))
    if rank != WORLD - 1:
        try:
            cd.all_reduce(torch.ones(4), group=group)
        except cd.CollectiveError as e:
            out["error/missing_rank"] = str(e)
    return out


def main(rank: int, world: int, outdir: str, port: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    result: Dict[str, object]
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        result = scenarios(rank)
    except Exception:  # noqa: BLE001 (reported to the test)
        result = {"crash": traceback.format_exc()}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # the group with the missing rank cannot be torn down cleanly
