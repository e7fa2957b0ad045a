"""The reparameterized gradients of the gamma family's samplers under carbon.enable (docs/enable.md,
carbon/_enable_sampler_grads.py): ``_standard_gamma_grad`` and ``_dirichlet_grad`` against an independent scalar
evaluation of the documented definition (Python floats — IEEE binary64, one operation at a time — with logs, exps
and powers correctly rounded by mpmath, ψ by mpmath rounded to float32), bit for bit, in every branch; against
torch's own float64 kernel (the same approximations in libm's double arithmetic) and against the exact derivative
−(∂F/∂α)/f from mpmath's incomplete gamma and beta functions (the approximations' own accuracy); and
Gamma / Beta / Dirichlet / StudentT / Chi2 ``rsample`` trained under strict mode, same bits at 1 and 2 threads."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from torch import distributions as D

import carbon
from oracle import as_bits, bits_to_float, round_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
mp.mp.prec = 200


def f32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def div(a: float, b: float) -> float:
    """IEEE division (Python raises on a zero divisor)."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def log(v: float) -> float:
    if math.isnan(v) or v < 0:
        return math.nan
    if v == 0:
        return -math.inf
    return v if v == math.inf else float(mp.log(v))


def exp(v: float) -> float:
    if math.isnan(v):
        return v
    if v > 710:
        return math.inf
    return 0.0 if v < -746 else float(mp.exp(v))


def powc(x: float, c: float) -> float:
    """x^c for a constant c (carbon's correctly rounded pow_tensor_scalar)."""
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return math.inf if c < 0 else 0.0
    if x == math.inf:
        return 0.0 if c < 0 else math.inf
    return float(mp.power(x, c))


def pow_(x: float, y: float) -> float:
    """x^y = EXP(RN(y·LOG x)), 1 for y = 0."""
    return 1.0 if y == 0 else exp(y * log(x))


def psi(a: float) -> float:
    """ψ of a float32 value, correctly rounded to float32 (via a 200-bit value)."""
    if a == 0:
        return math.nan
    return f32(float(mp.digamma(a)))


def nan_to_zero(v: float) -> float:
    return 0.0 if math.isnan(v) else v


GAMMA_UV = carbon._enable_sampler_grads._GAMMA_UV  # torch's published coefficients (data, not arithmetic)
DIRICHLET_C = carbon._enable_sampler_grads._DIRICHLET_C


def gamma_grad_oracle(alpha: float, x: float) -> float:
    if x < f32(0.8):
        numer, denom = 1.0, alpha
        s1, s2 = div(1.0, denom), div(1.0, denom * denom)
        for i in range(1, 6):
            numer = numer * (-x / i)
            denom = denom + 1.0
            s1 = s1 + div(numer, denom)
            s2 = s2 + div(numer, denom * denom)
        pxa = pow_(x, alpha)
        pdf = pow_(x, alpha - 1.0) * exp(-x)
        cdf = pxa * s1
        cdf_alpha = (log(x) - psi(alpha)) * cdf - pxa * s2
        return nan_to_zero(div(-cdf_alpha, pdf))
    if alpha > 8.0:
        if f32(0.9) * alpha <= x <= f32(1.1) * alpha:
            aa = alpha * alpha
            n1 = 1.0 + (24.0 * alpha) * (1.0 + 12.0 * alpha)
            n2 = ((1440.0 * aa + (6.0 * x) * (53.0 - 120.0 * x)) - div((65.0 * x) * x, alpha)) \
                + alpha * (107.0 + 3600.0 * x)
            return div(n1 * n2, (1244160.0 * aa) * aa)
        denom = powc(8.0 * alpha, 0.5)
        term2 = div(denom, alpha - x)
        lr = log(div(x, alpha))
        term3 = powc((x - alpha) - alpha * lr, -1.5)
        term23 = term2 - term3 if x < alpha else term2 + term3
        term1 = lr * term23 - div(powc(div(2.0, alpha), 0.5) * (alpha + x), (alpha - x) * (alpha - x))
        stirling = 1.0 + div(1.0, 12.0 * alpha) * (1.0 + div(1.0, 24.0 * alpha))
        return div(-stirling * (x * term1), denom)
    u, v = log(div(x, alpha)), log(alpha)
    c = [c0 + u * (c1 + u * c2) for c0, c1, c2 in zip(*GAMMA_UV)]
    p = c[0] + v * (c[1] + v * (c[2] + v * c[3]))
    q = c[4] + v * (c[5] + v * (c[6] + v * c[7]))
    return exp(div(p, q))


