"""torch.linalg.eigh / eigvalsh under carbon.enable (docs/enable.md, carbon/_enable_eigh.py): the cyclic Jacobi
method with a fixed schedule, against an independent scalar evaluation of the documented steps (Python floats —
IEEE binary64 — and math.sqrt, correctly rounded), bit for bit; eigenvalues against LAPACK's float64 ones; only
the UPLO triangle read; a matrix alone vs in a batch, 1 vs 2 threads; gradients and a training loop under strict
mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import carbon
from carbon import _enable_eigh
from tests.oracle import as_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")


def schedule(n: int) -> list:
    """The circle method's rounds, written out here: index 0 fixed, the others rotating."""
    m = n + n % 2
    rounds = []
    for r in range(m - 1):
        order = [0] + [(r + k) % (m - 1) + 1 for k in range(m - 1)]
        pairs = [(min(order[i], order[m - 1 - i]), max(order[i], order[m - 1 - i])) for i in range(m // 2)]
        rounds.append([(p, q) for p, q in pairs if q < n])
    return rounds


def div(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def jacobi_oracle(a: list) -> tuple:
    """The documented sweeps in Python floats; (eigenvalues, eigenvectors as columns) rounded to float32."""
    n = len(a)
    a = [row[:] for row in a]
    v = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for _ in range(_enable_eigh.SWEEPS):
        for pairs in schedule(n):
            rot = []
            for p, q in pairs:
                apq = a[p][q]
                if apq == 0:
                    rot.append((p, q, 1.0, 0.0))
                    continue
                theta = div(a[q][q] - a[p][p], apq * 2.0)
                sigma = 1.0 if theta >= 0 else -1.0
                t = div(sigma, abs(theta) + math.sqrt(theta * theta + 1.0))
                c = 1.0 / math.sqrt(t * t + 1.0)
                rot.append((p, q, c, t * c))
            for m in (a, v):  # columns
                for p, q, c, s in rot:
                    for i in range(n):
                        xp, xq = m[i][p], m[i][q]
                        m[i][p], m[i][q] = c * xp - s * xq, s * xp + c * xq
            for p, q, c, s in rot:  # rows of A
                for j in range(n):
                    xp, xq = a[p][j], a[q][j]
                    a[p][j], a[q][j] = c * xp - s * xq, s * xp + c * xq
            for p, q, _, _ in rot:
                a[p][q] = a[q][p] = 0.0
    order = sorted(range(n), key=lambda i: (a[i][i], i))
    values = [float(np.float32(a[i][i])) for i in order]
    columns = []
    for i in order:
        col = [v[r][i] for r in range(n)]
        top = max(range(n), key=lambda r: (abs(col[r]), -r))
        sign = -1.0 if col[top] < 0 else 1.0
        columns.append([float(np.float32(sign * x)) for x in col])
    return values, [list(r) for r in zip(*columns)]


def symmetric(n: int, seed: int, batch: int = 1) -> torch.Tensor:
    m = torch.randn(batch, n, n, generator=torch.Generator().manual_seed(seed))
    return m + m.mT


@pytest.mark.parametrize("n", [1, 2, 5, 6])
@pytest.mark.parametrize("sweeps", [1, 2, None])
def test_eigh_is_the_documented_jacobi_method(n, sweeps, monkeypatch):
    """After one or two sweeps the matrix is far from diagonal, so every step's rounding shows in the result; after
    the full count the float32 results are those of the exact decomposition."""
    if sweeps is not None:
        monkeypatch.setattr(_enable_eigh, "SWEEPS", sweeps)
    a = symmetric(n, seed=n)[0]
    if n > 1:
        p, q = schedule(n)[0][0]
        a[q, q] = a[p, p]  # equal diagonal entries in the first round's first pair: θ = 0, a 45° rotation
    with carbon.enabled():
        values, vectors = torch.linalg.eigh(a)
    want_values, want_vectors = jacobi_oracle(a.double().tolist())
    assert values.tolist() == want_values
    assert vectors.tolist() == want_vectors


def test_only_the_uplo_triangle_is_read_and_eigvalsh_agrees():
    a = symmetric(5, seed=10)[0]
    noisy_low, noisy_up = a.triu() + torch.ones(5, 5).tril(-1) * 7, a.tril() - torch.ones(5, 5).triu(1) * 3
    with carbon.enabled():
        want = torch.linalg.eigh(a)
        low = torch.linalg.eigh(noisy_low, UPLO="U")
        up = torch.linalg.eigh(noisy_up, UPLO="L")
        values = torch.linalg.eigvalsh(a)
    for got in (low, up):
        assert torch.equal(as_bits(got[0]), as_bits(want[0])) and torch.equal(as_bits(got[1]), as_bits(want[1]))
    assert torch.equal(as_bits(values), as_bits(want[0]))


def test_eigenvalues_are_lapacks_float64_ones_rounded(restore_num_threads):
    a = symmetric(40, seed=11, batch=3)
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append(torch.linalg.eigh(a))
            alone = torch.linalg.eigh(a[1])
    for one, two in zip(*runs):
        assert torch.equal(as_bits(one), as_bits(two))
    assert torch.equal(as_bits(runs[0][0][1]), as_bits(alone[0])) and torch.equal(as_bits(runs[0][1][1]), as_bits(alone[1]))
    values, vectors = runs[0]
    reference = torch.linalg.eigvalsh(a.double())
    assert torch.allclose(values.double(), reference, rtol=0, atol=4 * 2 ** -24 * reference.abs().max().item())
    eye = torch.eye(40, dtype=torch.float64).expand(3, 40, 40)
    assert torch.allclose(vectors.double().mT @ vectors.double(), eye, atol=1e-5)


def test_gradients_and_a_spectral_loss_train_the_same_at_one_and_two_threads(restore_num_threads):
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            net = torch.nn.Linear(6, 6)
            opt = torch.optim.Adam(net.parameters(), lr=1e-2)
            h = net(torch.randn(32, 6))
            cov = h.mT @ h / 32
            values, vectors = torch.linalg.eigh(cov)
            loss = (values - 1).square().sum() + vectors[:, -1].abs().sum()
            loss.backward()
            opt.step()
            prints.append(str(carbon.fingerprint(net, opt)))
    assert prints[0] == prints[1]
    a = symmetric(4, seed=12)[0].requires_grad_()
    with carbon.enabled(strict=True):
        values, vectors = torch.linalg.eigh(a)
        (values.square().sum() + vectors[:, 0].abs().sum()).backward()
    a64 = symmetric(4, seed=12)[0].double().requires_grad_()
    v64, w64 = torch.linalg.eigh(a64)
    w64 = w64 * torch.sign(w64.gather(0, w64.abs().argmax(0, keepdim=True)))  # carbon's sign convention
    (v64.square().sum() + w64[:, 0].abs().sum()).backward()
    assert torch.allclose(a.grad.double(), a64.grad, atol=1e-5)


def test_empty_and_errors():
    with carbon.enabled():
        values, vectors = torch.linalg.eigh(torch.empty(2, 0, 0))
        assert values.shape == (2, 0) and vectors.shape == (2, 0, 0)
        with pytest.raises(carbon.NotExactError, match="linalg_eigh in torch.float64"):
            torch.linalg.eigh(torch.eye(3, dtype=torch.float64))
        with pytest.raises(RuntimeError):  # torch's own error: not square
            torch.linalg.eigh(torch.ones(2, 3))
