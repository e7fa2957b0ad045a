"""Convolutions under carbon.enable (contract §3, "Convolutions"): the forward
output and the input, weight and bias gradients of conv1d/2d/3d equal the
exact-sum oracle (tests/conv_reference.py) bit for bit, for strides, padding,
dilation and groups; a sample's output does not depend on its batch; the
same bits at 1 and 2 threads; transposed convolutions likewise; float64 is
refused in strict mode."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import carbon
from tests import conv_reference as ref
from tests.oracle import as_bits, assert_bits_equal

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# (N, C, O, input size, kernel, stride, padding, dilation, groups)
CASES = [
    (2, 3, 4, (9,), (3,), (1,), (0,), (1,), 1),
    (2, 4, 6, (11,), (3,), (2,), (2,), (2,), 2),              # stride leaves a remainder: trailing inputs
    (2, 3, 2, (6, 7), (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (1, 4, 4, (7, 6), (2, 3), (3, 1), (1, 0), (2, 1), 4),     # depthwise
    (1, 2, 3, (4, 5, 4), (2, 3, 2), (1, 2, 1), (0, 1, 1), (1, 1, 2), 1),
]


def _randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.fixture(autouse=True)
def _always_disabled_after():
    yield
    carbon.disable()


def _run(x, w, b, g, stride, padding, dilation, groups):
    """Forward and backward under carbon.enable; (y, dx, dw, db)."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    with carbon.enabled():
        y = CONV[x.dim() - 2](x, w, b, stride, padding, dilation, groups)
        y.backward(g)
    return y.detach(), x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[3])}d-s{c[5]}-p{c[6]}-d{c[7]}-g{c[8]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_gradients_equal_the_exact_oracle(case, dtype):
    n, c, o, size, kernel, stride, padding, dilation, groups = case
    x = _randn(n, c, *size, dtype=dtype, seed=1)
    w = _randn(o, c // groups, *kernel, dtype=dtype, seed=2)
    b = _randn(o, dtype=dtype, seed=3)
    out = ref._out_size(list(size), list(kernel), stride, padding, dilation)
    g = _randn(n, o, *out, dtype=dtype, seed=4)
    y, dx, dw, db = _run(x, w, b, g, stride, padding, dilation, groups)
    assert_bits_equal(y, ref.forward_bits(x, w, b, stride, padding, dilation, groups), "forward", dtype=dtype)
    assert_bits_equal(dx, ref.input_grad_bits(g, x, w, stride, padding, dilation, groups), "input gradient", dtype=dtype)
    assert_bits_equal(dw, ref.weight_grad_bits(g, x, w, stride, padding, dilation, groups), "weight gradient",
                      dtype=dtype)
    assert_bits_equal(db, ref.bias_grad_bits(g), "bias gradient", dtype=dtype)


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_one_element_argument_lists_stand_for_every_dimension(spatial):
    """F.conv3d(..., padding="valid") reaches aten.convolution with padding [0]; stride (2,) and dilation
    (1,) given as one-element lists likewise: each stands for every spatial dimension, as in torch."""
    size, kernel = (7, 6, 5)[:spatial], (3, 2, 2)[:spatial]
    x, w, b = _randn(2, 2, *size, seed=11), _randn(3, 2, *kernel, seed=12), _randn(3, seed=13)
    out = ref._out_size(list(size), list(kernel), [2] * spatial, [0] * spatial, [1] * spatial)
    g = _randn(2, 3, *out, seed=14)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    with carbon.enabled():
        y = CONV[spatial](x, w, b, stride=2, padding="valid")
        y.backward(g)
    full = [2] * spatial, [0] * spatial, [1] * spatial
    assert_bits_equal(y.detach(), ref.forward_bits(x.detach(), w.detach(), b, *full, 1), "forward")
    assert_bits_equal(x.grad, ref.input_grad_bits(g, x.detach(), w.detach(), *full, 1), "input gradient")
    assert_bits_equal(w.grad, ref.weight_grad_bits(g, x.detach(), w.detach(), *full, 1), "weight gradient")


def test_without_bias_and_with_special_values():
    x = _randn(2, 2, 6, 6, seed=5)
    x[0, 0, 2, 3] = math.nan
    x[1, 1, 0, 0] = math.inf
    x[1, 0] = -0.0                 # a whole channel of −0: window sums of ±0 terms
    w = _randn(3, 2, 3, 3, seed=6)
    w[2] = -w[2].abs()             # all negative: −0 · negative = +0 terms, but +0 padding too
    g = _randn(2, 3, 6, 6, seed=7)
    g[0, 1, 4, 4] = -math.inf
    y, dx, dw, _ = _run(x, w, None, g, [1, 1], [1, 1], [1, 1], 1)
    assert_bits_equal(y, ref.forward_bits(x, w, None, [1, 1], [1, 1], [1, 1], 1), "forward")
    assert_bits_equal(dx, ref.input_grad_bits(g, x, w, [1, 1], [1, 1], [1, 1], 1), "input gradient")
    assert_bits_equal(dw, ref.weight_grad_bits(g, x, w, [1, 1], [1, 1], [1, 1], 1), "weight gradient")


def test_each_output_is_rounded_once_from_the_exact_sum():
    # 1 + 2^-24 + 2^-80 must round up to 1 + 2^-23; a float64 sum first (1 + 2^-24, a tie) would give 1.
    x = torch.tensor([[[1.0, 2.0**-24, 2.0**-80, 2.0**60, -(2.0**60)]]])
    w = torch.tensor([[[1.0, 1.0, 1.0]]])
    y, _, _, _ = _run(x, w, None, torch.ones(1, 1, 3), [1], [0], [1], 1)
    assert y[0, 0, 0].item() == 1.0 + 2.0**-23
    assert y[0, 0, 2].item() == 2.0**-80  # 2^-80 + 2^60 − 2^60
    assert_bits_equal(y, ref.forward_bits(x, w, None, [1], [0], [1], 1), "forward")


def test_a_sample_does_not_depend_on_its_batch():
    conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
    x = _randn(6, 3, 12, 12, seed=8)
    with carbon.enabled():
        batch = conv(x)
        alone = [conv(x[i:i + 1]) for i in range(6)]
    for i in range(6):
        assert torch.equal(as_bits(batch[i:i + 1]), as_bits(alone[i])), f"sample {i}"


def test_a_small_cnn_trains_to_the_same_bits_at_one_and_two_threads(restore_num_threads):
    def train(threads):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0):
            model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GELU(), nn.Conv2d(4, 4, 3, stride=2, groups=2),
                                  nn.Flatten(), nn.Linear(4 * 7 * 7, 10))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            x, t = torch.randn(16, 1, 16, 16), torch.randint(0, 10, (16,))
            for _ in range(3):
                opt.zero_grad()
                F.cross_entropy(model(x), t).backward()
                opt.step()
        return [as_bits(p) for p in model.parameters()]
    one, two = train(1), train(2)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