def beta_alpha_small(x, a, b, psi_a, psi_t):
    factor = (psi_a - psi_t) - log(x)
    numer = 1.0
    series = div(numer, a) * (factor + div(1.0, a))
    for i in range(1, 11):
        numer = numer * div((i - b) * x, float(i))
        d = a + i
        series = series + div(numer, d) * (factor + div(1.0, d))
    return nan_to_zero((x * pow_(1.0 - x, -b)) * series)


def beta_beta_small(y, a, b, psi_b, psi_t):
    factor = psi_t - psi_b
    numer, betas, dbetas = 1.0, 1.0, 0.0
    series = div(factor, a)
    for i in range(1, 9):
        numer = numer * (-y / i)
        dbetas = dbetas * (b - i) + betas
        betas = betas * (b - i)
        series = series + div(numer, a + i) * (dbetas + factor * betas)
    return nan_to_zero(-(pow_(1.0 - y, 1.0 - b) * series))


def beta_alpha_mid(x, a, b):
    t = a + b
    mean = div(a, t)
    std = div(powc(div(a * b, t + 1.0), 0.5), t)
    bb = b * b
    if mean - 0.1 * std <= x <= mean + 0.1 * std:
        poly = ((47.0 * x) * bb) * bb + a * (((43.0 + (20.0 * (16.0 + 27.0 * b)) * x) * bb) * b + a * (
            (3.0 * ((59.0 + 180.0 * b) - 90.0 * x)) * bb + a * (
                ((453.0 + (1620.0 * b) * (1.0 - x)) - 455.0 * x) * b + a * (
                    (8.0 * (1.0 - x)) * (135.0 * b - 11.0)))))
        pn = div((1.0 + 12.0 * a) * (1.0 + 12.0 * b), t * t)
        pd = (((((12960.0 * a) * a) * a) * b) * b) * (1.0 + 12.0 * t)
        return div(div(pn, 1.0 - x) * poly, pd)
    prefactor = div(-x, powc(div((2.0 * a) * b, t), 0.5))

    def st(z):
        return (1.0 + div(1.0, 12.0 * z)) + div(1.0, (288.0 * z) * z)
    stirling = div(st(a) * st(b), st(t))
    t1n = ((2.0 * (a * a)) * (x - 1.0) + (a * b) * (x - 1.0)) - x * bb
    axbx = a * (x - 1.0) + b * x
    t1d = ((powc(div(2.0 * a, b), 0.5) * powc(t, 1.5)) * axbx) * axbx
    term1 = div(t1n, t1d)
    la = log(div(a, t * x))
    term2 = 0.5 * la
    term3 = div(powc(div((8.0 * a) * b, t), 0.5), b * x + a * (x - 1.0))
    term4 = powc(b * log(div(b, t * (1.0 - x))) + a * la, -1.5)
    return (stirling * prefactor) * (term1 + term2 * (term3 + (term4 if x < mean else -term4)))


def dirichlet_grad_oracle(x: float, alpha: float, total: float) -> float:
    psi_a, psi_t = psi(alpha), psi(total)
    beta = total - alpha
    boundary = (total * x) * (1.0 - x)
    if x <= 0.5 and boundary < 2.5:
        return beta_alpha_small(x, alpha, beta, psi_a, psi_t)
    if x >= 0.5 and boundary < 0.75:
        return -beta_beta_small(1.0 - x, beta, alpha, psi_a, psi_t)
    if alpha > 6 and beta > 6:
        return beta_alpha_mid(x, alpha, beta)
    u = log(x)
    a = log(alpha) - u
    b = log(total) - a
    pu, pa = (1.0, u, u * u), (1.0, a, a * a)
    p = q = 0.0
    for i in range(3):
        for j in range(3):
            ua = pu[i] * pa[j]
            cp, cq = DIRICHLET_C[0][i][j], DIRICHLET_C[1][i][j]
            p = p + ua * (cp[0] + b * (cp[1] + b * (cp[2] + b * cp[3])))
            q = q + ua * (cq[0] + b * (cq[1] + b * (cq[2] + b * cq[3])))
    return div(p, q) * div(x * (psi_t - psi_a), beta)


