"""carbon.nn.LayerNorm and carbon.nn.RMSNorm: torch.nn's modules with a
bit-exact forward and backward (carbon.layer_norm / carbon.rms_norm)."""

from __future__ import annotations

import torch
from torch import Tensor

from carbon.nn._twin import shared_twin
from carbon.norm import layer_norm, rms_norm


class LayerNorm(torch.nn.LayerNorm):
    """Same constructor, parameters, initialization and state_dict as
    ``torch.nn.LayerNorm``; ``forward`` is :func:`carbon.layer_norm`."""

    def forward(self, input: Tensor) -> Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    @classmethod
    def from_torch(cls, module: torch.nn.LayerNorm) -> "LayerNorm":
        """A carbon.nn.LayerNorm that *shares* ``module``'s parameters."""
        return shared_twin(cls, module, torch.nn.LayerNorm, ("normalized_shape", "eps", "elementwise_affine"),
                           ("weight", "bias"))


class RMSNorm(torch.nn.RMSNorm):
    """Same constructor, parameters, initialization and state_dict as
    ``torch.nn.RMSNorm``; ``forward`` is :func:`carbon.rms_norm` (eps None:
    torch's default, the float32 machine epsilon)."""

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    @classmethod
    def from_torch(cls, module: torch.nn.RMSNorm) -> "RMSNorm":
        """A carbon.nn.RMSNorm that *shares* ``module``'s parameters."""
        return shared_twin(cls, module, torch.nn.RMSNorm, ("normalized_shape", "eps", "elementwise_affine"),
                           ("weight",))
