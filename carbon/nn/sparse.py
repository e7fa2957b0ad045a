"""carbon.nn.Embedding: torch.nn.Embedding whose weight gradient is an exact
per-row sum, rounded once (carbon.embedding)."""

from __future__ import annotations

import torch
from torch import Tensor

from carbon.nn._twin import shared_twin
from carbon.scatter import embedding


class Embedding(torch.nn.Embedding):
    """Same constructor, parameter, initialization and state_dict as
    ``torch.nn.Embedding``; ``forward`` is :func:`carbon.embedding`.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse=True`` are not
    supported (ValueError)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._check_options()

    def _check_options(self) -> None:
        if self.max_norm is not None:
            raise ValueError("carbon.nn.Embedding: max_norm is not supported")
        if self.sparse:
            raise ValueError("carbon.nn.Embedding: sparse gradients are not supported")
        if self.scale_grad_by_freq:
            raise ValueError("carbon.nn.Embedding: scale_grad_by_freq is not supported")

    def forward(self, input: Tensor) -> Tensor:
        return embedding(input, self.weight, self.padding_idx)

    @classmethod
    def from_torch(cls, module: torch.nn.Embedding) -> "Embedding":
        """A carbon.nn.Embedding that *shares* ``module``'s weight (no copy)."""
        twin = shared_twin(cls, module, torch.nn.Embedding, ("num_embeddings", "embedding_dim", "padding_idx",
                           "max_norm", "norm_type", "scale_grad_by_freq", "sparse"), ("weight",))
        twin._check_options()
        return twin
