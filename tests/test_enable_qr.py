"""torch.linalg.qr and torch.nn.init.orthogonal_ under carbon.enable (docs/enable.md): Householder QR with every
step defined. The expected bits come from an independent Python evaluation of the documented steps in exact
rational arithmetic, each step rounded to float32 here; same bits at 1 and 2 threads."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List

import pytest
import torch

import carbon
from tests.norm_reference import sqrt_rn32
from tests.oracle import as_bits, bits_to_float, round_bits

F32 = torch.float32


pytestmark = pytest.mark.usefixtures("restore_num_threads", "carbon_disabled_after")


def rn(v) -> float:
    """RN32 of an exact value (a float or a Fraction)."""
    return bits_to_float(round_bits(Fraction(v), F32), F32)


def dot(xs, ys) -> float:
    return rn(sum((Fraction(x) * Fraction(y) for x, y in zip(xs, ys)), Fraction(0)))


def factor(a: List[List[float]]):
    """The docstring's factorization of carbon/_enable_qr.py on lists of floats: LAPACK's compact form (R on and
    above the diagonal, each reflector's v below it) and the τ's."""
    m, n = len(a), len(a[0])
    w = [row[:] for row in a]
    taus = []
    for k in range(min(m, n)):
        x = [w[i][k] for i in range(k, m)]
        alpha, rest = x[0], x[1:]
        top = max(abs(v) for v in x)
        e = math.frexp(top)[1]  # top = f·2^e, 0.5 <= f < 1
        scale = 2.0 ** max(-126, min(126, -e)) if top > 0 and not 2.0 ** -60 <= top <= 2.0 ** 60 else 1.0
        xs = [v * scale for v in x]  # exact: a power of two
        s, nu = dot(xs[1:], xs[1:]), dot(xs, xs)
        if s == 0:
            beta, tau, v = alpha, 0.0, [1.0] + [0.0] * len(rest)
        else:
            beta = -math.copysign(float(rn(Fraction(sqrt_rn32(nu)) / Fraction(scale))), alpha)
            tau = rn(Fraction(rn(Fraction(beta) - Fraction(alpha))) / Fraction(beta))
            d = rn(Fraction(alpha) - Fraction(beta))
            v = [1.0] + [rn(Fraction(r) / Fraction(d)) for r in rest]
        t = [rn(Fraction(tau) * Fraction(vi)) for vi in v]
        for j in range(k + 1, n):
            col = [w[i][j] for i in range(k, m)]
            wj = dot(v, col)
            for i in range(k, m):
                w[i][j] = rn(Fraction(w[i][j]) - Fraction(rn(Fraction(t[i - k]) * Fraction(wj))))
        w[k][k] = beta
        for i in range(k + 1, m):
            w[i][k] = v[i - k]
        taus.append(tau)
    return w, taus


def product(w: List[List[float]], taus: List[float], columns: int):
    """H₀ … H_{k−1} on the identity's first `columns` columns, the last first: v = (1, w[k+1:, k]), t = RN(τ·v)."""
    m = len(w)
    q = [[1.0 if i == j else 0.0 for j in range(columns)] for i in range(m)]
    for k in reversed(range(len(taus))):
        v = [1.0] + [w[i][k] for i in range(k + 1, m)]
        t = [rn(Fraction(taus[k]) * Fraction(vi)) for vi in v]
        for j in range(k, columns):
            col = [q[i][j] for i in range(k, m)]
            wj = dot(v, col)
            for i in range(k, m):
                q[i][j] = rn(Fraction(q[i][j]) - Fraction(rn(Fraction(t[i - k]) * Fraction(wj))))
    return q


def householder(a: List[List[float]], mode: str):
    """Q and R of the documented algorithm."""
    m, n = len(a), len(a[0])
    w, taus = factor(a)
    rows = m if mode == "complete" else min(m, n)
    r = [[w[i][j] if j >= i else 0.0 for j in range(n)] for i in range(rows)]
    return product(w, taus, rows), r


def _bits(values) -> torch.Tensor:
    return as_bits(torch.tensor(values, dtype=F32))


def _matrix(m, n, seed):
    a = torch.randn(m, n, generator=torch.Generator().manual_seed(seed))
    if n > 2:
        a[2:, 1] = 0  # a column without sub-diagonal mass past row 1: the s = 0 step
        a[0, 2] = 0  # a zero α
    return a


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (5, 5), (1, 3), (3, 1)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_follows_the_documented_householder_steps(threads, shape, mode):
    torch.set_num_threads(threads)
    a = _matrix(*shape, seed=sum(shape))
    with carbon.enabled():
        q, r = torch.linalg.qr(a, mode=mode)
    want_q, want_r = householder(a.tolist(), mode)
    assert torch.equal(as_bits(r), _bits(want_r))
    if mode == "r":
        assert q.numel() == 0
    else:
        assert torch.equal(as_bits(q), _bits(want_q))


@pytest.mark.parametrize("scale", [1e20, 1e-25, 2.0 ** 70])
def test_badly_scaled_columns_are_scaled_by_powers_of_two(scale):
    """Columns whose largest entry lies outside [2^-60, 2^60] are scaled by a power of two for their sums of
    squares: no overflow to inf (1e20) and no vanishing sub-diagonal (1e-25); QR still reproduces A."""
    a = _matrix(6, 4, seed=40) * scale
    with carbon.enabled():
        q, r = torch.linalg.qr(a)
    want_q, want_r = householder(a.tolist(), "reduced")
    assert torch.equal(as_bits(q), _bits(want_q)) and torch.equal(as_bits(r), _bits(want_r))
    assert torch.allclose((q.double() @ r.double()) / scale, a.double() / scale, atol=1e-5)


def test_empty_matrices_and_out_arguments():
    for shape in [(3, 0), (0, 3), (2, 0, 3, 3)]:
        for mode in ("reduced", "complete", "r"):
            want = torch.linalg.qr(torch.zeros(shape), mode=mode)  # torch's shapes (nothing to round)
            with carbon.enabled():
                q, r = torch.linalg.qr(torch.zeros(shape), mode=mode)
            assert q.shape == want.Q.shape and r.shape == want.R.shape, (shape, mode)
    a = _matrix(5, 3, seed=41)
    with carbon.enabled():
        q_out, r_out = torch.empty(0), torch.empty(0)
        torch.linalg.qr(a, out=(q_out, r_out))
        q, r = torch.linalg.qr(a)
    assert torch.equal(as_bits(q_out), as_bits(q)) and torch.equal(as_bits(r_out), as_bits(r))


def test_batched_qr_is_each_matrix_alone():
    a = torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(9))
    with carbon.enabled():
        q, r = torch.linalg.qr(a)
        singles = [torch.linalg.qr(a[i, j]) for i in range(2) for j in range(3)]
    assert q.shape == (2, 3, 6, 4) and r.shape == (2, 3, 4, 4)
    for k, (qs, rs) in enumerate(singles):
        assert torch.equal(as_bits(q.reshape(6, 6, 4)[k]), as_bits(qs))
        assert torch.equal(as_bits(r.reshape(6, 4, 4)[k]), as_bits(rs))


