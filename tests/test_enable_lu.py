"""carbon.enable's LU family (docs/enable.md, carbon/_enable_lu.py): lu_factor, lu, lu_solve, solve, inv, det,
slogdet, cholesky_solve and cholesky_inverse, checked against an exact oracle written here (Fractions, one
rounding per step as the docs state); batched vs one matrix at a time and 1 vs 2 threads; LAPACK's info on exactly
singular matrices; gradients through torch's own formulas; and two clients under strict mode (a Glow-style
invertible 1×1 convolution, a Gaussian-process marginal likelihood)."""

from fractions import Fraction

import pytest
import torch

import carbon
from tests.oracle import as_bits, round_value

F32 = torch.float32


def rn(x: Fraction) -> Fraction:
    return round_value(x, F32)


def exact(values) -> list:
    return [[Fraction(v) for v in row] for row in values]


def lu_oracle(a: list, pivot: bool = True) -> tuple:
    """(LU, pivots) of one m × n matrix: the documented recurrence, every sum exact and rounded once."""
    m, n = len(a), len(a[0])
    k = min(m, n)
    work = exact(a)
    low = [[Fraction(0)] * k for _ in range(m)]
    up = [[Fraction(0)] * n for _ in range(k)]
    pivots = []
    for j in range(k):
        c = [rn(work[i][j] - sum((low[i][t] * up[t][j] for t in range(j)), Fraction(0))) for i in range(j, m)]
        p = j + (max(range(len(c)), key=lambda i: (abs(c[i]), -i)) if pivot else 0)  # the first largest |c|
        work[j], work[p] = work[p], work[j]
        low[j], low[p] = low[p], low[j]
        c[0], c[p - j] = c[p - j], c[0]
        pivots.append(p + 1)
        up[j][j] = c[0]
        for i in range(j + 1, m):
            low[i][j] = c[i - j] if c[0] == 0 else rn(c[i - j] / c[0])
        for col in range(j + 1, n):
            up[j][col] = rn(work[j][col] - sum((low[j][t] * up[t][col] for t in range(j)), Fraction(0)))
    lu = [[low[i][col] if i > col else up[i][col] for col in range(n)] for i in range(m)]
    return lu, pivots


def substitute(entry, b: list, lower: bool, unit: bool) -> list:
    """X with T X = B, T given by entry(i, j): row i = RN(RN(b − exact Σ) / T[i, i]) in substitution order."""
    n, r = len(b), len(b[0])
    x = [None] * n
    for i in (range(n) if lower else reversed(range(n))):
        known = range(i) if lower else range(i + 1, n)
        row = [rn(b[i][c] - sum((entry(i, j) * x[j][c] for j in known), Fraction(0))) for c in range(r)]
        x[i] = row if unit else [rn(v / entry(i, i)) for v in row]
    return x


def permutation(pivots: list, n: int) -> list:
    perm = list(range(n))
    for j, p in enumerate(pivots):
        perm[j], perm[p - 1] = perm[p - 1], perm[j]
    return perm


def lu_solve_oracle(lu: list, pivots: list, b: list, adjoint: bool) -> list:
    n = len(lu)
    perm = permutation(pivots, n)
    if not adjoint:  # L y = P^T B, U x = y
        y = substitute(lambda i, j: lu[i][j], [b[perm[i]] for i in range(n)], lower=True, unit=True)
        return substitute(lambda i, j: lu[i][j], y, lower=False, unit=False)
    y = substitute(lambda i, j: lu[j][i], b, lower=True, unit=False)  # U^T y = B
    z = substitute(lambda i, j: lu[j][i], y, lower=False, unit=True)  # L^T z = y
    x = [None] * n
    for i in range(n):
        x[perm[i]] = z[i]
    return x


def floats(rows: list) -> list:
    return [[float(v) for v in row] for row in rows]


