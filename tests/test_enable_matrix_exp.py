"""torch.linalg.matrix_exp under carbon.enable (docs/enable.md, carbon/_enable_matrix_exp.py): scaling and squaring
with a degree-18 Taylor polynomial, against an exact oracle of the documented steps (Fractions, one rounding per
step); each matrix of a batch with its own number of squarings, as when alone; 1 vs 2 threads; close to torch's
float64 result; gradients and nn.utils.parametrizations.orthogonal's default map under strict mode."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import carbon
from tests.oracle import as_bits, round_value

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32
THETA = 3.010066362817634


def rn(x: Fraction) -> Fraction:
    return round_value(x, F32)


def matmul(a: list, b: list) -> list:
    n = len(a)
    return [[rn(sum((a[i][t] * b[t][j] for t in range(n)), Fraction(0))) for j in range(n)] for i in range(n)]


def expm_oracle(a: list) -> list:
    n = len(a)
    norm = max(rn(sum((abs(Fraction(a[i][j])) for i in range(n)), Fraction(0))) for j in range(n))
    s = 0
    while norm > Fraction(THETA) * 2 ** s:
        s += 1
    b = [[rn(Fraction(v) / 2 ** s) for v in row] for row in a]
    eye = [[Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    x = eye
    for k in range(18, 0, -1):
        bx = matmul(b, x)
        x = [[rn(eye[i][j] + rn(bx[i][j] / k)) for j in range(n)] for i in range(n)]
    for _ in range(s):
        x = matmul(x, x)
    return [[float(v) for v in row] for row in x], s


def matrices(seed: int) -> torch.Tensor:
    """Four 4 × 4 matrices whose norms need 0, 0, 3 and 6 squarings."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 4, 4, generator=g) * torch.tensor([1e-4, 0.5, 4.0, 30.0]).reshape(4, 1, 1)


def test_matrix_exp_is_the_documented_scaling_and_squaring(restore_num_threads):
    a = matrices(0)
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append(torch.linalg.matrix_exp(a))
            alone = torch.matrix_exp(a[2])
    assert torch.equal(as_bits(runs[0]), as_bits(runs[1]))
    assert torch.equal(as_bits(runs[0][2]), as_bits(alone))
    counts = []
    for i in range(4):
        want, s = expm_oracle(a[i].tolist())
        counts.append(s)
        assert runs[0][i].tolist() == want
    assert counts[0] == 0 and counts[2] > 0 and counts[3] > counts[2]


def test_matrix_exp_is_close_to_torchs_float64():
    a = matrices(1)
    with carbon.enabled():
        y = torch.linalg.matrix_exp(a)
    want = torch.linalg.matrix_exp(a.double())
    for got, ref in zip(y, want):
        assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_gradients_and_the_orthogonal_parametrization(restore_num_threads):
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        a = matrices(2)[1].clone().requires_grad_()
        with carbon.enabled(seed=0, strict=True):
            torch.linalg.matrix_exp(a).square().sum().backward()
            layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(8, 8))  # the matrix_exp map
            w = layer.weight.detach()
            layer(torch.randn(3, 8)).sum().backward()
        results.append((as_bits(a.grad), as_bits(w), as_bits(layer.parametrizations.weight.original.grad)))
    for one, two in zip(*results):
        assert torch.equal(one, two)
    a64 = matrices(2)[1].double().requires_grad_()
    torch.linalg.matrix_exp(a64).square().sum().backward()
    assert torch.allclose(a.grad.double(), a64.grad, rtol=1e-5, atol=1e-6 * a64.grad.abs().max().item())
    assert torch.allclose(w @ w.mT, torch.eye(8), atol=1e-5)


def test_empty_out_and_errors():
    out, a = torch.empty(0), matrices(3)[1]  # drawn outside carbon.enabled (inside, randn is carbon's)
    with carbon.enabled():
        assert torch.equal(torch.linalg.matrix_exp(torch.empty(2, 0, 0)), torch.empty(2, 0, 0))
        torch.ops.aten.linalg_matrix_exp.out(a, out=out)
        assert torch.equal(as_bits(out), as_bits(torch.linalg.matrix_exp(a)))
        with pytest.raises(carbon.NotExactError, match="linalg_matrix_exp in torch.float64"):
            torch.linalg.matrix_exp(torch.eye(3, dtype=torch.float64))
        with pytest.raises(RuntimeError):  # torch's own error: not square
            torch.linalg.matrix_exp(torch.ones(2, 3))
