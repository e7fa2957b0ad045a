"""nn.Bilinear / F.bilinear under carbon.enable (aten._trilinear, docs/enable.md): two exact sums, each rounded
once, checked against an exact Fraction oracle; gradients run under strict mode with the same bits at 1 and 2
threads, and a row alone gives its bits in the batch."""

from fractions import Fraction

import pytest
import torch

import carbon
from tests.oracle import as_bits, round_value as rn


def bilinear_oracle(x1, x2, w, bias, dtype) -> list:
    """buf[b, o, j] = RN(Σᵢ x1[b, i]·W[o, i, j]); y[b, o] = RN(RN(Σⱼ buf·x2[b, j]) + bias[o])."""
    out = []
    for a, c in zip(x1, x2):
        row = []
        for o, wo in enumerate(w):
            buf = [rn(sum((Fraction(a[i]) * Fraction(wo[i][j]) for i in range(len(a))), Fraction(0)), dtype)
                   for j in range(len(c))]
            y = rn(sum((buf[j] * Fraction(c[j]) for j in range(len(c))), Fraction(0)), dtype)
            row.append(float(rn(y + Fraction(bias[o]), dtype)) if bias is not None else float(y))
        out.append(row)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bilinear_is_two_exact_sums(dtype, carbon_disabled_after):
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(6, 5, generator=g).to(dtype), torch.randn(6, 4, generator=g).to(dtype)
    w, bias = torch.randn(3, 5, 4, generator=g).to(dtype), torch.randn(3, generator=g).to(dtype)
    with carbon.enabled():
        y = torch.nn.functional.bilinear(x1, x2, w, bias)
        y_nobias = torch.nn.functional.bilinear(x1, x2, w)
    want = bilinear_oracle(x1.float().tolist(), x2.float().tolist(), w.float().tolist(), bias.float().tolist(), dtype)
    assert y.dtype == dtype and y.float().tolist() == want
    assert y_nobias.float().tolist() == bilinear_oracle(x1.float().tolist(), x2.float().tolist(), w.float().tolist(),
                                                        None, dtype)


def test_bilinear_gradients_threads_and_batch_invariance(restore_num_threads, carbon_disabled_after):
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            m = torch.nn.Bilinear(16, 12, 8)
            x1, x2 = torch.randn(32, 16, requires_grad=True), torch.randn(32, 12, requires_grad=True)
            y = m(x1, x2)
            alone = m(x1[5:6], x2[5:6])
            (y.square().sum()).backward()
            runs.append([t.detach().clone() for t in (y, x1.grad, x2.grad, m.weight.grad, m.bias.grad)])
            assert torch.equal(as_bits(alone), as_bits(y[5:6]))
    for a, b in zip(*runs):
        assert torch.equal(as_bits(a), as_bits(b))
    with carbon.enabled():
        empty = torch.nn.functional.bilinear(torch.empty(0, 3), torch.empty(0, 2), torch.randn(4, 3, 2))
    assert empty.shape == (0, 4)
