"""torch's gamma family under carbon.enable (docs/enable.md): lgamma, digamma, polygamma(0 | 1, .) and their
special.* / in-place / integer-input forms run carbon's functions (whose values tests/test_elementwise_gamma.py
checks against mpmath); polygamma of a higher order is refused under strict mode. The distributions built
on them — Beta, Gamma, Dirichlet, StudentT, Poisson, Binomial, Chi2 log-densities, entropies and KL
divergences — run under strict mode with gradients, give the same bits at 1 and 2 threads and for a sample
alone or in a batch, and agree with torch's float64 evaluation."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D

import carbon
from oracle import as_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")


def _x():
    return torch.linspace(-7.3, 9.1, 301)


def test_the_aten_ops_run_carbons_functions():
    x = _x()
    with carbon.enabled():
        pairs = [(torch.lgamma(x), carbon.lgamma(x)), (torch.digamma(x), carbon.digamma(x)),
                 (torch.polygamma(0, x), carbon.digamma(x)), (torch.polygamma(1, x), carbon.trigamma(x)),
                 (torch.special.gammaln(x), carbon.lgamma(x)), (torch.special.psi(x), carbon.digamma(x)),
                 (torch.special.digamma(x), carbon.digamma(x)), (torch.special.polygamma(1, x), carbon.trigamma(x)),
                 (x.clone().lgamma_(), carbon.lgamma(x)), (x.clone().digamma_(), carbon.digamma(x)),
                 (x.clone().polygamma_(1), carbon.trigamma(x)), (x.lgamma(), carbon.lgamma(x))]
        ints = torch.lgamma(torch.arange(1, 30))  # integer tensors: in the default dtype, as torch
    for got, want in pairs:
        assert torch.equal(as_bits(got), as_bits(want))
    assert ints.dtype == torch.float32
    assert torch.equal(as_bits(ints), as_bits(carbon.lgamma(torch.arange(1, 30).float())))
    # the same functions differ from torch's own kernels somewhere in this range (else the test shows nothing)
    assert not torch.equal(as_bits(torch.digamma(x)), as_bits(carbon.digamma(x))) or \
        not torch.equal(as_bits(torch.lgamma(x)), as_bits(carbon.lgamma(x)))


def test_backward_is_torchs_formula_of_routed_ops():
    x = torch.linspace(0.3, 6.0, 40).requires_grad_(True)
    g = torch.linspace(-2.0, 2.0, 40)
    with carbon.enabled():
        (d_lgamma,) = torch.autograd.grad(torch.lgamma(x), x, g)
        (d_digamma,) = torch.autograd.grad(torch.digamma(x), x, g)
    xd = x.detach()
    # lgamma' = g * digamma(x) and digamma' = g * polygamma(1, x): one rounding each of torch's mul
    assert torch.equal(as_bits(d_lgamma), as_bits(g * carbon.digamma(xd)))
    assert torch.equal(as_bits(d_digamma), as_bits(g * carbon.trigamma(xd)))


def test_polygamma_of_higher_order_is_refused():
    with carbon.enabled():
        with pytest.raises(carbon.NotExactError, match=r"polygamma"):
            torch.polygamma(2, torch.ones(3))
        x = torch.linspace(0.5, 3.0, 5).requires_grad_(True)
        y = torch.polygamma(1, x)  # its backward needs polygamma(2, x)
        with pytest.raises(carbon.NotExactError, match=r"polygamma"):
            y.sum().backward()


def _distributions():
    g = torch.Generator().manual_seed(4)
    a = (torch.rand(64, generator=g) * 4 + 0.2).requires_grad_(True)
    b = (torch.rand(64, generator=g) * 4 + 0.2).requires_grad_(True)
    p = torch.rand(64, generator=g) * 0.98 + 0.01
    k = torch.randint(0, 12, (64,), generator=g).float()
    conc = (torch.rand(64, 5, generator=g) * 3 + 0.1).requires_grad_(True)
    simplex = torch.softmax(torch.randn(64, 5, generator=g), -1)
    t = torch.randn(64, generator=g) * 3
    return a, b, p, k, conc, simplex, t


def _terms(a, b, p, k, conc, simplex, t):
    return [
        D.Beta(a, b).log_prob(p), D.Beta(a, b).entropy(),
        D.Gamma(a, b).log_prob(p * 5), D.Gamma(a, b).entropy(),
        D.Dirichlet(conc).log_prob(simplex), D.Dirichlet(conc).entropy(),
        D.StudentT(a + 1, t, b).log_prob(t * 0.7), D.StudentT(a + 1, t, b).entropy(),
        D.Poisson(a).log_prob(k), D.Binomial(12, probs=p).log_prob(k), D.Chi2(a).log_prob(p * 3),
        D.kl_divergence(D.Beta(a, b), D.Beta(b, a)), D.kl_divergence(D.Gamma(a, b), D.Gamma(b, a)),
    ]


def _run(threads: int):
    torch.set_num_threads(threads)
    a, b, p, k, conc, simplex, t = _distributions()
    with carbon.enabled():
        terms = _terms(a, b, p, k, conc, simplex, t)
        loss = sum(term.sum() for term in terms)
        grads = torch.autograd.grad(loss, (a, b, conc))
    return [as_bits(x.detach()) for x in terms + list(grads)]


def test_distributions_run_under_strict_mode_with_the_same_bits_at_1_and_2_threads(restore_num_threads):
    one, two = _run(1), _run(2)
    for x, y in zip(one, two):
        assert torch.equal(x, y)


def test_distributions_agree_with_torch_in_float64():
    a, b, p, k, conc, simplex, t = _distributions()
    with carbon.enabled():
        got = _terms(a, b, p, k, conc, simplex, t)
    want = _terms(*(x.detach().double() for x in (a, b, p, k, conc, simplex, t)))
    for g, w in zip(got, want):
        assert torch.allclose(g.detach().double(), w, rtol=2e-5, atol=2e-5)


def test_a_sample_alone_equals_its_row_in_the_batch():
    a, b, p, k, conc, simplex, t = (x.detach() for x in _distributions())
    with carbon.enabled():
        batch = D.Dirichlet(conc).log_prob(simplex), D.Beta(a, b).entropy(), D.Poisson(a).log_prob(k)
        alone = D.Dirichlet(conc[7]).log_prob(simplex[7]), D.Beta(a[7], b[7]).entropy(), D.Poisson(a[7]).log_prob(k[7])
    for x, y in zip(batch, alone):
        assert torch.equal(as_bits(x[7]), as_bits(y))


def test_mvlgamma_is_torchs_formula_with_carbons_lgamma():
    from fractions import Fraction
    import math
    from oracle import bits_to_float, round_bits
    x = torch.linspace(1.6, 9.0, 37)
    with carbon.enabled():
        got = torch.mvlgamma(x, 3)
        ints = torch.special.multigammaln(torch.arange(2, 7), 2)
    # independent: the terms' exact sum (Fractions) rounded once, then one float32 addition of the constant
    c = float(torch.tensor(3 * 2 * math.log(math.pi) * 0.25, dtype=torch.float32))
    for i, xi in enumerate(x.tolist()):
        terms = carbon.lgamma(torch.tensor([xi - 1.0, xi - 0.5, xi])).tolist()
        s = bits_to_float(round_bits(sum(Fraction(t) for t in terms), torch.float32), torch.float32)
        want = torch.tensor(s + c, dtype=torch.float32)  # the double sum of two
        # float32 values rounded to float32 is their correctly rounded float32 sum
        assert got[i].item() == want.item(), i
    assert ints.dtype == torch.float32 and torch.allclose(ints, torch.mvlgamma(torch.arange(2, 7).float(), 2))
