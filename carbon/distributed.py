"""Exact collectives over torch.distributed (docs/distributed.md).

A floating-point all-reduce with NCCL or gloo adds the ranks' values in an
order set by the algorithm (ring, tree), the channel count and the topology,
so its bits change with them — and with which rank holds which data. Carbon
instead returns the *correctly rounded exact* sum (or mean) of the ranks'
values, which is one value whatever the order:

    all_reduce:      RN(sum_r x_r)  or, for AVG, RN(sum_r x_r / world_size)
    reduce_scatter:  the same, for this rank's shard of the input

Transport (all on torch.distributed, any backend that has all_to_all and
all_gather — gloo, NCCL): the flat tensor is cut into world_size shards; an
``all_to_all`` hands shard k of every rank to rank k; rank k reduces its
[world_size, n/world_size] block with ``carbon.sum`` / ``carbon.mean`` over
dim 0 (exact, order-free); an ``all_gather`` returns the reduced shards to
everyone. Each rank sends and receives 2 (W - 1)/W of the tensor's bytes,
as in a ring all-reduce; reduce_scatter is the first half alone.

Before the data, the ranks exchange the tensor's element count and dtype
(one small all_gather), so mismatched buffers raise a clear error on every
rank instead of hanging or mixing data. A rank that fails or stops makes the
others' collectives fail with the process group's timeout at the latest;
that error is re-raised as a :class:`CollectiveError` naming the rank.
"""

from __future__ import annotations

import enum
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ReduceOp", "CollectiveError", "all_reduce", "reduce_scatter", "allreduce_hook"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class ReduceOp(enum.Enum):
    """The reductions carbon computes exactly."""
    SUM = "sum"
    AVG = "avg"


class CollectiveError(RuntimeError):
    """A collective failed on this rank (a peer failed, timed out, or sent a
    buffer that does not match)."""


def _op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if op in (dist.ReduceOp.SUM, "sum"):
        return ReduceOp.SUM
    if op in (dist.ReduceOp.AVG, "avg", "mean"):
        return ReduceOp.AVG
    raise ValueError(f"carbon.distributed: op must be ReduceOp.SUM or ReduceOp.AVG (exact), got {op!r}")


def _check_tensor(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"carbon.distributed.{name}: expected a tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"carbon.distributed.{name}: dtype {t.dtype} is not supported; carbon reduces float32, "
                        "bfloat16 and float16 exactly (integer all-reduces are exact already: use torch.distributed)")


def _rank(group: Any) -> int:
    return dist.get_rank(group)


def _collective(what: str, group: Any, fn, *args) -> None:
    try:
        fn(*args, group=group)
    except CollectiveError:
        raise
    except Exception as e:  # gloo / NCCL raise RuntimeError (or DistBackendError) on timeouts and lost peers
        raise CollectiveError(f"carbon.distributed: {what} failed on rank {_rank(group)} (a peer failed, timed "
                              f"out or left the group): {e}") from e


def _all_gather_flat(output: Tensor, input: Tensor, group: Any) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, input, group=group)


def _agree_on_shape(what: str, t: Tensor, world: int, group: Any) -> None:
    """Every rank must bring the same element count and dtype (one small all_gather)."""
    mine = torch.tensor([t.numel(), _DTYPE_CODES[t.dtype]], dtype=torch.int64, device=t.device)
    everyone = torch.empty(2 * world, dtype=torch.int64, device=t.device)
    _collective(f"{what} (shape check)", group, _all_gather_flat, everyone, mine)
    rows = everyone.view(world, 2).tolist()  # host read: the collective above must finish anyway
    if any(r != rows[0] for r in rows):
        names = {v: k for k, v in _DTYPE_CODES.items()}
        desc = ", ".join(f"rank {i}: {n} x {names.get(c, c)}" for i, (n, c) in enumerate(rows))
        raise CollectiveError(f"carbon.distributed.{what}: the ranks' tensors do not match ({desc})")


def _reduce_shards(flat: Tensor, op: ReduceOp, world: int, group: Any, what: str) -> Tensor:
    """This rank's shard of the exact reduction of ``flat`` (numel divisible by world)."""
    received = torch.empty_like(flat)
    _collective(f"{what} (all_to_all)", group, dist.all_to_all_single, received, flat)
    block = received.view(world, -1)
    reduce = torch.ops.carbon.mean if op is ReduceOp.AVG else torch.ops.carbon.sum
    return reduce(block, [0], False, None)


