"""carbon.nn.GELU and carbon.nn.SiLU: torch.nn's activations computed by
Carbon's correctly rounded elementwise math (same constructors; subclasses of
torch.nn.GELU / torch.nn.SiLU, so ``isinstance`` checks keep working)."""

from __future__ import annotations

import torch
from torch import Tensor

from carbon.elementwise import gelu, silu


class GELU(torch.nn.GELU):
    """``torch.nn.GELU(approximate="none" | "tanh")`` with a forward (and
    backward) by :func:`carbon.gelu`."""

    def __init__(self, approximate: str = "none") -> None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"carbon.nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(approximate)

    def forward(self, input: Tensor) -> Tensor:
        return gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"

    @classmethod
    def from_torch(cls, module: torch.nn.GELU) -> "GELU":
        """A carbon.nn.GELU with ``module``'s ``approximate``."""
        if not isinstance(module, torch.nn.GELU):
            raise TypeError(f"GELU.from_torch expects a torch.nn.GELU, got {type(module).__name__}")
        return cls(module.approximate).train(module.training)


class SiLU(torch.nn.SiLU):
    """``torch.nn.SiLU(inplace=False)`` with a forward (and backward) by
    :func:`carbon.silu`. With ``inplace=True`` the (out-of-place) result is
    copied into the input, as torch's in-place variant leaves it; while
    autograd records, the backward reads a copy of the original input (as
    torch's in-place silu_ saves it), since the copy overwrites the input."""

    def forward(self, input: Tensor) -> Tensor:
        if not self.inplace:
            return silu(input)
        recording = torch.is_grad_enabled() and input.requires_grad
        return input.copy_(silu(input.clone() if recording else input))

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

    @classmethod
    def from_torch(cls, module: torch.nn.SiLU) -> "SiLU":
        """A carbon.nn.SiLU with ``module``'s ``inplace``."""
        if not isinstance(module, torch.nn.SiLU):
            raise TypeError(f"SiLU.from_torch expects a torch.nn.SiLU, got {type(module).__name__}")
        return cls(module.inplace).train(module.training)