def expected_bits(values64: list, dtype: torch.dtype) -> torch.Tensor:
    """binary64 → float32, then one more rounding to bfloat16 / float16, as bit patterns."""
    bits = []
    for v in values64:
        v32 = f32(v)
        b = round_bits(v32, dtype)
        bits.append(b - (1 << 16) if dtype != torch.float32 and b >= 1 << 15 else
                    (b - (1 << 32) if dtype == torch.float32 and b >= 1 << 31 else b))
    return torch.tensor(bits, dtype=as_bits(torch.zeros(1, dtype=dtype)).dtype)


def gamma_points() -> tuple:
    """(α, x) pairs in every branch and on the boundaries between them."""
    rng = np.random.default_rng(1)
    alphas, xs = [], []
    for a in [0.01, 0.2, 0.7, 1.0, 2.5, 7.9, 8.0, 8.5, 30.0, 400.0]:
        for x in [1e-30, 1e-6, 0.05, 0.5, f32(0.8) - 2 ** -24, f32(0.8), 1.3, 0.5 * a, f32(0.9) * a, a,
                  f32(1.1) * a, 1.7 * a + 1]:
            alphas.append(a)
            xs.append(x)
    alphas += list(rng.gamma(1.0, 5.0, 150) + 0.05)
    xs += [float(rng.gamma(a)) + 1e-20 for a in alphas[len(xs):]]
    a32 = torch.tensor(alphas, dtype=torch.float32)
    x32 = torch.tensor(xs, dtype=torch.float32)
    return a32, x32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_standard_gamma_grad_is_the_definition(dtype):
    alpha, x = gamma_points()
    alpha, x = alpha.to(dtype), x.to(dtype)
    with carbon.enabled():
        got = torch._standard_gamma_grad(alpha, x)
    want = [gamma_grad_oracle(a, v) for a, v in zip(alpha.double().tolist(), x.double().tolist())]
    assert got.dtype == dtype
    assert torch.equal(as_bits(got), expected_bits(want, dtype))


def dirichlet_points() -> tuple:
    rng = np.random.default_rng(2)
    rows = []
    for alpha, total in [(0.3, 1.0), (2.0, 3.0), (0.5, 20.0), (15.0, 16.0), (7.0, 20.0), (30.0, 70.0), (3.0, 40.0)]:
        mean = alpha / total
        for x in [1e-8, 0.01, 0.2, 0.5, 0.8, 0.99, 1 - 1e-6, mean, mean * 1.01, mean * 0.9]:
            rows.append((x, alpha, total))
    for alpha, beta in [(6.5, 7.0), (9.0, 30.0), (30.0, 40.0), (100.0, 8.0), (12.0, 12.0)]:  # the saddle's centre
        total = alpha + beta
        std = math.sqrt(alpha * beta / (total + 1)) / total
        rows += [(alpha / total + k * 0.02 * std, alpha, total) for k in range(-6, 7)]
    for _ in range(200):
        alpha, other = rng.gamma(2.0, 3.0) + 0.05, rng.gamma(2.0, 3.0) + 0.05
        rows.append((float(rng.beta(alpha, other)), alpha, alpha + other))
    x, alpha, total = (torch.tensor(c, dtype=torch.float32) for c in zip(*rows))
    return x.clamp(1e-30, 1 - 2 ** -24), alpha, total


def test_dirichlet_grad_is_the_definition():
    x, alpha, total = dirichlet_points()
    with carbon.enabled():
        got = torch._dirichlet_grad(x, alpha, total)
    want = [dirichlet_grad_oracle(*p) for p in zip(x.double().tolist(), alpha.double().tolist(),
                                                   total.double().tolist())]
    assert torch.equal(as_bits(got), expected_bits(want, torch.float32))


