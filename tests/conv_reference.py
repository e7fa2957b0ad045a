"""Convolutions by the contract's definition (docs/contract.md §3,
"Convolutions"), written independently of carbon/_conv.py: for every output
element, the list of its terms by explicit index arithmetic, then the integer
oracle's exact sum with one rounding. Slow; small tensors only."""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence

import torch

from tests.oracle import bits_tensor, exact_sum_bits


def _values(t: torch.Tensor) -> list:
    return t.detach().double().tolist()


def _at(nested, index: Sequence[int]):
    for i in index:
        nested = nested[i]
    return nested


def _out_size(size, kernel, stride, padding, dilation) -> List[int]:
    return [(size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(len(size))]


def _padded_input(xv, n, c, position, size) -> float:
    """x at an index of the zero-padded input (given unpadded): +0 outside."""
    if all(0 <= position[i] < size[i] for i in range(len(size))):
        return _at(xv[n][c], position)
    return 0.0


def forward_bits(x, w, bias, stride, padding, dilation, groups) -> torch.Tensor:
    """out[n, o, p] = RN(bias[o] + Σ_{c < Cg, k} xpad[n, g·Cg + c, p·s + k·dil − pad] · w[o, c, k])."""
    xv, wv = _values(x), _values(w)
    bv = None if bias is None else _values(bias)
    n_, c_ = x.shape[:2]
    o_, cg = w.shape[:2]
    size, kernel = list(x.shape[2:]), list(w.shape[2:])
    og = o_ // groups
    out = _out_size(size, kernel, stride, padding, dilation)
    result = []
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for p in itertools.product(*map(range, out)):
                terms = []
                for c in range(cg):
                    for k in itertools.product(*map(range, kernel)):
                        pos = [p[i] * stride[i] + k[i] * dilation[i] - padding[i] for i in range(len(size))]
                        terms.append((_padded_input(xv, n, g * cg + c, pos, size), _at(wv[o][c], k)))
                if bv is not None:
                    terms.append((bv[o],))
                result.append(exact_sum_bits(terms, x.dtype))
    return bits_tensor(result, x.dtype).reshape(n_, o_, *out)


def input_grad_bits(grad, x, w, stride, padding, dilation, groups, bias=None) -> torch.Tensor:
    """dx[n, ci, i] = RN(Σ_{o in ci's group, k} gs[n, o, i + pad − k·dil] · w[o, ci − g·Cg, k]) with
    gs[u] = grad[u / s] where every u_d is a multiple of s_d in [0, (OUT_d − 1)·s_d], else +0.
    x gives only the shape and dtype. With `bias` (one more term per ci) this is ConvTranspose's
    output for the input `grad`."""
    gv, wv = _values(grad), _values(w)
    bv = None if bias is None else _values(bias)
    n_, c_ = x.shape[:2]
    o_, cg = w.shape[:2]
    size, kernel, out = list(x.shape[2:]), list(w.shape[2:]), list(grad.shape[2:])
    og = o_ // groups
    d = len(size)
    result = []
    for n in range(n_):
        for ci in range(c_):
            g, c = ci // cg, ci % cg
            for i in itertools.product(*map(range, size)):
                terms = []
                for o in range(g * og, (g + 1) * og):
                    for k in itertools.product(*map(range, kernel)):
                        u = [i[j] + padding[j] - k[j] * dilation[j] for j in range(d)]
                        inside = all(u[j] >= 0 and u[j] % stride[j] == 0 and u[j] // stride[j] < out[j] for j in range(d))
                        value = _at(gv[n][o], [u[j] // stride[j] for j in range(d)]) if inside else 0.0
                        terms.append((value, _at(wv[o][c], k)))
                if bv is not None:
                    terms.append((bv[ci],))
                result.append(exact_sum_bits(terms, x.dtype))
    return bits_tensor(result, x.dtype).reshape(x.shape)


def weight_grad_bits(grad, x, w, stride, padding, dilation, groups) -> torch.Tensor:
    """dw[o, c, k] = RN(Σ_{n, p} grad[n, o, p] · xpad[n, g·Cg + c, p·s + k·dil − pad]), one sum over the batch."""
    gv, xv = _values(grad), _values(x)
    n_ = x.shape[0]
    o_, cg = w.shape[:2]
    size, kernel, out = list(x.shape[2:]), list(w.shape[2:]), list(grad.shape[2:])
    og = o_ // groups
    result = []
    for o in range(o_):
        g = o // og
        for c in range(cg):
            for k in itertools.product(*map(range, kernel)):
                terms = []
                for n in range(n_):
                    for p in itertools.product(*map(range, out)):
                        pos = [p[i] * stride[i] + k[i] * dilation[i] - padding[i] for i in range(len(size))]
                        terms.append((_at(gv[n][o], p), _padded_input(xv, n, g * cg + c, pos, size)))
                result.append(exact_sum_bits(terms, w.dtype))
    return bits_tensor(result, w.dtype).reshape(w.shape)


def bias_grad_bits(grad, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """db[o] = RN(Σ_{n, p} grad[n, o, p])."""
    dtype = dtype or grad.dtype
    per_channel = grad.detach().transpose(0, 1).reshape(grad.shape[1], -1).double().tolist()
    return bits_tensor([exact_sum_bits([(v,) for v in row], dtype) for row in per_channel], dtype)
