"""carbon.enable under torch.inference_mode (docs/enable.md): there no autograd key decomposes composite ops
such as linear or matmul before carbon's dispatch mode sees them, so carbon runs their decompositions itself.
The results are the bits of the same calls under torch.no_grad (which the other tests check against exact
oracles) and of the exact oracle for a plain product."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import carbon
from tests.oracle import as_bits, linear_bits


pytestmark = pytest.mark.usefixtures("carbon_disabled_after")


def _data(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_linear_and_matmul_in_inference_mode_are_exact():
    x, w, b = _data(5, 3, 16, seed=0), _data(8, 16, seed=1), _data(8, seed=2)
    with carbon.enabled(), torch.inference_mode():
        y = torch._C._nn.linear(x, w, b)
        z = torch.matmul(x, w.t())
    assert torch.equal(as_bits(y), linear_bits(x, w, b))
    assert torch.equal(as_bits(z), linear_bits(x, w))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_inference_mode_equals_no_grad(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = _data(3, 7, 32, seed=3)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    with carbon.enabled():
        with torch.no_grad():
            want = model(x, mask=mask, is_causal=True)
        with torch.inference_mode():
            got = model(x, mask=mask, is_causal=True)
    assert torch.equal(as_bits(got), as_bits(want))
