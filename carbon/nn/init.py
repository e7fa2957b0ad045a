"""carbon.nn.init: ``torch.nn.init``'s initializers drawing from carbon's
counter-based generator, so that a model's initial weights are the same bits
on every device (docs/contract.md §10). Signatures match torch.nn.init; each
takes ``generator=None`` (carbon.default_generator) and makes one draw.

Bounds and standard deviations are computed in Python (binary64) on the host
exactly as torch computes them (fans by torch.nn.init._calculate_fan_in_and_fan_out,
gains by torch.nn.init.calculate_gain); the values are then RN(low + (high -
low) u) or RN(mean + std z) in the tensor's dtype (float32, bfloat16, float16).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from carbon import random as _random
from carbon.random import Generator

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
]

calculate_gain = torch.nn.init.calculate_gain


def _fill(tensor: Tensor, values: Tensor) -> Tensor:
    with torch.no_grad():
        return tensor.copy_(values)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Optional[Generator] = None) -> Tensor:
    """Fill with RN(a + (b - a) u), u uniform on [0, 1) (multiples of 2^-24)."""
    return _fill(tensor, _random.uniform(tensor.shape, a, b, generator=generator, dtype=tensor.dtype,
                                         device=tensor.device))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Optional[Generator] = None) -> Tensor:
    """Fill with RN(mean + std z), z standard normal (Box-Muller, binary64)."""
    return _fill(tensor, _random.normal(tensor.shape, mean, std, generator=generator, dtype=tensor.dtype,
                                        device=tensor.device))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Optional[Generator] = None) -> Tensor:
    """Fill with N(mean, std) restricted to [a, b]: element i takes the first of
    its attempts v_ij = mean + std z_ij (j = 0..63, each from its own counter
    block) with a <= v_ij <= b; if all 64 fail, the last one clamped to [a, b].
    Then RN to the tensor's dtype. (torch uses the inverse CDF instead, so the
    values differ from torch's; the distribution is the same up to the
    clamping, whose probability is (1 - P[a, b])^64.)"""
    return _fill(tensor, _random.trunc_normal(tensor.shape, mean, std, a, b, generator=generator,
                                              dtype=tensor.dtype, device=tensor.device))


def constant_(tensor: Tensor, val: float) -> Tensor:
    with torch.no_grad():
        return tensor.fill_(val)


def zeros_(tensor: Tensor) -> Tensor:
    with torch.no_grad():
        return tensor.zero_()


def ones_(tensor: Tensor) -> Tensor:
    with torch.no_grad():
        return tensor.fill_(1)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Optional[Generator] = None) -> Tensor:
    """U(-a, a) with a = gain sqrt(6 / (fan_in + fan_out)) (as torch: sqrt(3) std)."""
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Optional[Generator] = None) -> Tensor:
    """N(0, std^2) with std = gain sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    if 0 in tensor.shape:
        return 0.0
    fan = torch.nn.init._calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    return gain / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Optional[Generator] = None) -> Tensor:
    """U(-bound, bound) with bound = sqrt(3) gain / sqrt(fan) (torch's formula)."""
    if 0 in tensor.shape:
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Optional[Generator] = None) -> Tensor:
    """N(0, std^2) with std = gain / sqrt(fan) (torch's formula)."""
    if 0 in tensor.shape:
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)
