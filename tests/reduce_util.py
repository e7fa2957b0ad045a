"""Shared helpers of the reduction tests (carbon.sum / carbon.mean)."""

from __future__ import annotations

import math

import torch

import carbon
from oracle import as_bits, assert_bits_equal, mean_bits, reduced_shape, sum_bits

ORACLES = {"sum": sum_bits, "mean": mean_bits}


def carbon_op(op: str):
    return getattr(carbon, op)


def call(op: str, x, dim=None, keepdim=False, dtype=None):
    """carbon.<op>(x, dim, keepdim, dtype=dtype), passing only what is set
    (so the defaults are exercised too)."""
    fn = carbon_op(op)
    kwargs = {}
    if dim is not None:
        kwargs["dim"] = dim
    if keepdim:
        kwargs["keepdim"] = True
    if dtype is not None:
        kwargs["dtype"] = dtype
    return fn(x, **kwargs)


def check(op: str, x, dim=None, keepdim=False, dtype=None, context=""):
    """carbon.<op> against the oracle: bits, dtype and shape (the shape also
    against torch's own reduction of the same call)."""
    out = call(op, x, dim, keepdim, dtype)
    ctx = f"{op}(shape={tuple(x.shape)}, {x.dtype}, dim={dim}, keepdim={keepdim}, dtype={dtype}) {context}"
    want_shape = reduced_shape(tuple(x.shape), dim, keepdim)
    torch_shape = tuple(getattr(torch, op)(torch.zeros(x.shape), dim=dim, keepdim=keepdim).shape)
    assert want_shape == torch_shape, f"{ctx}: oracle shape {want_shape} vs torch {torch_shape}"
    assert_bits_equal(out, ORACLES[op](x, dim, keepdim, dtype), ctx, dtype=dtype or x.dtype)
    return out


def same_bits(x, y, context=""):
    assert x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape), (
        f"{context}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
    # Flattened: on 0-dim tensors nonzero() has shape (1, 0) when the bits
    # differ, numel 0, so a 0-dim mismatch would pass unseen.
    bx, by = as_bits(x).reshape(-1), as_bits(y).reshape(-1)
    bad = (bx != by).nonzero().flatten()
    assert bad.numel() == 0, f"{context}: {bad.numel()} outputs differ, first at flat index {bad[:5].tolist()}"


def hand_bits(kind: str, dtype) -> int:
    return {torch.float32: {"+inf": 0x7F800000, "-inf": 0xFF800000, "nan": 0x7FC00000, "+0": 0, "-0": 0x80000000},
            torch.bfloat16: {"+inf": 0x7F80, "-inf": 0xFF80, "nan": 0x7FC0, "+0": 0, "-0": 0x8000},
            torch.float16: {"+inf": 0x7C00, "-inf": 0xFC00, "nan": 0x7E00, "+0": 0, "-0": 0x8000}}[dtype][kind]


def is_neg_zero(v: float) -> bool:
    return v == 0 and math.copysign(1.0, v) < 0


# Shapes from 0-D to 4-D, with size-0 and size-1 dimensions, and the dim
# arguments tried on each (every spelling: None, [], ints, tuples, lists).
SHAPES = [(), (7,), (0,), (1,), (5, 9), (3, 0), (0, 4), (1, 1), (4, 1, 6), (2, 3, 5), (2, 0, 3),
          (3, 2, 1, 4), (2, 1, 0, 3), (2, 3, 2, 5)]


def dims_for(ndim):
    if ndim == 0:
        return [None, 0, -1, []]
    out = [None, [], 0, -1]
    if ndim >= 2:
        out += [1, (0, ndim - 1), [-1, 0]]
    if ndim >= 3:
        out += [(0, 2), [1, -1], (1,)]
    if ndim == 4:
        out += [(1, 2, 3), [3, 0, 2], (0, 1, 2, 3)]
    return out


def check_memory_layouts(op: str, base, x4) -> None:
    """carbon.<op> of strided views of the 3-D `base` (and of the channels-last
    4-D `x4`) gives the same bits as of contiguous copies, for several dims,
    and the oracle's bits on one of them."""
    a, _, c = base.shape
    views = {
        "transposed": base.transpose(0, 2),
        "permuted storage": base.permute(2, 0, 1).contiguous().permute(1, 2, 0),
        "sliced with steps": base[::2, 1::3],
        "step slice last dim": base[:, :, ::2],
        "expanded (stride 0)": base[:, :1, :].expand(a, 5, c),
        "narrowed": base.narrow(1, 2, 5),
    }
    fn = carbon_op(op)
    for name, v in views.items():
        assert not v.is_contiguous(), name
        contiguous = v.contiguous()
        for dim in [None, 0, 1, 2, (0, 2), [-1, 0], (1, 2)]:
            for out_dtype in (None, torch.float32):
                same_bits(fn(v, dim, dtype=out_dtype), fn(contiguous, dim, dtype=out_dtype), f"{name}, dim {dim}")
        check(op, v, (0, 2), context=name)
    for dim in [1, (2, 3), (0, 2, 3), None]:
        same_bits(fn(x4, dim, keepdim=True), fn(x4.contiguous(), dim, keepdim=True), f"channels_last {dim}")
