"""torch.linalg.svd / svdvals / pinv under carbon.enable (docs/enable.md, carbon/_enable_svd.py): the one-sided
Jacobi method with a fixed schedule, against an independent scalar evaluation of the documented steps (Python
floats — IEEE binary64 — math.sqrt and the pairwise sums written out here), bit for bit, also after one and two
sweeps; singular values against LAPACK's float64 ones; orthonormal U and V, rank-deficient inputs included; a
matrix alone vs in a batch, 1 vs 2 threads; pinv's definition; gradients and a nuclear-norm loss under strict
mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import carbon
from carbon import _enable_svd
from tests.oracle import as_bits
from tests.test_enable_eigh import div, schedule

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")


def pairwise(values: list) -> float:
    """x₀ + x₁, x₂ + x₃, … level by level, an odd level padded with +0."""
    while len(values) > 1:
        if len(values) % 2:
            values = values + [0.0]
        values = [values[i] + values[i + 1] for i in range(0, len(values), 2)]
    return values[0]


def svd_oracle(a: list) -> tuple:
    """(U, S, V) in float32 of a tall matrix (m ≥ n) by the documented sweeps; every σ must be nonzero."""
    m, n = len(a), len(a[0])
    g = [row[:] for row in a]
    v = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for _ in range(_enable_svd.SWEEPS):
        for pairs in schedule(n):
            rot = []
            for p, q in pairs:
                alpha = pairwise([g[i][p] * g[i][p] for i in range(m)])
                beta = pairwise([g[i][q] * g[i][q] for i in range(m)])
                gamma = pairwise([g[i][p] * g[i][q] for i in range(m)])
                if gamma == 0:
                    rot.append((p, q, 1.0, 0.0))
                    continue
                zeta = div(beta - alpha, gamma * 2.0)
                sigma = 1.0 if zeta >= 0 else -1.0
                t = div(sigma, abs(zeta) + math.sqrt(zeta * zeta + 1.0))
                c = 1.0 / math.sqrt(t * t + 1.0)
                rot.append((p, q, c, t * c))
            for mat in (g, v):
                for p, q, c, s in rot:
                    for row in mat:
                        xp, xq = row[p], row[q]
                        row[p], row[q] = c * xp - s * xq, s * xp + c * xq
    norms = [math.sqrt(pairwise([g[i][j] * g[i][j] for i in range(m)])) for j in range(n)]
    order = sorted(range(n), key=lambda j: (-norms[j], j))
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    u_cols, v_cols = [], []
    for j in order:
        vc = [v[r][j] for r in range(n)]
        top = max(range(n), key=lambda r: (abs(vc[r]), -r))
        sign = -1.0 if vc[top] < 0 else 1.0
        v_cols.append([f32(sign * x) for x in vc])
        u_cols.append([f32((sign * g[i][j]) / norms[j]) for i in range(m)])
    return [list(r) for r in zip(*u_cols)], [f32(norms[j]) for j in order], [list(r) for r in zip(*v_cols)]


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (6, 1)])
@pytest.mark.parametrize("sweeps", [1, 2, None])
def test_svd_is_the_documented_one_sided_jacobi_method(shape, sweeps, monkeypatch):
    if sweeps is not None:
        monkeypatch.setattr(_enable_svd, "SWEEPS", sweeps)
    a = rand(*shape, seed=sum(shape))
    with carbon.enabled():
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        values = torch.linalg.svdvals(a)
    tall = a.tolist() if shape[0] >= shape[1] else a.t().tolist()
    want_u, want_s, want_v = svd_oracle([[float(x) for x in row] for row in tall])
    if shape[0] < shape[1]:  # Aᵀ = U' S V'ᵀ, so U = V', V = U'
        want_u, want_v = want_v, want_u
    assert s.tolist() == want_s and values.tolist() == want_s
    assert u.tolist() == want_u
    assert vh.tolist() == [list(r) for r in zip(*want_v)]


def test_singular_values_are_lapacks_float64_ones_rounded(restore_num_threads):
    a = rand(3, 30, 12, seed=1)
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append(torch.linalg.svd(a, full_matrices=True))
            alone = torch.linalg.svd(a[2], full_matrices=True)
    for one, two in zip(*runs):
        assert torch.equal(as_bits(one), as_bits(two))
    for batched, single in zip(runs[0], alone):
        assert torch.equal(as_bits(batched[2]), as_bits(single))
    u, s, vh = runs[0]
    reference = torch.linalg.svdvals(a.double())
    assert torch.allclose(s.double(), reference, rtol=0, atol=4 * 2 ** -24 * reference.abs().max().item())
    assert u.shape == (3, 30, 30) and vh.shape == (3, 12, 12)
    assert torch.allclose(u.double().mT @ u.double(), torch.eye(30, dtype=torch.float64).expand(3, 30, 30), atol=1e-5)
    rebuilt = u[..., :12].double() @ torch.diag_embed(s.double()) @ vh.double()
    assert torch.allclose(rebuilt, a.double(), atol=1e-5)


def test_rank_deficient_and_zero_matrices_have_orthonormal_factors():
    a = rand(6, 2, seed=2) @ rand(2, 4, seed=3)
    a[:, 3] = 0
    with carbon.enabled():
        cases = [torch.linalg.svd(a, full_matrices=True), torch.linalg.svd(torch.zeros(3, 5), full_matrices=False)]
    for u, s, vh in cases:
        assert torch.allclose(u.mT @ u, torch.eye(u.shape[-1]), atol=1e-6)
        assert torch.allclose(vh @ vh.mT, torch.eye(vh.shape[-2]), atol=1e-6)
    assert cases[0][1][3].item() == 0.0 and cases[1][1].tolist() == [0.0, 0.0, 0.0]


def test_pinv_is_torchs_definition_on_carbons_svd():
    a = rand(7, 4, seed=4)
    with carbon.enabled():
        got = torch.linalg.pinv(a)
        got_rtol = torch.linalg.pinv(a, rtol=0.5)
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        sym = a.mT @ a
        got_h = torch.linalg.pinv(sym, hermitian=True)
    for result, tol in ((got, 2.0 ** -23 * 7 * s[0].item()), (got_rtol, 0.5 * s[0].item())):
        inverse = [1.0 / x if x > np.float32(tol) else 0.0 for x in s.tolist()]  # float32 reciprocals below
        scaled = vh.mT * torch.tensor(inverse, dtype=torch.float32)
        want = (scaled.double() @ u.mT.double()).float()  # exact products (float32 inputs, 4 terms), one rounding
        assert torch.equal(as_bits(result), as_bits(want))
    assert torch.allclose(got_h.double(), torch.linalg.pinv(sym.double(), hermitian=True), atol=1e-5)
    assert (s[2:] < s[0] * 0.5).any()  # rtol=0.5 dropped a singular value: the two pinvs differ
    assert not torch.equal(got, got_rtol)


def test_gradients_and_a_nuclear_norm_loss_train_the_same_at_one_and_two_threads(restore_num_threads):
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            net = torch.nn.Linear(8, 5)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
            loss = torch.linalg.matrix_norm(net.weight, "nuc") + torch.linalg.matrix_norm(net.weight, 2) \
                + torch.linalg.pinv(net.weight).square().sum() + net(torch.randn(4, 8)).square().mean()
            loss.backward()
            opt.step()
            prints.append(str(carbon.fingerprint(net, opt)))
    assert prints[0] == prints[1]
    a = rand(5, 3, seed=5).requires_grad_()
    with carbon.enabled(strict=True):
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        (s.square().sum() + u.abs().sum() + vh.abs().sum()).backward()
    a64 = rand(5, 3, seed=5).double().requires_grad_()
    u64, s64, vh64 = torch.linalg.svd(a64, full_matrices=False)
    (s64.square().sum() + u64.abs().sum() + vh64.abs().sum()).backward()  # sign-invariant loss
    assert torch.allclose(a.grad.double(), a64.grad, atol=1e-5)


def test_empty_and_errors():
    with carbon.enabled():
        u, s, vh = torch.linalg.svd(torch.empty(2, 0, 3))
        assert u.shape == (2, 0, 0) and s.shape == (2, 0) and vh.shape == (2, 3, 3)
        assert torch.linalg.pinv(torch.empty(0, 4)).shape == (4, 0)
        with pytest.raises(carbon.NotExactError, match="linalg_svd in torch.float64"):
            torch.linalg.svd(torch.eye(3, dtype=torch.float64))


def test_lstsq_is_the_minimum_norm_solution_from_carbons_svd():
    from fractions import Fraction
    from tests.oracle import round_value
    a, b = rand(6, 3, seed=6), rand(6, 2, seed=7)
    deficient = a.clone()
    deficient[:, 2] = deficient[:, 0] * 2  # rank 2
    with carbon.enabled():
        default = torch.linalg.lstsq(a, b)
        gelsd = torch.linalg.lstsq(a, b, driver="gelsd")
        gels = torch.linalg.lstsq(a, b, driver="gels")
        low_rank = torch.linalg.lstsq(deficient, b, driver="gelsd")
        vector = torch.linalg.lstsq(a, b[:, 0])
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
    rn = lambda x: round_value(x, torch.float32)  # noqa: E731
    c = [[rn(sum(Fraction(u[i, t].item()) * Fraction(b[i, j].item()) for i in range(6))) for j in range(2)]
         for t in range(3)]
    tol = np.float32(s[0].item()) * np.float32(2.0 ** -23 * 6)
    inv = [rn(1 / Fraction(x)) if x > tol else Fraction(0) for x in s.tolist()]
    d = [[rn(inv[t] * c[t][j]) for j in range(2)] for t in range(3)]
    want = [[float(rn(sum(Fraction(vh[t, i].item()) * d[t][j] for t in range(3)))) for j in range(2)] for i in range(3)]
    assert default.solution.tolist() == want
    assert torch.equal(as_bits(gelsd.solution), as_bits(default.solution))
    assert torch.allclose(default.solution.double(), torch.linalg.lstsq(a.double(), b.double()).solution, atol=1e-5)
    # the outputs each driver returns, as torch: rank for gelsy / gelsd, singular values for gelsd, residuals for
    # gels / gelsd (m > n, full rank)
    assert default.rank.item() == 3 and default.residuals.numel() == 0 and default.singular_values.numel() == 0
    assert gels.rank.numel() == 0 and torch.equal(as_bits(gelsd.singular_values), as_bits(s))
    r = [[Fraction(rn(sum(Fraction(a[i, t].item()) * Fraction(default.solution[t, j].item()) for t in range(3))
                      - Fraction(b[i, j].item()))) for j in range(2)] for i in range(6)]
    assert gelsd.residuals.tolist() == [float(rn(sum(r[i][j] ** 2 for i in range(6)))) for j in range(2)]
    assert torch.equal(as_bits(gels.residuals), as_bits(gelsd.residuals))
    assert low_rank.rank.item() == 2 and low_rank.residuals.numel() == 0  # not full rank: no residuals
    assert torch.allclose(low_rank.solution.double(), torch.linalg.pinv(deficient.double()) @ b.double(), atol=1e-5)
    assert torch.equal(as_bits(vector.solution), as_bits(default.solution[:, 0]))


def test_lstsq_gradients_train_the_same_at_one_and_two_threads(restore_num_threads):
    """A closed-form ridge-style head: lstsq inside the loss, AdamW on the features."""
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            net = torch.nn.Linear(5, 4)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
            feats = net(torch.randn(12, 5))
            targets = torch.randn(12, 2)
            w = torch.linalg.lstsq(feats, targets).solution
            (feats @ w - targets).square().mean().backward()
            opt.step()
            prints.append(str(carbon.fingerprint(net, opt)))
    assert prints[0] == prints[1]