def test_the_definitions_agree_with_torchs_float64_kernels():
    """Same approximations: torch's double-precision evaluation is within 2e-5 (relative) of carbon's float32 —
    the difference is ψ rounded to float32 here and float32 intermediates in torch's Beta branches."""
    alpha, x = gamma_points()
    with carbon.enabled():
        got = torch._standard_gamma_grad(alpha, x)
    want = torch._standard_gamma_grad(alpha.double(), x.double())
    assert torch.allclose(got.double(), want, rtol=2e-5, atol=1e-30)
    x, alpha, total = dirichlet_points()
    with carbon.enabled():
        got = torch._dirichlet_grad(x, alpha, total)
    want = torch._dirichlet_grad(x.double(), alpha.double(), total.double())
    assert torch.allclose(got.double(), want, rtol=2e-5, atol=1e-30)


@pytest.mark.parametrize("alpha, x", [(0.3, 0.1), (1.0, 0.5), (2.5, 1.7), (5.0, 9.0), (12.0, 11.5), (50.0, 35.0)])
def test_gamma_grad_approximates_the_exact_derivative(alpha, x):
    """dx/dα = −(∂P(α, x)/∂α) / (x^(α−1) e^(−x) / Γ(α)), P the regularized incomplete gamma function (mpmath)."""
    a32, x32 = torch.tensor([alpha]), torch.tensor([x])
    with carbon.enabled():
        got = torch._standard_gamma_grad(a32, x32).item()
    a, v = mp.mpf(a32.item()), mp.mpf(x32.item())
    dcdf = mp.diff(lambda s: mp.gammainc(s, 0, v, regularized=True), a)
    exact = -dcdf / (v ** (a - 1) * mp.exp(-v) / mp.gamma(a))
    assert abs(got - float(exact)) <= 2e-3 * abs(float(exact))


@pytest.mark.parametrize("x, alpha, beta", [(0.05, 0.5, 3.0), (0.4, 2.0, 3.0), (0.97, 4.0, 0.5), (0.45, 9.0, 11.0),
                                            (0.3, 3.0, 2.0)])
def test_dirichlet_grad_approximates_the_exact_beta_derivative(x, alpha, beta):
    """torch's scaled Beta gradient: −(∂I_x(α, β)/∂α) / (x^(α−1)(1−x)^(β−1)/B(α, β)) / (1 − x), I the
    regularized incomplete beta function (mpmath)."""
    x32, a32, t32 = torch.tensor([x]), torch.tensor([alpha]), torch.tensor([alpha + beta])
    with carbon.enabled():
        got = torch._dirichlet_grad(x32, a32, t32).item()
    v, a, b = mp.mpf(x32.item()), mp.mpf(a32.item()), mp.mpf(t32.item()) - mp.mpf(a32.item())
    dcdf = mp.diff(lambda s: mp.betainc(s, b, 0, v, regularized=True), a)
    exact = -dcdf / (v ** (a - 1) * (1 - v) ** (b - 1) / mp.beta(a, b)) / (1 - v)
    assert abs(got - float(exact)) <= 2e-3 * abs(float(exact))


def _train(threads: int) -> list:
    torch.set_num_threads(threads)
    with carbon.enabled(seed=3, strict=True):
        net = torch.nn.Linear(4, 6)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        out = torch.nn.functional.softplus(net(torch.randn(16, 4))) + 0.1
        samples = [D.Gamma(out[:, 0], out[:, 1]).rsample(), D.Beta(out[:, 2], out[:, 3]).rsample(),
                   D.Dirichlet(out[:, 3:]).rsample(), D.StudentT(out[:, 4] + 1.0).rsample(),
                   D.Chi2(out[:, 5]).rsample()]
        loss = sum(s.square().mean() for s in samples)
        loss.backward()
        opt.step()
        return [as_bits(s.detach()) for s in samples] + [str(carbon.fingerprint(net, opt))]


def test_rsample_trains_under_strict_mode_with_the_same_bits_at_1_and_2_threads(restore_num_threads):
    for one, two in zip(_train(1), _train(2)):
        assert torch.equal(one, two) if isinstance(one, torch.Tensor) else one == two


def test_bad_inputs():
    with carbon.enabled():
        with pytest.raises(carbon.NotExactError, match="_standard_gamma_grad in torch.float64"):
            torch._standard_gamma_grad(torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
        assert torch._standard_gamma_grad(torch.ones(0), torch.ones(0)).shape == (0,)
        assert torch._dirichlet_grad(torch.ones(2, 0), torch.ones(2, 0), torch.ones(2, 0)).shape == (2, 0)
