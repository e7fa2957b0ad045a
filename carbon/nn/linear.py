"""carbon.nn.Linear: torch.nn.Linear with a correctly rounded forward and backward."""

from __future__ import annotations

import torch
from torch import Tensor

from carbon.nn._twin import shared_twin
from carbon.ops import linear


class Linear(torch.nn.Linear):
    """Same constructor, parameters, initialization and state_dict as
    ``torch.nn.Linear``; ``forward`` is :func:`carbon.linear`, so outputs and
    gradients are correctly rounded and identical on every device, batch size
    and thread count."""

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias)

    @classmethod
    def from_torch(cls, module: torch.nn.Linear) -> "Linear":
        """A carbon.nn.Linear that *shares* ``module``'s parameters (no copy,
        so an optimizer built on them keeps working)."""
        return shared_twin(cls, module, torch.nn.Linear, ("in_features", "out_features"), ("weight", "bias"))
