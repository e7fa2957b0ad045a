"""Mixture-of-experts products under carbon.enable (docs/enable.md): torch._grouped_mm / F.grouped_mm give every
group's product correctly rounded (the exact oracle of tests/oracle.py, group by group), forward and backward,
at 1 and 2 threads; a tiny Mixtral trains a step under strict mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import as_bits, mm_bits

THREADS = [1, 2]


pytestmark = pytest.mark.usefixtures("restore_num_threads", "carbon_disabled_after")


def _randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _zero_bits(*shape, dtype=torch.float32):
    return as_bits(torch.zeros(*shape, dtype=dtype))


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                             (torch.bfloat16, torch.float32)])
def test_rows_grouped_by_expert(threads, dtype, out_dtype):
    """(ΣM, K) @ (G, K, N): rows [0, 3) by expert 0, none by expert 1, [3, 9) by expert 2; rows 9, 10 past the
    last offset are +0."""
    torch.set_num_threads(threads)
    x, w = _randn(11, 24, seed=1, dtype=dtype), _randn(3, 24, 5, seed=2, dtype=dtype)
    offs = torch.tensor([3, 3, 9], dtype=torch.int32)
    with carbon.enabled():
        got = torch._grouped_mm(x, w, offs=offs, out_dtype=out_dtype)
        functional = F.grouped_mm(x, w, offs=offs, out_dtype=out_dtype)
    want = torch.cat([mm_bits(x[:3], w[0], out_dtype=out_dtype), mm_bits(x[3:9], w[2], out_dtype=out_dtype),
                      _zero_bits(2, 5, dtype=out_dtype or dtype)])
    assert torch.equal(as_bits(got), want)
    assert torch.equal(as_bits(functional), want)


@pytest.mark.parametrize("threads", THREADS)
def test_gradients_are_grouped_products_too(threads):
    """The backward is _grouped_mm again: dx by the transposed experts, dw[g] = x_gᵀ · g_g over the group's
    rows (the 2-d × 2-d form, grouped along the shared dimension; an empty group gets +0)."""
    torch.set_num_threads(threads)
    x, w = _randn(9, 16, seed=3), _randn(3, 16, 4, seed=4)
    g = _randn(9, 4, seed=5)
    offs = torch.tensor([4, 4, 9], dtype=torch.int32)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    with carbon.enabled():
        torch._grouped_mm(xl, wl, offs=offs).backward(g)
    dx = torch.cat([mm_bits(g[:4], w[0].t()), mm_bits(g[4:], w[2].t())])
    dw = torch.stack([mm_bits(x[:4].t(), g[:4]), _zero_bits(16, 4), mm_bits(x[4:].t(), g[4:])])
    assert torch.equal(as_bits(xl.grad), dx)
    assert torch.equal(as_bits(wl.grad), dw)


def test_columns_grouped_and_batched_forms():
    x3, w2 = _randn(2, 3, 8, seed=6), _randn(8, 7, seed=7)
    offs = torch.tensor([2, 5], dtype=torch.int32)  # columns [0, 2) by x3[0], [2, 5) by x3[1], 5 and 6 are +0
    a, b = _randn(2, 3, 8, seed=8), _randn(2, 8, 4, seed=9)
    with carbon.enabled():
        cols = torch._grouped_mm(x3, w2, offs=offs)
        batched = torch._grouped_mm(a, b)
    assert torch.equal(as_bits(cols), torch.cat([mm_bits(x3[0], w2[:, :2]), mm_bits(x3[1], w2[:, 2:5]),
                                                 _zero_bits(3, 2)], 1))
    assert torch.equal(as_bits(batched), torch.stack([mm_bits(a[i], b[i]) for i in range(2)]))


def test_bad_offsets_and_bias_are_refused():
    x, w = _randn(6, 8, seed=10), _randn(2, 8, 3, seed=11)
    with carbon.enabled():
        with pytest.raises(ValueError, match="non-decreasing"):
            torch._grouped_mm(x, w, offs=torch.tensor([4, 2], dtype=torch.int32))
        with pytest.raises(ValueError, match="at most 6"):
            torch._grouped_mm(x, w, offs=torch.tensor([4, 7], dtype=torch.int32))
        with pytest.raises(carbon.NotExactError, match="bias"):
            torch._grouped_mm(x, w, offs=torch.tensor([4, 6], dtype=torch.int32), bias=_randn(2, 3, seed=12))


def test_integer_prefix_sums_of_float_counts_pass():
    """MoE routers turn float token counts into int32 offsets with cumsum(dtype=int32): torch converts first,
    then adds integers, which is exact."""
    counts = torch.tensor([3.0, 0.0, 6.0, 2.0])
    with carbon.enabled():
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
    assert offs.tolist() == [3, 3, 9, 11] and offs.dtype == torch.int32


def test_offsets_are_checked_as_torch_does():
    x, w = _randn(6, 8, seed=20), _randn(2, 8, 3, seed=21)
    with carbon.enabled():
        with pytest.raises(RuntimeError, match="int32"):
            torch._grouped_mm(x, w, offs=torch.tensor([3, 6]))
        with pytest.raises(RuntimeError, match="batch sizes"):
            torch._grouped_mm(x, w, offs=torch.tensor([6], dtype=torch.int32))


def test_products_with_an_out_dtype():
    """mm / bmm / addmm / baddbmm's .dtype overloads (bfloat16 operands, a float32 result; CUDA-only in torch):
    the exact product rounded once to out_dtype."""
    a, b = _randn(4, 16, seed=22, dtype=torch.bfloat16), _randn(16, 5, seed=23, dtype=torch.bfloat16)
    bias = _randn(4, 5, seed=24)
    with carbon.enabled():
        product = torch.ops.aten.mm.dtype(a, b, torch.float32)
        batched = torch.ops.aten.bmm.dtype(a[None], b[None], torch.float32)
        biased = torch.ops.aten.addmm.dtype(bias, a, b, torch.float32)
    want = mm_bits(a, b, out_dtype=torch.float32)
    assert product.dtype == torch.float32 and torch.equal(as_bits(product), want)
    assert torch.equal(as_bits(batched[0]), want)
    assert torch.equal(as_bits(biased), mm_bits(a, b, bias, out_dtype=torch.float32))
