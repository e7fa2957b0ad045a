"""carbon.distributed (docs/distributed.md): exact all-reduce, reduce-scatter
and the DDP hook over gloo with 3 ranks, against the exact integer oracle and a
single-process exact reference; carbon.data.DeterministicSampler against the
Philox reference. One spawn (tests/distributed_worker.py) runs all rank-side
scenarios."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler

from carbon.data import DeterministicSampler
from tests import distributed_worker as worker
from tests import philox_reference
from tests.oracle import fmt_of, row_quotient_bits

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("ranks"))
    mp.spawn(worker.main, args=(worker.WORLD, outdir, _free_port()), nprocs=worker.WORLD, join=True)
    results = []
    for r in range(worker.WORLD):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    for r, res in enumerate(results):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    return results


def _signed(b: int, dtype: torch.dtype) -> int:
    n = fmt_of(dtype).total_bits
    return b - (1 << n) if b >> (n - 1) else b


def _oracle(values_per_rank, dtype, mean: bool):
    """Bits of RN(sum) or RN(sum / W) per column, by the integer oracle."""
    world = len(values_per_rank)
    return [_signed(row_quotient_bits(list(col), world if mean else 1, dtype), dtype)
            for col in zip(*[v.tolist() for v in values_per_rank])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_all_reduce_is_the_correctly_rounded_exact_sum(ranks, dtype, op):
    name = str(dtype).split(".")[-1]
    inputs = [worker.collective_input(r, dtype) for r in range(worker.WORLD)]
    expected = _oracle(inputs, dtype, mean=op == "avg")
    for r, res in enumerate(ranks):
        assert res[f"all_reduce/{name}/{op}"] == expected, f"rank {r}"


def test_the_double_rounding_trap_column_rounds_up(ranks):
    # column 1: 1 + 2^-24 + 2^-80 must round up to 1 + 2^-23 (fp64-then-fp32 gives 1)
    got = ranks[0]["all_reduce/float32/sum"][1]
    assert got == torch.tensor(1.0 + 2.0 ** -23).view(torch.int32).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_scatter_gives_each_rank_its_exact_shard(ranks, dtype):
    name = str(dtype).split(".")[-1]
    fulls = [torch.cat([worker.collective_input(r, dtype)] * worker.WORLD)[: 12 * worker.WORLD]
             for r in range(worker.WORLD)]
    for k, res in enumerate(ranks):
        expected = _oracle([f[12 * k: 12 * (k + 1)] for f in fulls], dtype, mean=True)
        assert res[f"reduce_scatter/{name}"] == expected, f"rank {k}"


def test_torch_all_reduce_under_enable_is_exact(ranks):
    expected = _oracle([worker.collective_input(r) for r in range(worker.WORLD)], torch.float32, mean=False)
    for res in ranks:
        assert res["enabled/dist.all_reduce"] == expected


def test_bad_buffers_raise_on_every_rank(ranks):
    for res in ranks:
        assert "do not match" in res["error/mismatch"] and "rank 0: 5" in res["error/mismatch"]
        assert "int64" in res["error/int"]


def test_a_missing_rank_makes_the_others_raise(ranks):
    for res in ranks[:-1]:
        assert "failed on rank" in res["error/missing_rank"]


def test_ddp_weights_do_not_depend_on_which_rank_holds_which_shard(ranks):
    runs = [res[key] for res in ranks for key in res if key.startswith("ddp/")]
    assert len(runs) == 2 * len(worker.PERMUTATIONS) * worker.WORLD
    for run in runs[1:]:
        assert run == runs[0]


def test_ddp_weights_equal_the_single_process_exact_mean_reference(ranks, restore_num_threads):
    torch.set_num_threads(1)
    assert ranks[0]["ddp/view=False/perm=0"] == worker.reference_training()


# ---- DeterministicSampler (no processes needed) -----------------------------------------------------------------

def _reference_order(n: int, seed: int, epoch: int):
    keys = [philox_reference.uniform01(w) for w in philox_reference.words(seed, epoch, n)]
    return sorted(range(n), key=lambda i: (keys[i], i))


@pytest.mark.parametrize("n,world,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (1, 2, False)])
def test_sampler_order_is_the_philox_key_sort(n, world, drop_last):
    for epoch in (0, 3):
        order = _reference_order(n, 7, epoch)
        total = (n // world if drop_last else -(-n // world)) * world
        padded = order[:total] if drop_last else (order * (total // n + 1))[:total]
        for rank in range(world):
            s = DeterministicSampler(range(n), world, rank, seed=7, drop_last=drop_last)
            s.set_epoch(epoch)
            assert list(s) == padded[rank:total:world]
            assert len(s) == total // world


def test_sampler_without_shuffle_matches_torch_distributed_sampler():
    for rank in range(3):
        ours = list(DeterministicSampler(range(11), 3, rank, shuffle=False))
        assert ours == list(DistributedSampler(range(11), 3, rank, shuffle=False))


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        DeterministicSampler(range(4), 2, 2)
    with pytest.raises(ValueError, match="epoch"):
        DeterministicSampler(range(4), 2, 0).set_epoch(-1)