def transpose(rows: list) -> list:
    return [list(r) for r in zip(*rows)]


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(6, 6), (7, 4), (4, 7), (1, 1)])
@pytest.mark.parametrize("pivot", [True, False])
def test_lu_factor_is_the_documented_factorization(shape, pivot, carbon_disabled_after):
    a = rand(*shape, seed=sum(shape)) + (0 if pivot else 4 * torch.eye(*shape))
    with carbon.enabled():
        lu, pivots, info = torch.linalg.lu_factor_ex(a, pivot=pivot)  # torch refuses pivot=False on the CPU
        p, low, up = torch.linalg.lu(a, pivot=pivot)
    want_lu, want_pivots = lu_oracle(a.tolist(), pivot)
    assert lu.tolist() == floats(want_lu)
    assert pivots.tolist() == want_pivots and pivots.dtype == torch.int32 and info.item() == 0
    # P L U: the same factors unpacked (P a permutation matrix, L unit lower triangular)
    m, n = shape
    k = min(m, n)
    perm = permutation(want_pivots, m)
    assert p.tolist() == [[1.0 if perm[j] == i else 0.0 for j in range(m)] for i in range(m)]
    assert low.tolist() == [[1.0 if i == j else (float(want_lu[i][j]) if i > j else 0.0) for j in range(k)]
                            for i in range(m)]
    assert up.tolist() == [[float(want_lu[i][j]) if j >= i else 0.0 for j in range(n)] for i in range(k)]


def test_the_first_of_equal_pivots_is_taken(carbon_disabled_after):
    a = torch.tensor([[1.0, 2.0, 0.5], [-1.0, 3.0, 1.0], [1.0, -1.0, 4.0]])  # |c| ties in the first column
    with carbon.enabled():
        lu, pivots = torch.linalg.lu_factor(a)
    want_lu, want_pivots = lu_oracle(a.tolist())
    assert want_pivots[0] == 1 and pivots.tolist() == want_pivots and lu.tolist() == floats(want_lu)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve_is_permutation_then_two_substitutions(left, adjoint, carbon_disabled_after):
    a, b = rand(5, 5, seed=3), rand(5, 3, seed=4)
    b = b if left else b.mT.contiguous()
    with carbon.enabled():
        lu, pivots = torch.linalg.lu_factor(a)
        x = torch.linalg.lu_solve(lu, pivots, b, left=left, adjoint=adjoint)
    want_lu, want_pivots = lu_oracle(a.tolist())
    if left:
        want = lu_solve_oracle(want_lu, want_pivots, exact(b.tolist()), adjoint)
    else:  # X A = B  <=>  A^T X^T = B^T (X A^T = B  <=>  A X^T = B^T)
        want = transpose(lu_solve_oracle(want_lu, want_pivots, exact(b.mT.tolist()), not adjoint))
    assert x.shape == b.shape and x.tolist() == floats(want)


def test_solve_and_inv_factor_a_and_solve(carbon_disabled_after):
    a, b = rand(6, 6, seed=5), rand(6, 2, seed=6)
    with carbon.enabled():
        x = torch.linalg.solve(a, b)
        xv = torch.linalg.solve(a, b[:, 0])  # a vector right-hand side
        xr = torch.linalg.solve(a, b.mT, left=False)
        inv = torch.linalg.inv(a)
        inv_ex, info = torch.linalg.inv_ex(a)
    lu, pivots = lu_oracle(a.tolist())
    assert x.tolist() == floats(lu_solve_oracle(lu, pivots, exact(b.tolist()), False))
    assert xv.tolist() == [row[0] for row in floats(lu_solve_oracle(lu, pivots, exact(b[:, :1].tolist()), False))]
    assert xr.tolist() == transpose(floats(lu_solve_oracle(lu, pivots, exact(b.tolist()), True)))
    eye = [[Fraction(int(i == j)) for j in range(6)] for i in range(6)]
    assert inv.tolist() == floats(lu_solve_oracle(lu, pivots, eye, False))
    assert torch.equal(as_bits(inv_ex), as_bits(inv)) and info.item() == 0


