"""carbon.dropout: ``torch.nn.functional.dropout`` with a keep-mask drawn by
carbon's counter-based generator (docs/contract.md §10):

    keep_i = (u_i >= p),  u_i = (w_i >> 8) 2^-24 from Philox4x32-10 at (seed, offset, i)
    y_i    = RN(x_i / (1 - p)) if keep_i else +0         (binary64 division, one rounding)

The backward regenerates the same mask from the saved state (seed, offset):
dx_i = RN(g_i / (1 - p)) if keep_i else +0. Same bits on every device. The
draw's state is a tensor (Generator.next_state), so a compiled forward that
drops out neither recompiles nor reads the state on the host.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from carbon.random import Generator, _generator

__all__ = ["dropout"]


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            generator: Optional[Generator] = None) -> Tensor:
    """``torch.nn.functional.dropout(input, p, training, inplace)``. With
    ``training=False`` the input is returned as is (no draw). Otherwise one
    draw of the generator (default: carbon.default_generator); p = 0 keeps
    every element (y = x, NaNs canonical), p = 1 gives zeros. ``inplace``
    copies the (out-of-place) result into the input, except where torch's
    ``dropout_`` leaves the input untouched (p = 0 or no elements): there the
    input is returned unwritten (the draw is still taken, so later draws do
    not depend on p), and a tensor that autograd saved, such as softmax's
    output before ``nn.Dropout(0.0, inplace=True)``, keeps its version."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"carbon.dropout: p must be in [0, 1], got {p}")
    if not training:
        return input
    state = _generator(generator).next_state()
    if inplace and (p == 0.0 or input.numel() == 0):
        return input
    out = torch.ops.carbon.dropout.state(input, p, state)
    return input.copy_(out) if inplace else out
