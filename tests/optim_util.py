"""Shared data for the optimizer tests: parameters and gradients with
ordinary, tiny (subnormal) and huge values."""

from __future__ import annotations

import torch

from data import generator, random_values


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
