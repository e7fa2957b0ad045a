"""carbon.matmul: torch.matmul's shape semantics (1-D, 2-D, N-D operands),
every output correctly rounded. Two N-D operands need equal batch shapes."""

import math

import pytest
import torch

import carbon
from data import BF16, F16, F32, generator, random_values
from oracle import assert_bits_equal, bmm_bits, mm_bits


def matmul_bits(a, b, out_dtype=None):
    """The oracle for torch.matmul semantics, batch element by batch element."""
    a2 = a[None] if a.dim() == 1 else a
    b2 = b[:, None] if b.dim() == 1 else b
    if a2.dim() == 2 and b2.dim() == 2:
        out = mm_bits(a2, b2, out_dtype=out_dtype)
    elif b2.dim() == 2:
        out = mm_bits(a2.reshape(-1, a2.shape[-1]), b2, out_dtype=out_dtype).reshape(*a2.shape[:-1], b2.shape[-1])
    else:
        batch = b2.shape[:-2]
        a3 = (a2.expand(*batch, *a2.shape) if a2.dim() == 2 else a2).reshape(-1, *a2.shape[-2:])
        out = bmm_bits(a3, b2.reshape(-1, *b2.shape[-2:]), out_dtype=out_dtype)
        out = out.reshape(*batch, a2.shape[-2], b2.shape[-1])
    if a.dim() == 1:
        out = out.squeeze(-2)
    if b.dim() == 1:
        out = out.squeeze(-1)
    return out


SHAPES = [
    ((7,), (7,)),  # dot product -> 0-D
    ((7,), (7, 3)),
    ((4, 7), (7,)),
    ((4, 7), (7, 3)),
    ((2, 4, 7), (7, 3)),
    ((2, 3, 4, 7), (7,)),
    ((7,), (2, 7, 3)),
    ((4, 7), (2, 3, 7, 5)),
    ((2, 4, 7), (2, 7, 3)),
    ((2, 3, 4, 7), (2, 3, 7, 5)),
]


@pytest.mark.parametrize("a_shape,b_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, BF16)])
def test_matmul_shapes_and_bits(a_shape, b_shape, dtype, out_dtype):
    g = generator(31)
    a, b = random_values(a_shape, dtype, g), random_values(b_shape, dtype, g)
    out = carbon.matmul(a, b, out_dtype=out_dtype)
    assert out.shape == torch.matmul(a.float(), b.float()).shape  # torch.matmul's shape semantics
    assert_bits_equal(out, matmul_bits(a, b, out_dtype), f"{a_shape} @ {b_shape}", dtype=out_dtype or dtype)


def test_matmul_refuses_to_broadcast_batch_dimensions():
    with pytest.raises(ValueError, match="carbon.matmul"):
        carbon.matmul(torch.zeros(1, 4, 7), torch.zeros(2, 7, 3))


def test_matmul_gradient_of_a_2d_operand_is_one_rounding_over_the_batch():
    """(2, 2, K) @ (K, N): b's gradient sums over both batches in ONE rounding.
    Batch 0 contributes 1 + 2^-24 (a tie), batch 1 2^-24 + 2^-60: exactly,
    1 + 2^-23 + 2^-60 -> 1 + 2^-23; rounding per batch would give 1."""
    a = torch.ones(2, 2, 1, requires_grad=True)
    b = torch.ones(1, 1, requires_grad=True)
    out = carbon.matmul(a, b)
    grad = torch.tensor([[[1.0], [2.0**-24]], [[2.0**-24], [2.0**-60]]])
    out.backward(grad)
    assert_bits_equal(b.grad, mm_bits(a.detach().reshape(4, 1).t(), grad.reshape(4, 1)))
    assert b.grad.item() == 1.0 + 2.0**-23


@pytest.mark.parametrize("x_shape,w_shape", [((0, 7), (3, 7)), ((2, 0, 7), (3, 7)), ((0, 2, 7), (3, 7)), ((4, 0), (3, 0))], ids=str)
def test_linear_with_empty_dimensions(x_shape, w_shape):
    x, w = torch.ones(x_shape), torch.ones(w_shape)
    bias = torch.tensor([-0.0, 1.0, 2.0])
    out = carbon.linear(x, w)
    assert out.shape == x_shape[:-1] + (3,)
    assert bool((out == 0).all()) and not bool(out.signbit().any())  # no terms: +0
    out = carbon.linear(x, w, bias)
    assert out.shape == x_shape[:-1] + (3,)
    if out.numel():  # K = 0: exactly the bias, -0 included
        rows = x.reshape(math.prod(x_shape[:-1]), x_shape[-1])
        assert_bits_equal(out, mm_bits(rows, w.t(), bias).reshape(out.shape))


def test_matmul_with_an_empty_batch():
    out = carbon.matmul(torch.ones(0, 4, 7), torch.ones(0, 7, 3))
    assert out.shape == (0, 4, 3)
    out = carbon.matmul(torch.ones(2, 0, 4, 7), torch.ones(2, 0, 7, 3))
    assert out.shape == (2, 0, 4, 3)
