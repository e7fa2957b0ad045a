"""Independent references for the indexed accumulations: every destination
element's result is computed from its list of terms by the exact oracle
(oracle.row_sum_bits: exact rational sum, one rounding, the contract's
special-value and signed-zero rules). Plain Python loops; keep inputs small."""

from __future__ import annotations

import math
from typing import List, Optional

import torch

from oracle import bits_tensor, row_sum_bits


def _rows(t: torch.Tensor, dim: int) -> List[list]:
    """t with `dim` moved first and the rest flattened, as lists of floats."""
    rest = math.prod(s for i, s in enumerate(t.shape) if i != dim)
    return t.detach().cpu().double().movedim(dim, 0).reshape(t.shape[dim], rest).tolist()


def _from_rows(bits_rows: list, shape, dim: int, dtype: torch.dtype) -> torch.Tensor:
    moved = [shape[dim]] + [s for i, s in enumerate(shape) if i != dim]
    return bits_tensor(bits_rows, dtype).reshape(moved).movedim(0, dim).contiguous()


def index_add_bits(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    dim = dim % self.dim()
    s, src = _rows(self, dim), _rows(source, dim)
    idx = index.reshape(-1).tolist()
    out = []
    for j, row in enumerate(s):
        ks = [k for k, i in enumerate(idx) if i == j]
        out.append([row_sum_bits([v] + [src[k][r] for k in ks], self.dtype) for r, v in enumerate(row)])
    return _from_rows(out, self.shape, dim, self.dtype)


def scatter_add_bits(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    dim = dim % self.dim()
    terms = {p: [v] for p, v in zip(_positions(self.shape), self.double().reshape(-1).tolist())}
    srcd = src.double()
    for p in _positions(index.shape):
        q = list(p)
        q[dim] = int(index[p])
        terms[tuple(q)].append(float(srcd[p]))
    bits = [row_sum_bits(terms[p], self.dtype) for p in _positions(self.shape)]
    return bits_tensor(bits, self.dtype).reshape(self.shape)


def embedding_grad_bits(grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                        padding_idx: Optional[int], dtype: torch.dtype) -> torch.Tensor:
    g = grad.detach().cpu().double().reshape(-1, grad.shape[-1]).tolist()
    idx = indices.reshape(-1).tolist()
    out = []
    for j in range(num_weights):
        rows = [g[k] for k, i in enumerate(idx) if i == j]
        if j == padding_idx:
            out.append([0] * grad.shape[-1])
        else:
            out.append([row_sum_bits([r[c] for r in rows], dtype) for c in range(grad.shape[-1])])
    return bits_tensor(out, dtype).reshape(num_weights, grad.shape[-1])


def _positions(shape):
    import itertools
    return itertools.product(*[range(s) for s in shape])