def det_oracle(a: list) -> tuple:
    """(det, |U_ii| list, sign) from the factorization of `a` (the caller passes Aᵀ for a contiguous A)."""
    lu, pivots = lu_oracle(a)
    d = lu[0][0]
    for i in range(1, len(lu)):
        d = rn(d * lu[i][i])
    swaps = sum(p != j + 1 for j, p in enumerate(pivots))
    negative = sum(lu[i][i] < 0 for i in range(len(lu)))
    sign = 0.0 if any(lu[i][i] == 0 for i in range(len(lu))) else (-1.0) ** (swaps + negative)
    return float(-d if swaps % 2 else d), [abs(lu[i][i]) for i in range(len(lu))], sign


@pytest.mark.parametrize("contiguous", [True, False])
def test_det_and_slogdet_are_the_diagonal_of_the_documented_lu(contiguous, carbon_disabled_after):
    base = rand(3, 6, 6, seed=7)
    a = base if contiguous else base.mT.contiguous().mT  # same values, a transposed layout
    with carbon.enabled():
        det = torch.linalg.det(a)
        sign, logabsdet = torch.linalg.slogdet(a)
        logs = None
    for i in range(3):
        factored = a[i].mT.tolist() if contiguous else a[i].tolist()  # torch's (and carbon's) choice: Aᵀ when contiguous
        want_det, diagonal, want_sign = det_oracle(factored)
        assert det[i].item() == want_det
        assert sign[i].item() == want_sign
        logs = carbon.log(torch.tensor([float(v) for v in diagonal]))  # carbon's log of each |U_ii|
        assert logabsdet[i].item() == float(rn(sum((Fraction(v) for v in logs.tolist()), Fraction(0))))


def test_singular_matrices_report_lapacks_info(carbon_disabled_after):
    singular = torch.tensor([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]],  # rank 2: U[2, 2] = 0
                             [[0.0, 1.0, 2.0], [0.0, 3.0, 1.0], [0.0, 5.0, 7.0]],  # a zero first column
                             [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]]])  # regular
    with carbon.enabled():
        _, _, info = torch.linalg.lu_factor_ex(singular)
        det = torch.linalg.det(singular)
        sign, logabsdet = torch.linalg.slogdet(singular)
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.solve(singular[0], torch.ones(3))
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.inv(singular[1])
    assert info.tolist() == torch.linalg.lu_factor_ex(singular).info.tolist() == [3, 1, 0]
    for i in range(3):  # det and slogdet factor Aᵀ (contiguous): rounding there leaves singular[0]'s det nonzero
        want_det, _, want_sign = det_oracle(singular[i].mT.tolist())
        assert det[i].item() == want_det and sign[i].item() == want_sign
    assert det[2].item() == 18.0 and sign[1].item() == 0.0 and logabsdet[1].item() == float("-inf")


def test_cholesky_solve_and_inverse(carbon_disabled_after):
    m = rand(5, 5, seed=8)
    spd = m @ m.mT + torch.eye(5)
    b = rand(5, 3, seed=9)
    with carbon.enabled():
        low = torch.linalg.cholesky(spd)
        x = torch.cholesky_solve(b, low)
        xu = torch.cholesky_solve(b, low.mT.contiguous(), upper=True)
        inv = torch.cholesky_inverse(low)
        inv_u = torch.cholesky_inverse(low.mT.contiguous(), upper=True)
    lo = exact(low.tolist())
    y = substitute(lambda i, j: lo[i][j], exact(b.tolist()), lower=True, unit=False)
    assert x.tolist() == floats(substitute(lambda i, j: lo[j][i], y, lower=False, unit=False))
    assert torch.equal(as_bits(xu), as_bits(x))
    eye = [[Fraction(int(i == j)) for j in range(5)] for i in range(5)]
    inv_low = substitute(lambda i, j: lo[i][j], eye, lower=True, unit=False)  # L⁻¹
    want = [[rn(sum((inv_low[t][i] * inv_low[t][j] for t in range(5)), Fraction(0))) for j in range(5)]
            for i in range(5)]
    assert inv.tolist() == floats(want) and torch.equal(inv, inv.mT)
    assert torch.equal(as_bits(inv_u), as_bits(inv))


