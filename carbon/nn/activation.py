"""carbon.nn.GELU and carbon.nn.SiLU: torch.nn's activations computed by
Carbon's correctly rounded elementwise math (same constructors)."""

from __future__ import annotations

import torch
from torch import Tensor

from carbon.elementwise import gelu, silu


class GELU(torch.nn.Module):
    """``torch.nn.GELU(approximate="none" | "tanh")`` with a forward (and
    backward) by :func:`carbon.gelu`."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"carbon.nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        return gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(torch.nn.Module):
    """``torch.nn.SiLU(inplace=False)`` with a forward (and backward) by
    :func:`carbon.silu`. With ``inplace=True`` the (out-of-place) result is
    copied into the input, as torch's in-place variant leaves it."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        out = silu(input)
        return input.copy_(out) if self.inplace else out

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""