def _exact_all_reduce(t: Tensor, op: ReduceOp, group: Any, what: str) -> Tensor:
    """The exact reduction of ``t`` over the group, as a new flat tensor of t.numel() elements."""
    world = dist.get_world_size(group)
    _agree_on_shape(what, t, world, group)
    n = t.numel()
    if world == 1:
        flat = t.reshape(-1)
        # one rank: the sum is the value; the mean divides by 1 (both exact, NaN payloads kept)
        return flat.clone()
    shard = -(-n // world)
    flat = torch.zeros(shard * world, dtype=t.dtype, device=t.device)  # zero padding adds nothing
    flat[:n].copy_(t.reshape(-1))
    mine = _reduce_shards(flat, op, world, group, what)
    gathered = torch.empty_like(flat)
    _collective(f"{what} (all_gather)", group, _all_gather_flat, gathered, mine.contiguous())
    return gathered[:n]


def all_reduce(tensor: Tensor, op: Union[ReduceOp, Any] = ReduceOp.SUM, group: Optional[Any] = None) -> Tensor:
    """In place, like ``torch.distributed.all_reduce``: every rank's ``tensor``
    becomes RN(exact sum over ranks) (SUM) or RN(exact sum / world_size)
    (AVG), the same bits whatever the rank order, backend or topology.
    Returns ``tensor``. Blocking (returns when the result is in place; on
    CUDA, when it is enqueued on the current stream)."""
    _check_tensor("all_reduce", tensor)
    result = _exact_all_reduce(tensor, _op(op), group, "all_reduce")
    tensor.copy_(result.view(tensor.shape))
    return tensor


def reduce_scatter(output: Tensor, input: Union[Tensor, Sequence[Tensor]], op: Union[ReduceOp, Any] = ReduceOp.SUM,
                   group: Optional[Any] = None) -> Tensor:
    """``output`` (n elements) on rank k becomes the exact reduction over
    ranks of chunk k of ``input``: a flat tensor of world_size * n elements
    (as ``reduce_scatter_tensor``) or a list of world_size tensors of n
    elements (as ``reduce_scatter``). Returns ``output``."""
    world = dist.get_world_size(group)
    if not isinstance(input, Tensor):
        if len(input) != world:
            raise ValueError(f"carbon.distributed.reduce_scatter: expected {world} input tensors, got {len(input)}")
        input = torch.cat([t.reshape(-1) for t in input])
    _check_tensor("reduce_scatter", input)
    _check_tensor("reduce_scatter", output)
    if input.dtype != output.dtype:
        raise TypeError(f"carbon.distributed.reduce_scatter: input {input.dtype} and output {output.dtype} differ")
    if input.numel() != world * output.numel():
        raise ValueError(f"carbon.distributed.reduce_scatter: input has {input.numel()} elements, expected "
                         f"world_size x output = {world} x {output.numel()}")
    _agree_on_shape("reduce_scatter", input, world, group)
    if world == 1:
        return output.copy_(input.view(output.shape))
    mine = _reduce_shards(input.contiguous().view(-1), _op(op), world, group, "reduce_scatter")
    return output.copy_(mine.view(output.shape))


def allreduce_hook(state: Optional[Any], bucket: "dist.GradBucket") -> torch.futures.Future:
    """DDP communication hook: ``model.register_comm_hook(None, carbon.allreduce_hook)``.

    Each gradient element becomes RN(exact sum over ranks / world_size) —
    the correctly rounded exact mean, identical whatever the rank order,
    bucket layout, backend or topology (DDP's built-in hook divides each
    rank's gradient by world_size before summing, which rounds twice).
    ``state`` is None (the default process group) or a process group.
    """
    group = state if state is not None else None
    buffer = bucket.buffer()
    _check_tensor("allreduce_hook", buffer)
    result = _exact_all_reduce(buffer, ReduceOp.AVG, group, "allreduce_hook")
    devices = [buffer.device] if buffer.device.type == "cuda" else None
    future: torch.futures.Future = torch.futures.Future(devices=devices)
    future.set_result(result.view(buffer.shape))
    return future


# DDP inspects the hook's annotations as objects (not the strings that
# `from __future__ import annotations` leaves).
allreduce_hook.__annotations__ = {"state": Optional[Any], "bucket": dist.GradBucket,
                                  "return": torch.futures.Future[torch.Tensor]}