def test_batches_each_matrix_alone_at_one_and_two_threads(restore_num_threads, carbon_disabled_after):
    a, b = rand(4, 1, 5, 5, seed=10), rand(3, 5, 2, seed=11)  # broadcast to (4, 3, 5, 2)
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            runs.append([torch.linalg.solve(a, b), torch.linalg.inv(a), torch.linalg.det(a),
                         torch.linalg.slogdet(a).logabsdet, torch.linalg.lu_factor(a).LU])
            alone = [torch.linalg.solve(a[2, 0], b[1]), torch.linalg.inv(a[2, 0]), torch.linalg.det(a[2, 0]),
                     torch.linalg.slogdet(a[2, 0]).logabsdet, torch.linalg.lu_factor(a[2, 0]).LU]
    assert runs[0][0].shape == (4, 3, 5, 2)
    for one, two in zip(*runs):
        assert torch.equal(as_bits(one), as_bits(two))
    for batched, single in zip([runs[0][0][2, 1]] + [r[2, 0] for r in runs[0][1:]], alone):
        assert torch.equal(as_bits(batched), as_bits(single))


def test_gradients_run_torchs_formulas_on_routed_ops(restore_num_threads, carbon_disabled_after):
    """Every backward here (lu_solve with and without adjoint, mm, solve_triangular) runs under strict mode;
    same bits at 1 and 2 threads, and close to torch's float64 gradients."""
    a = rand(3, 4, 4, seed=12) + 2 * torch.eye(4)
    b = rand(3, 4, 2, seed=13)
    cases = {
        "det": lambda a, b: torch.linalg.det(a),
        "det of a transposed view": lambda a, b: torch.linalg.det(a.mT),
        "slogdet": lambda a, b: torch.linalg.slogdet(a).logabsdet,
        "solve": lambda a, b: torch.linalg.solve(a, b),
        "inv": lambda a, b: torch.linalg.inv(a),
        "lu": lambda a, b: torch.cat([t.flatten() for t in torch.linalg.lu(a)]),
        "lu_solve": lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
        "cholesky_solve": lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a @ a.mT + torch.eye(4))),
        "cholesky_inverse": lambda a, b: torch.cholesky_inverse(torch.linalg.cholesky(a @ a.mT + torch.eye(4))),
    }
    for name, f in cases.items():
        grads = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
            with carbon.enabled(strict=True):
                out = f(x, y)
                out.backward(torch.ones_like(out))
            grads.append([x.grad] + ([y.grad] if y.grad is not None else []))
        x64, y64 = a.double().requires_grad_(), b.double().requires_grad_()
        out64 = f(x64, y64)
        out64.backward(torch.ones_like(out64))
        for one, two, ref in zip(grads[0], grads[1], [x64.grad, y64.grad]):
            assert torch.equal(as_bits(one), as_bits(two)), name
            assert torch.allclose(one.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item()), name