def test_orthogonal_init_is_the_same_at_one_and_two_threads_and_orthogonal():
    weights = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=3):
            layer = torch.nn.Linear(48, 32)
            torch.nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
        weights.append(layer.weight.detach())
    assert torch.equal(as_bits(weights[0]), as_bits(weights[1]))
    w = weights[0].double() / math.sqrt(2)
    assert torch.allclose(w @ w.t(), torch.eye(32, dtype=torch.float64), atol=1e-5)


def test_other_dtypes_are_refused():
    a = torch.randn(4, 3, dtype=torch.float64)
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="linalg_qr in torch.float64"):
        torch.linalg.qr(a)


@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (5, 5)])
def test_geqrf_is_the_compact_form_of_the_same_factorization(shape):
    a = _matrix(*shape, seed=sum(shape) + 1)
    with carbon.enabled():
        compact, tau = torch.geqrf(a)
        batched = torch.geqrf(torch.stack([a, a.flip(0)]))
    want, want_tau = factor(a.tolist())
    assert torch.equal(as_bits(compact), _bits(want)) and torch.equal(as_bits(tau), _bits(want_tau))
    assert torch.equal(as_bits(batched[0][0]), as_bits(compact)) and torch.equal(as_bits(batched[1][0]), as_bits(tau))


def test_householder_product_of_any_reflectors():
    """Reflectors and scales that are not a QR's (random τ): the documented product; orgqr is the same op."""
    reflectors = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(8))
    tau = torch.rand(3, 3, generator=torch.Generator().manual_seed(9)) * 2
    with carbon.enabled():
        q = torch.linalg.householder_product(reflectors, tau)
        q2 = torch.orgqr(reflectors[1], tau[1])
    for i in range(3):
        assert torch.equal(as_bits(q[i]), _bits(product(reflectors[i].tolist(), tau[i].tolist(), 4)))
    assert torch.equal(as_bits(q2), as_bits(q[1]))
    with carbon.enabled(), pytest.raises(RuntimeError):  # torch's own error: more reflectors than columns
        torch.linalg.householder_product(reflectors[0, :, :2], tau[0])


@pytest.mark.parametrize("orthogonal_map", ["householder", "cayley"])
def test_orthogonal_parametrization_trains_the_same_at_one_and_two_threads(orthogonal_map):
    """nn.utils.parametrizations.orthogonal: geqrf and householder_product (or cayley's linalg.solve) under strict
    mode, orthogonal weights, one SGD step; same bits at 1 and 2 threads."""
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            shape = (12, 6) if orthogonal_map == "householder" else (8, 8)
            layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(*shape), orthogonal_map=orthogonal_map)
            opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
            w = layer.weight.detach()
            layer(torch.randn(5, shape[0])).square().sum().backward()  # Linear(in_features, out_features)
            opt.step()
            prints.append((as_bits(w), as_bits(layer.weight.detach())))
    assert all(torch.equal(one, two) for one, two in zip(*prints))
    gram = w @ w.mT if w.shape[0] <= w.shape[1] else w.mT @ w
    assert torch.allclose(gram, torch.eye(gram.shape[0]), atol=1e-5)
