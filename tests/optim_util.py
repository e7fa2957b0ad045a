"""Shared data for the optimizer tests: parameters and gradients with
ordinary, tiny (subnormal) and huge values, and a bitwise comparison."""

from __future__ import annotations

import torch

from data import generator, random_values
from oracle import as_bits


def wide_values(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values of every magnitude the dtype allows (within a margin), a
    few zeros, subnormals and values near the top of the range."""
    g = generator(seed)
    spread = {torch.float32: 40, torch.bfloat16: 40, torch.float16: 6}[dtype]
    x = random_values(shape, dtype, g, spread=spread)
    flat = x.view(-1)
    n = flat.numel()
    if n >= 8:
        tiny = {torch.float32: 1e-40, torch.bfloat16: 1e-39, torch.float16: 1e-7}[dtype]
        huge = {torch.float32: 1e30, torch.bfloat16: 1e30, torch.float16: 3e3}[dtype]
        flat[0] = 0.0
        flat[1] = -0.0
        flat[2] = tiny
        flat[3] = -tiny
        flat[4] = huge
        flat[5] = -huge
    return x


def make_params(dtype, seed, shapes=((7, 5), (33,))):
    return [torch.nn.Parameter(wide_values(s, dtype, seed + i)) for i, s in enumerate(shapes)]


def set_grads(params, seed):
    for i, p in enumerate(params):
        p.grad = wide_values(p.shape, p.dtype, 1000 * seed + i)


def same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    # flattened: a 0-dim mismatch gives nonzero() of shape (1, 0), numel 0
    got, want = as_bits(a).reshape(-1), as_bits(b).reshape(-1)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:, 0]
        first = int(bad[0])
        raise AssertionError(f"{what}: {bad.numel()} elements differ, first at flat index {first}: "
                             f"got {a.reshape(-1)[first]!r}, expected {b.reshape(-1)[first]!r}")