def test_out_variants_empty_inputs_and_errors(carbon_disabled_after):
    a = rand(4, 4, seed=14)
    out, lu_out, piv_out = torch.empty(0), torch.empty(0), torch.empty(0, dtype=torch.int32)
    with carbon.enabled():
        want = torch.linalg.inv(a)
        torch.linalg.inv(a, out=out)
        torch.linalg.lu_factor(a, out=(lu_out, piv_out))
        lu, pivots = torch.linalg.lu_factor(a)
        assert torch.linalg.det(torch.empty(2, 0, 0)).tolist() == [1.0, 1.0]
        assert torch.linalg.solve(torch.empty(0, 3, 3), torch.empty(0, 3, 2)).shape == (0, 3, 2)
        assert torch.linalg.inv(torch.empty(0, 0)).shape == (0, 0)
        with pytest.raises(carbon.NotExactError, match="linalg_solve in torch.float64"):
            torch.linalg.solve(torch.eye(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
        with pytest.raises(RuntimeError):  # torch's own error: not square
            torch.linalg.det(torch.ones(3, 2))
        with pytest.raises(RuntimeError):  # torch's own error: no half-precision LU
            torch.linalg.inv(torch.eye(3, dtype=torch.bfloat16))
    assert torch.equal(as_bits(out), as_bits(want))
    assert torch.equal(as_bits(lu_out), as_bits(lu)) and torch.equal(piv_out, pivots)


def test_a_glow_style_flow_trains_the_same_at_one_and_two_threads(restore_num_threads, carbon_disabled_after):
    """An invertible 1×1 convolution (Glow): log-likelihood with log|det W| per position, inverse for sampling;
    AdamW steps under strict mode, same fingerprint at 1 and 2 threads."""
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            w = torch.nn.Parameter(torch.linalg.qr(torch.randn(6, 6)).Q)
            shift = torch.nn.Parameter(torch.zeros(6, 1, 1))
            opt = torch.optim.AdamW([w, shift], lr=1e-2)
            x = torch.randn(4, 6, 5, 5)
            for _ in range(2):
                z = torch.nn.functional.conv2d(x, w.reshape(6, 6, 1, 1)) + shift
                log_det = 25 * torch.linalg.slogdet(w).logabsdet
                nll = (0.5 * z.square().sum((1, 2, 3)) - log_det).mean()
                opt.zero_grad()
                nll.backward()
                opt.step()
            sample = torch.nn.functional.conv2d(torch.randn(2, 6, 5, 5) - shift, torch.linalg.inv(w).reshape(6, 6, 1, 1))
            prints.append((str(carbon.fingerprint({"w": w, "shift": shift}, opt)), as_bits(sample)))
    assert prints[0][0] == prints[1][0] and torch.equal(prints[0][1], prints[1][1])


def test_a_gaussian_process_fits_the_same_at_one_and_two_threads(restore_num_threads, carbon_disabled_after):
    """The marginal likelihood of a GP with an RBF kernel: cholesky, cholesky_solve, log det from the factor's
    diagonal; Adam on the log length-scale and noise under strict mode."""
    x = torch.linspace(0, 1, 12).unsqueeze(-1)
    y = torch.sin(6 * x).squeeze(-1)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            params = torch.nn.Parameter(torch.tensor([-1.0, -2.0]))
            opt = torch.optim.Adam([params], lr=0.05)
            for _ in range(3):
                k = torch.exp(-0.5 * (x - x.mT).square() / params[0].exp().square())
                k = k + params[1].exp() * torch.eye(12)
                low = torch.linalg.cholesky(k)
                alpha = torch.cholesky_solve(y.unsqueeze(-1), low)
                nll = 0.5 * (y.unsqueeze(-1) * alpha).sum() + low.diagonal().log().sum()
                opt.zero_grad()
                nll.backward()
                opt.step()
            results.append(as_bits(params.detach()))
    assert torch.equal(results[0], results[1])


def test_wishart_log_prob_runs_under_strict_mode(restore_num_threads, carbon_disabled_after):
    """Wishart's log_prob needs slogdet (and mvlgamma, cholesky, solve_triangular): same bits at 1 and 2 threads,
    close to torch's float64 value."""
    m = rand(4, 3, 3, seed=15)
    cov = m @ m.mT + torch.eye(3)
    x = rand(4, 3, 3, seed=16)
    x = x @ x.mT + 0.5 * torch.eye(3)
    values = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(strict=True):
            values.append(torch.distributions.Wishart(torch.tensor(6.0), covariance_matrix=cov).log_prob(x))
    want = torch.distributions.Wishart(torch.tensor(6.0, dtype=torch.float64),
                                       covariance_matrix=cov.double()).log_prob(x.double())
    assert torch.equal(as_bits(values[0]), as_bits(values[1]))
    assert torch.allclose(values[0].double(), want, rtol=1e-5, atol=1e-4)
