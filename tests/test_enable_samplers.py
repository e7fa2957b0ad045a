"""The samplers that draw by rejection under carbon.enable (docs/enable.md, carbon/_enable_samplers.py):
``_standard_gamma`` and ``_sample_dirichlet`` against an independent Python evaluation of the documented
definition (Marsaglia–Tsang with a fixed budget of 24 attempts per element, binary64 steps, logs / exps /
powers correctly rounded by mpmath) on the same carbon draws; the samples' distribution against the exact
gamma CDF (mpmath's regularized incomplete gamma function, Kolmogorov–Smirnov); 1 vs 2 threads; and
Gamma / Beta / Dirichlet / StudentT / Chi2 sampling under strict mode. ``poisson`` and ``binomial`` likewise
(Python + mpmath + Fraction evaluations of their definitions on the same draws, Kolmogorov distance to the
exact CDF, 1 vs 2 threads). The reparameterized gradients: tests/test_enable_sampler_grads.py."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
import torch
from torch import distributions as D

import carbon
from oracle import as_bits, bits_to_float, round_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
K = 24
mp.mp.prec = 200


def rn(v) -> float:
    return float(v)  # an mpf at 200 bits rounded to the nearest double


def f32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def gamma_oracle(alpha: float, normals, uniforms, boost_u: float) -> float:
    """The definition of docs/enable.md in Python floats (IEEE binary64) and mpmath."""
    if math.isnan(alpha) or alpha < 0:
        return math.nan
    if alpha == 0:
        return 0.0
    a = alpha + 1.0 if alpha < 1 else alpha
    d = a - 1.0 / 3.0
    c = rn(mp.power(mp.mpf(d * 9.0), -0.5)) if math.isfinite(d) else 0.0
    g = d
    for x, u in zip(normals, uniforms):
        t = c * x + 1.0
        v = (t * t) * t
        if not v > 0:
            continue
        log_v = rn(mp.log(v))
        log_u = rn(mp.log(u)) if u > 0 else -math.inf
        bound = (x * x) * 0.5 + d * ((1.0 - v) + log_v) if math.isfinite(d) else math.nan
        if log_u < bound:
            g = d * v
            break
    if alpha < 1:
        log_b = rn(mp.log(boost_u)) if boost_u > 0 else -math.inf
        g = g * (rn(mp.exp(log_b / alpha)) if log_b > -math.inf else 0.0)
    return g


def draws(seed: int, n: int):
    """The draws the route makes, in its order: K normals and K uniforms per element, one more uniform each."""
    with carbon.enabled(seed=seed):
        normals = torch.randn(n, K).double().tolist()
        uniforms = torch.rand(n, K).double().tolist()
        boost = torch.rand(n).double().tolist()
    return normals, uniforms, boost


ALPHAS = [0.0, 1e-30, 1e-3, 0.3, 0.999, 1.0, 1.5, 2.5, 7.0, 50.0, 1e4, 3e9, math.inf, math.nan, -1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_standard_gamma_is_the_definition(dtype):
    rng = np.random.default_rng(0)
    alpha = torch.tensor(ALPHAS + list(rng.gamma(1.0, 2.0, 200)), dtype=torch.float32).to(dtype)
    with carbon.enabled(seed=11):
        got = torch._standard_gamma(alpha)
    normals, uniforms, boost = draws(11, alpha.numel())
    tiny = torch.finfo(dtype).tiny
    for i, a in enumerate(alpha.double().tolist()):
        g = gamma_oracle(a, normals[i], uniforms[i], boost[i])
        want = torch.tensor(f32(g), dtype=torch.float32).to(dtype)  # RN32, then RN of the dtype
        if not math.isnan(g):
            want = want.clamp_min(tiny)
        assert as_bits(got[i:i + 1]).item() == as_bits(want.reshape(1)).item(), (i, a, got[i].item(), g)


def test_sample_dirichlet_is_the_definition():
    rng = np.random.default_rng(1)
    alpha = torch.tensor(rng.gamma(1.0, 1.5, (40, 6)) + 0.05, dtype=torch.float32)
    with carbon.enabled(seed=5):
        got = torch._sample_dirichlet(alpha)
    normals, uniforms, boost = draws(5, alpha.numel())
    flat = alpha.double().flatten().tolist()
    g32 = [f32(gamma_oracle(a, normals[i], uniforms[i], boost[i])) for i, a in enumerate(flat)]
    eps, tiny = torch.finfo(torch.float32).eps, torch.finfo(torch.float32).tiny
    for r in range(40):
        row = g32[6 * r:6 * r + 6]
        total = round_bits(sum(Fraction(v) for v in row), torch.float32)  # the exact sum, rounded once
        total = torch.tensor([total], dtype=torch.int32).view(torch.float32).item()
        want = [min(max(f32(v / total), tiny), 1.0 - eps) for v in row]
        assert got[r].tolist() == want, r


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 50.0])
def test_samples_follow_the_gamma_distribution(alpha):
    n = 4000
    with carbon.enabled(seed=2):
        x = sorted(torch._standard_gamma(torch.full((n,), alpha)).double().tolist())
    cdf = [float(mp.gammainc(alpha, 0, v, regularized=True)) for v in x]
    ks = max(max((i + 1) / n - c, c - i / n) for i, c in enumerate(cdf))
    assert ks < 1.63 / math.sqrt(n), ks  # the 1% critical value


def _sample_all(threads: int):
    torch.set_num_threads(threads)
    with carbon.enabled(seed=7):
        a, b = torch.linspace(0.2, 6.0, 300), torch.linspace(5.0, 0.4, 300)
        out = [D.Gamma(a, b).sample(), D.Beta(a, b).sample((2,)), D.Dirichlet(torch.stack([a, b], -1)).sample(),
               D.StudentT(a + 0.5).sample(), D.Chi2(a).sample(), torch._standard_gamma(a.to(torch.bfloat16))]
    return [as_bits(t) for t in out]


def test_distributions_sample_under_strict_mode_with_the_same_bits_at_1_and_2_threads(restore_num_threads):
    for x, y in zip(_sample_all(1), _sample_all(2)):
        assert torch.equal(x, y)


def test_empty_and_bad_inputs():
    with carbon.enabled(seed=1):
        assert torch._standard_gamma(torch.ones(0, 3)).shape == (0, 3)
        assert torch._sample_dirichlet(torch.ones(2, 0)).shape == (2, 0)
        with pytest.raises(carbon.NotExactError, match=r"_standard_gamma in torch\.float64"):
            torch._standard_gamma(torch.ones(3, dtype=torch.float64))


# ---- Poisson ----------------------------------------------------------------------------------------------------

def _log(v: float) -> float:
    return rn(mp.log(v)) if v > 0 else -math.inf


def _log_factorial(k: float) -> float:
    if k < 16:
        return rn(mp.log(mp.factorial(int(k))))
    z = k + 1.0
    inv = 1.0 / z
    w = inv * inv
    series = inv * (w * (w * (1.0 / 1260.0) + (-1.0 / 360.0)) + 1.0 / 12.0)
    return ((((z - 0.5) * _log(z)) - z) + float.fromhex("0x1.d67f1c864beb5p-1")) + series


def poisson_oracle(lam: float, counts_u, u_list, v_list) -> float:
    """docs/enable.md's definition in Python floats and mpmath, on the route's draws."""
    if not math.isfinite(lam) or lam < 0:
        return math.nan
    if lam < 10:
        e = [f32(-f32(rn(mp.log(1.0 - u)))) if u < 1 else math.inf for u in counts_u]
        total, n = Fraction(0), 0
        for x in e:
            total += Fraction(x)
            s = bits_to_float(round_bits(total, torch.float32), torch.float32)
            n += s <= f32(lam)
        return float(n)
    b = math.sqrt(lam) * 2.53 + 0.931
    a = b * 0.02483 + (-0.059)
    log_inv_alpha = _log(1.1328 / (b - 3.4) + 1.1239)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    for u, v in zip(u_list, v_list):
        u = u - 0.5
        us = 0.5 - abs(u)
        k = math.floor((((a * 2.0) / us + b) * u + lam) + 0.43) if us > 0 else -math.inf
        if us >= 0.07 and v <= v_r:
            return float(k)
        if k < 0 or (us < 0.013 and v > us):
            continue
        lhs = (_log(v) + log_inv_alpha) - _log(a / (us * us) + b)
        rhs = (-lam + k * _log(lam)) - _log_factorial(float(k))
        if lhs <= rhs:
            return float(k)
    return float(math.floor(lam))


def test_poisson_is_the_definition():
    rates = [0.0, 1e-30, 0.3, 1.0, 2.5, 9.99, 10.0, 10.5, 33.0, 1e3, 12345.6, 1e7, math.inf, math.nan, -2.0]
    lam = torch.tensor(rates * 6, dtype=torch.float32)
    n = lam.numel()
    with carbon.enabled(seed=21):
        got = torch.poisson(lam).tolist()
    with carbon.enabled(seed=21):
        counts_u = torch.rand(n, 64).double().tolist()
        u = torch.rand(n, K).double().tolist()
        v = torch.rand(n, K).double().tolist()
    for i, r in enumerate(lam.tolist()):
        want = poisson_oracle(r, counts_u[i], u[i], v[i])
        assert got[i] == want or (math.isnan(got[i]) and math.isnan(want)), (i, r, got[i], want)


@pytest.mark.parametrize("rate", [0.7, 4.0, 9.5, 10.0, 37.0, 1000.0])
def test_poisson_samples_follow_the_distribution(rate):
    n = 4000
    with carbon.enabled(seed=3):
        x = torch.poisson(torch.full((n,), rate)).tolist()
    counts = {}
    for k in x:
        counts[int(k)] = counts.get(int(k), 0) + 1
    emp, cdf, worst = 0, mp.mpf(0), 0.0
    for k in range(0, int(max(x)) + 1):
        emp += counts.get(k, 0)
        cdf += mp.exp(-rate + k * mp.log(rate) - mp.loggamma(k + 1))
        worst = max(worst, abs(emp / n - float(cdf)))
    assert worst < 1.63 / math.sqrt(n), worst  # Kolmogorov's 1% value (conservative for a discrete law)


def test_poisson_sampling_under_strict_mode_at_1_and_2_threads(restore_num_threads):
    def run(threads):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=8):
            lam = torch.linspace(0.0, 60.0, 3001)
            return as_bits(D.Poisson(lam).sample()), as_bits(torch.poisson(lam.half() * 100))
    for x, y in zip(run(1), run(2)):
        assert torch.equal(x, y)


# ---- binomial ---------------------------------------------------------------------------------------------------

def binomial_oracle(n: float, p: float, wait_u, u_list, v_list) -> float:
    """docs/enable.md's definition in Python floats and mpmath, on the route's draws."""
    if not math.isfinite(n) or n < 0 or not 0 <= p <= 1:
        return math.nan
    flip = p > 0.5
    q = 1.0 - p if flip else p
    if n * q < 10:
        log_q = _log(1.0 - q)
        total, x = 0.0, 0
        for u in wait_u:
            g = 2.0**47 if log_q == 0 else min(math.floor(_log(u) / log_q) + 1.0, 2.0**47)
            total += g
            x += total <= n
        x = float(x)
    else:
        spq = math.sqrt((n * q) * (1.0 - q))
        b = spq * 2.53 + 1.15
        a = (b * 0.0248 + (-0.0873)) + q * 0.01
        c = n * q + 0.5
        v_r = 0.92 - 4.2 / b
        alpha = (5.1 / b + 2.83) * spq
        lpq = _log(q / (1.0 - q))
        m = math.floor((n + 1.0) * q)
        h = _log_factorial(m) + _log_factorial(n - m)
        x = float(math.floor(n * q))
        for u, v in zip(u_list, v_list):
            u = u - 0.5
            us = 0.5 - abs(u)
            k = math.floor(((a * 2.0) / us + b) * u + c) if us > 0 else -math.inf
            if not 0 <= k <= n:
                continue
            if (us >= 0.07 and v <= v_r) or \
                    _log((v * alpha) / (a / (us * us) + b)) <= ((h - _log_factorial(k)) - _log_factorial(n - k)) + (k - m) * lpq:
                x = float(k)
                break
    return n - x if flip else x


def test_binomial_is_the_definition():
    pairs = [(10, 0.5), (0, 0.3), (5, 0.0), (100, 1.0), (1000, 0.02), (50, 0.9), (1e6, 0.3), (7, 0.999), (3e4, 1e-4),
             (25, 0.4), (40, 0.75), (2, 0.5), (-1, 0.5), (math.nan, 0.5), (5, 1.5), (math.inf, 0.1)]
    n = torch.tensor([c for c, _ in pairs] * 6, dtype=torch.float32)
    p = torch.tensor([q for _, q in pairs] * 6, dtype=torch.float32)
    with carbon.enabled(seed=13):
        got = torch.binomial(n, p).tolist()
    with carbon.enabled(seed=13):
        wait_u = torch.rand(n.numel(), 64).double().tolist()
        u = torch.rand(n.numel(), K).double().tolist()
        v = torch.rand(n.numel(), K).double().tolist()
    for i, (ni, pi) in enumerate(zip(n.tolist(), p.tolist())):
        want = binomial_oracle(ni, pi, wait_u[i], u[i], v[i])
        assert got[i] == want or (math.isnan(got[i]) and math.isnan(want)), (i, ni, pi, got[i], want)


@pytest.mark.parametrize("n,p", [(10, 0.5), (200, 0.03), (60, 0.4), (1000, 0.97), (5000, 0.2)])
def test_binomial_samples_follow_the_distribution(n, p):
    draws_n = 4000
    with carbon.enabled(seed=4):
        x = torch.binomial(torch.full((draws_n,), float(n)), torch.full((draws_n,), p)).tolist()
    counts = {}
    for k in x:
        counts[int(k)] = counts.get(int(k), 0) + 1
    emp, cdf, worst = 0, mp.mpf(0), 0.0
    for k in range(0, n + 1):
        emp += counts.get(k, 0)
        cdf += mp.binomial(n, k) * mp.mpf(p) ** k * (1 - mp.mpf(p)) ** (n - k)
        worst = max(worst, abs(emp / draws_n - float(cdf)))
    assert worst < 1.63 / math.sqrt(draws_n), worst


def test_binomial_sampling_under_strict_mode_at_1_and_2_threads(restore_num_threads):
    def run(threads):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=8):
            probs = torch.linspace(0.0, 1.0, 2001)
            return as_bits(D.Binomial(40, probs).sample()), as_bits(torch.binomial(probs * 1e4, probs))
    for x, y in zip(run(1), run(2)):
        assert torch.equal(x, y)