# (N, Cin, Cout, input size, kernel, stride, padding, output_padding, dilation, groups)
TRANSPOSED = [
    (2, 3, 4, (6,), (3,), (2,), (1,), (1,), (1,), 1),
    (2, 4, 6, (4, 5), (3, 2), (2, 1), (1, 0), (1, 0), (1, 2), 2),
    (1, 2, 2, (3, 2, 3), (2, 2, 2), (2, 1, 2), (0, 1, 0), (0, 0, 1), (1, 1, 1), 1),
    # output_padding >= stride (allowed while below the dilation): the gradients' windows stop at x's size
    (2, 2, 4, (4, 4), (4, 5), (3, 2), (1, 2), (2, 3), (4, 4), 2),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=lambda c: f"{len(c[3])}d-s{c[5]}-p{c[6]}-op{c[7]}-g{c[9]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_convolution_equals_the_exact_oracle(case, dtype):
    """ConvTranspose's output is the input gradient of the convolution from its output back to x (bias
    inside the rounding); its input gradient is that convolution of g; its weight gradient the
    convolution's weight gradient with g as the windowed input and x as the gradient."""
    n, ci, co, size, kernel, stride, padding, out_pad, dilation, groups = case
    x = _randn(n, ci, *size, dtype=dtype, seed=21)
    w = _randn(ci, co // groups, *kernel, dtype=dtype, seed=22)
    b = _randn(co, dtype=dtype, seed=23)
    conv_t = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(size)]
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    with carbon.enabled():
        y = conv_t(*leaves, stride, padding, out_pad, groups, dilation)
    g = _randn(*y.shape, dtype=dtype, seed=24)
    with carbon.enabled():
        y.backward(g)
    out_like = torch.empty(y.shape, dtype=dtype)
    assert_bits_equal(y.detach(), ref.input_grad_bits(x, out_like, w, stride, padding, dilation, groups, bias=b),
                      "forward", dtype=dtype)
    # the input gradient is the convolution of g at x's positions (with output_padding >= stride, g has
    # room for more windows than x has positions: those belong to no input)
    input_grad = ref.forward_bits(g, w, None, stride, padding, dilation, groups)
    input_grad = input_grad[(slice(None), slice(None)) + tuple(slice(0, n) for n in x.shape[2:])]
    assert_bits_equal(leaves[0].grad, input_grad, "input gradient")
    assert_bits_equal(leaves[1].grad, ref.weight_grad_bits(x, g, w, stride, padding, dilation, groups),
                      "weight gradient")
    assert_bits_equal(leaves[2].grad, ref.bias_grad_bits(g), "bias gradient")


def test_float64_is_refused():
    x, w = _randn(1, 2, 5, 5), _randn(3, 2, 3, 3)
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="float64"):
        F.conv2d(x.double(), w.double())


def test_empty_batch():
    x, w, b = torch.zeros(0, 2, 5, 5), _randn(3, 2, 3, 3), _randn(3)
    with carbon.enabled():
        y = F.conv2d(x, w, b)
    assert y.shape == (0, 3, 3, 3)
