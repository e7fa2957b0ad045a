"""carbon.nn.Dropout: ``torch.nn.Dropout`` whose mask comes from carbon's
counter-based generator (same bits on every device)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from carbon.dropout import dropout
from carbon.random import Generator


class Dropout(torch.nn.Dropout):
    """``torch.nn.Dropout(p=0.5, inplace=False)``; forward by
    :func:`carbon.dropout` with ``generator`` (default: carbon.default_generator)."""

    def __init__(self, p: float = 0.5, inplace: bool = False, generator: Optional[Generator] = None) -> None:
        super().__init__(p, inplace)
        self.generator = generator

    def forward(self, input: Tensor) -> Tensor:
        return dropout(input, self.p, self.training, self.inplace, generator=self.generator)

    @classmethod
    def from_torch(cls, module: torch.nn.Dropout, generator: Optional[Generator] = None) -> "Dropout":
        """A carbon.nn.Dropout with ``module``'s ``p`` and ``inplace`` (and
        training mode), drawing from ``generator``."""
        if not isinstance(module, torch.nn.Dropout):
            raise TypeError(f"Dropout.from_torch expects a torch.nn.Dropout, got {type(module).__name__}")
        return cls(module.p, module.inplace, generator=generator).train(module.training)
