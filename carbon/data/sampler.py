"""carbon.data.DeterministicSampler: a drop-in for
``torch.utils.data.distributed.DistributedSampler`` whose assignment of
samples to ranks is a function of (seed, epoch, world size, rank) only,
defined in docs/distributed.md — not of a library's shuffling algorithm.

The epoch's order is the dataset indices sorted by one draw of Philox keys
(carbon's counter-based generator at seed ``seed`` and offset ``epoch``; ties
broken by index), or 0..n-1 without shuffling. As in DistributedSampler, the
order is padded by repeating its beginning (or truncated with drop_last) to
a multiple of world_size, and rank r takes positions r, r + W, r + 2W, ...
"""

from __future__ import annotations

import math
from typing import Iterator, Optional, Sized

import torch
from torch.utils.data import Sampler

__all__ = ["DeterministicSampler"]


class DeterministicSampler(Sampler[int]):
    """``DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)``
    with a fixed, documented shuffle. ``num_replicas`` and ``rank`` default to
    the default process group's world size and rank (1 and 0 without one)."""

    def __init__(self, dataset: Sized, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            ready = dist.is_available() and dist.is_initialized()
            num_replicas = (dist.get_world_size() if ready else 1) if num_replicas is None else num_replicas
            rank = (dist.get_rank() if ready else 0) if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"carbon.data.DeterministicSampler: num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"carbon.data.DeterministicSampler: rank {rank} is not in [0, {num_replicas})")
        self.dataset, self.num_replicas, self.rank = dataset, int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last, self.epoch = bool(shuffle), int(seed), bool(drop_last), 0
        n = len(dataset)
        if drop_last and n % self.num_replicas:
            self.num_samples = n // self.num_replicas
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """The epoch selects the draw (offset) of the shuffle."""
        if epoch < 0:
            raise ValueError(f"carbon.data.DeterministicSampler: epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def order(self) -> list:
        """The whole epoch's order (before padding and splitting)."""
        n = len(self.dataset)
        if not self.shuffle or n == 0:
            return list(range(n))
        from carbon.random import Generator

        g = Generator(seed=self.seed)
        g.offset = self.epoch
        seed, offset = g.next_draw()
        keys = torch.ops.carbon.uniform([n], seed, offset, 0.0, 1.0, torch.float32, torch.device("cpu"))
        return torch.sort(keys, stable=True).indices.tolist()

    def __iter__(self) -> Iterator[int]:
        indices = self.order()
        if self.drop_last:
            indices = indices[: self.total_size]
        elif indices:
            while len(indices) < self.total_size:
                indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank: self.total_size: self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
