"""carbon.enable's torch.linalg.solve_triangular and torch.linalg.cholesky (docs/enable.md): the recurrences of
carbon/_enable_triangular.py, checked against an exact oracle written here (Fractions, one rounding per step as
the docs state), at 1 and 2 threads and batched vs one matrix at a time; and the client they exist for,
torch.distributions.MultivariateNormal (sampling, log_prob, gradients) under strict mode."""

from fractions import Fraction

import pytest
import torch
import torch.distributions as D

import carbon
from tests.oracle import as_bits, bits_to_float, round_value, sqrt_bits


def rn(x: Fraction, dtype) -> Fraction:
    return round_value(x, dtype)


def rn_sqrt(c: Fraction, dtype) -> Fraction:
    """RN(√c) for an exact c > 0 (the oracle's integer square root)."""
    return Fraction(bits_to_float(sqrt_bits(c, dtype), dtype))


def solve_oracle(a, b, upper: bool, unit: bool, dtype) -> list:
    """X with A X = B for one matrix (lists of floats), the documented recurrence in exact arithmetic."""
    n, k = len(a), len(b[0])
    x = [[None] * k for _ in range(n)]
    for i in (reversed(range(n)) if upper else range(n)):
        known = range(i + 1, n) if upper else range(i)
        for c in range(k):
            r = Fraction(b[i][c]) - sum((Fraction(a[i][j]) * x[j][c] for j in known), Fraction(0))
            r = rn(r, dtype)
            x[i][c] = r if unit else rn(r / Fraction(a[i][i]), dtype)
    return [[float(v) for v in row] for row in x]


def cholesky_oracle(a, dtype) -> list:
    n = len(a)
    low = [[Fraction(0)] * n for _ in range(n)]
    for j in range(n):
        c = [rn(Fraction(a[i][j]) - sum((low[i][t] * low[j][t] for t in range(j)), Fraction(0)), dtype)
             for i in range(j, n)]
        low[j][j] = rn_sqrt(c[0], dtype)
        for i in range(j + 1, n):
            low[i][j] = rn(c[i - j] / low[j][j], dtype)
    return [[float(v) for v in row] for row in low]


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def triangular(n: int, seed: int, upper: bool, dtype=torch.float32) -> torch.Tensor:
    a = rand(n, n, seed=seed) + 3 * torch.eye(n)
    return (a.triu() if upper else a.tril()).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_is_the_documented_substitution(dtype, upper, left, unit, carbon_disabled_after):
    n, k = 6, 3
    a = triangular(n, 1, upper, dtype)
    a_full = (a + rand(n, n, seed=9).to(dtype) * (a == 0))  # the other triangle must not be read
    b = rand(n, k, seed=2).to(dtype) if left else rand(k, n, seed=2).to(dtype)
    with carbon.enabled():
        x = torch.linalg.solve_triangular(a_full, b, upper=upper, left=left, unitriangular=unit)
    if left:
        want = solve_oracle(a.float().tolist(), b.float().tolist(), upper, unit, dtype)
    else:  # X A = B  <=>  A^T X^T = B^T
        want = [list(r) for r in zip(*solve_oracle(a.float().t().tolist(), b.float().t().tolist(), not upper, unit, dtype))]
    assert x.dtype == dtype and x.shape == b.shape
    assert x.float().tolist() == want


def test_solve_triangular_broadcasts_batches_and_each_matrix_is_solved_alone(restore_num_threads,
                                                                             carbon_disabled_after):
    a = torch.stack([triangular(5, s, False) for s in range(3)]).unsqueeze(1)  # (3, 1, 5, 5)
    b = rand(2, 5, 4, seed=7)  # (2, 5, 4) -> result (3, 2, 5, 4)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            outs.append(torch.linalg.solve_triangular(a, b, upper=False))
            alone = torch.linalg.solve_triangular(a[2, 0], b[1], upper=False)
    assert outs[0].shape == (3, 2, 5, 4)
    assert torch.equal(as_bits(outs[0]), as_bits(outs[1]))
    assert torch.equal(as_bits(outs[0][2, 1]), as_bits(alone))
    assert outs[0][2, 1].tolist() == solve_oracle(a[2, 0].tolist(), b[1].tolist(), False, False, torch.float32)


