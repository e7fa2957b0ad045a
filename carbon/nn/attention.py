"""carbon.nn.CausalSelfAttention: a GPT-style causal self-attention block on
Carbon's exact ops (carbon.nn.Linear, carbon.scaled_dot_product_attention,
carbon.nn.Dropout)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from carbon.attention import scaled_dot_product_attention
from carbon.nn.dropout import Dropout
from carbon.nn.linear import Linear
from carbon.random import Generator

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(torch.nn.Module):
    """Multi-head causal self-attention over x of shape [..., T, d_model]::

        q, k, v = split(qkv(x), 3)                    one Linear d_model -> 3 d_model
        heads   = carbon.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      dropout_p=dropout if training else 0)
        y       = resid_dropout(proj(merge(heads)))   Linear d_model -> d_model

    with n_heads heads of size d_model / n_heads (default scale
    1/sqrt(head size)). Parameters: ``qkv.weight`` [3 d_model, d_model]
    (rows: the q, then k, then v projections, heads contiguous within each),
    ``qkv.bias``, ``proj.weight``, ``proj.bias`` (biases only with
    ``bias=True``), initialized as torch.nn.Linear. Attention dropout draws
    from carbon.default_generator (as carbon.scaled_dot_product_attention);
    the residual dropout from ``generator`` (default: the same)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, *,
                 generator: Optional[Generator] = None, device=None, dtype=None) -> None:
        super().__init__()
        if d_model <= 0 or n_heads <= 0:
            raise ValueError(f"carbon.nn.CausalSelfAttention: d_model and n_heads must be positive, got {d_model}, {n_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"carbon.nn.CausalSelfAttention: d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"carbon.nn.CausalSelfAttention: dropout must be in [0, 1], got {dropout}")
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, float(dropout)
        self.qkv = Linear(d_model, 3 * d_model, bias=bias, device=device, dtype=dtype)
        self.proj = Linear(d_model, d_model, bias=bias, device=device, dtype=dtype)
        self.resid_dropout = Dropout(dropout, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"carbon.nn.CausalSelfAttention: expected input [..., T, {self.d_model}], got {tuple(x.shape)}")
        lead, T = x.shape[:-2], x.shape[-2]
        h, hd = self.n_heads, self.d_model // self.n_heads
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)
        # [..., T, d] -> [..., h, T, hd]
        q, k, v = (t.reshape(*lead, T, h, hd).transpose(-3, -2) for t in (q, k, v))
        y = scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(-3, -2).reshape(*lead, T, self.d_model)
        return self.resid_dropout(self.proj(y))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"