def test_cholesky_is_the_documented_factorization(carbon_disabled_after):
    m = rand(3, 5, 5, seed=3)
    a = m @ m.mT + torch.eye(5)
    with carbon.enabled():
        low = torch.linalg.cholesky(a)
        up = torch.linalg.cholesky(a, upper=True)
        ex, info = torch.linalg.cholesky_ex(a)
    for i in range(3):
        want = cholesky_oracle(a[i].tolist(), torch.float32)
        assert low[i].tolist() == want
        assert up[i].tolist() == [list(r) for r in zip(*cholesky_oracle(a[i].t().tolist(), torch.float32))]
    assert torch.equal(as_bits(ex), as_bits(low)) and info.tolist() == [0, 0, 0] and info.dtype == torch.int32


def test_cholesky_reports_the_first_failing_minor_as_torch_does(carbon_disabled_after):
    m = rand(3, 4, 4, seed=4)
    a = m @ m.mT + torch.eye(4)
    a[1, 2, 2] = -100.0
    a[2, 0, 0] = float("nan")
    with carbon.enabled():
        _, info = torch.linalg.cholesky_ex(a)
        with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
            torch.linalg.cholesky(a[1])
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.cholesky_ex(a[1], check_errors=True)
    assert info.tolist() == torch.linalg.cholesky_ex(a)[1].tolist() == [0, 3, 1]


def test_out_variants_and_empty_inputs(carbon_disabled_after):
    a, b = triangular(4, 5, False), rand(4, 2, seed=6)
    out = torch.empty(0)
    l_out, info_out = torch.empty(0), torch.empty(0, dtype=torch.int32)
    with carbon.enabled():
        want = torch.linalg.solve_triangular(a, b, upper=False)
        torch.linalg.solve_triangular(a, b, upper=False, out=out)
        spd = a @ a.mT
        torch.linalg.cholesky_ex(spd, out=(l_out, info_out))
        low = torch.linalg.cholesky(spd)
        empty = torch.linalg.solve_triangular(torch.empty(0, 3, 3), torch.empty(0, 3, 2), upper=True)
        no_rhs = torch.linalg.solve_triangular(a, torch.empty(4, 0), upper=False)
        empty_factor, empty_info = torch.linalg.cholesky_ex(torch.empty(2, 0, 0))
    assert torch.equal(as_bits(out), as_bits(want)) and torch.equal(as_bits(l_out), as_bits(low))
    assert info_out.item() == 0
    assert empty.shape == (0, 3, 2) and no_rhs.shape == (4, 0)
    assert empty_factor.shape == (2, 0, 0) and empty_info.tolist() == [0, 0]


def test_float64_and_bad_shapes(carbon_disabled_after):
    with carbon.enabled():
        with pytest.raises(carbon.NotExactError, match="linalg_solve_triangular in torch.float64"):
            torch.linalg.solve_triangular(torch.eye(3, dtype=torch.float64), torch.ones(3, 1, dtype=torch.float64),
                                          upper=False)
        with pytest.raises(RuntimeError):  # torch's own error: A is not square
            torch.linalg.solve_triangular(torch.ones(3, 2), torch.ones(3, 1), upper=False)


def test_multivariate_normal_trains_the_same_at_one_and_two_threads(restore_num_threads,
                                                                    carbon_disabled_after):
    """A Gaussian policy with a full covariance: rsample, log_prob and entropy through cholesky and
    solve_triangular, backward and one AdamW step; same bits at 1 and 2 threads, and a sample's log_prob
    alone equals its value in the batch."""
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            net = torch.nn.Linear(4, 3 + 9)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
            out = net(torch.randn(8, 4))
            m = out[:, 3:].reshape(8, 3, 3)
            cov = m @ m.mT + torch.eye(3)
            d = D.MultivariateNormal(out[:, :3], covariance_matrix=cov)
            x = d.rsample()
            lp = d.log_prob(x.detach())
            lp0 = D.MultivariateNormal(out[:1, :3], covariance_matrix=cov[:1]).log_prob(x[:1].detach())
            loss = -(lp + d.entropy()).mean() + x.square().mean()
            loss.backward()
            opt.step()
            assert torch.equal(as_bits(lp[:1]), as_bits(lp0))
            prints.append(str(carbon.fingerprint(net, opt)))
    assert prints[0] == prints[1]
