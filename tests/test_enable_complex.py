"""complex64 ops under carbon.enable beyond copies, add and mul (docs/enable.md, carbon/_enable_complex.py): complex
matrix products against a Fraction oracle (one rounding per part), abs / angle / sgn against oracles of their
definitions, complex random draws as draws of the float view, torch.optim steps and clip_grad_norm_ over complex
parameters against the same steps on the float views, and refusals for complex128."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

import carbon
from tests.oracle import as_bits, assert_bits_equal, bits_tensor, round_bits, round_value

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32


def _complex(seed: int, *shape: int, spread: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, 2, generator=g) * torch.exp2(torch.randint(-spread, spread + 1, (*shape, 2), generator=g).float())
    return torch.view_as_complex(x)


def _product_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, N, 2] bits of RN(exact Σ a_re·b_re − a_im·b_im), RN(exact Σ a_re·b_im + a_im·b_re)."""
    ar, ai, br, bi = a.real.tolist(), a.imag.tolist(), b.real.tolist(), b.imag.tolist()
    rows = []
    for i in range(a.shape[0]):
        row = []
        for j in range(b.shape[1]):
            re = sum((Fraction(ar[i][k]) * Fraction(br[k][j]) - Fraction(ai[i][k]) * Fraction(bi[k][j])
                      for k in range(a.shape[1])), Fraction(0))
            im = sum((Fraction(ar[i][k]) * Fraction(bi[k][j]) + Fraction(ai[i][k]) * Fraction(br[k][j])
                      for k in range(a.shape[1])), Fraction(0))
            row.append([round_bits(re, F32), round_bits(im, F32)])
        rows.append(row)
    return bits_tensor(rows, F32)


def test_complex_matrix_products_round_each_part_once():
    a, b = _complex(1, 5, 40), _complex(2, 40, 7)
    x, y = _complex(3, 2, 4, 30), _complex(4, 2, 30, 6)
    with carbon.enabled():
        mm = a @ b
        bmm = torch.bmm(x, y)
        conj = a.conj() @ b  # a conjugated view: its parts resolved exactly
        einsum = torch.einsum("bik,bkj->bij", x, y)
    assert_bits_equal(torch.view_as_real(mm), _product_bits(a, b), "mm")
    assert_bits_equal(torch.view_as_real(conj), _product_bits(a.conj().resolve_conj(), b), "conj mm")
    for k in range(2):
        assert_bits_equal(torch.view_as_real(bmm[k]), _product_bits(x[k], y[k]), "bmm")
    assert torch.equal(as_bits(torch.view_as_real(einsum)), as_bits(torch.view_as_real(bmm)))


def test_complex_product_gradients_run_under_strict_mode_and_are_close_to_complex128():
    a = _complex(5, 6, 8).requires_grad_()
    b = _complex(6, 8, 3).requires_grad_()
    with carbon.enabled():
        (a @ b).abs().sum().backward()
    a64 = a.detach().to(torch.complex128).requires_grad_()
    b64 = b.detach().to(torch.complex128).requires_grad_()
    (a64 @ b64).abs().sum().backward()
    for g, w in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert (g.to(w.dtype) - w).abs().max().item() <= 1e-5 * w.abs().max().item()


def test_abs_angle_and_sgn_are_their_documented_roundings():
    z = _complex(7, 300, spread=20)
    z[:4] = torch.tensor([0j, complex(-0.0, 0.0), complex(3.0, -4.0), complex(0.0, -2.0)])
    with carbon.enabled():
        got_abs, got_angle, got_sgn = z.abs(), z.angle(), z.sgn()
    re, im = z.real.tolist(), z.imag.tolist()
    # |z| = RN32(√RN64(re² + im²)) in binary64 (the squares exact; Python's sqrt is IEEE's), the hypot definition
    moduli = [round_value(math.sqrt(a * a + b * b), F32) for a, b in zip(re, im)]
    assert_bits_equal(got_abs, bits_tensor([round_bits(m, F32) for m in moduli], F32), "abs")
    with mpmath.workprec(200):
        angles = [round_bits(float(mpmath.atan2(b, a)) if (a, b) != (0.0, 0.0) else math.atan2(b, a), F32)
                  for a, b in zip(re, im)]
    assert_bits_equal(got_angle, bits_tensor(angles, F32), "angle")
    sgn = [[0, 0] if m == 0 else [round_bits(Fraction(a) / m, F32), round_bits(Fraction(b) / m, F32)]
           for a, b, m in zip(re, im, moduli)]
    assert_bits_equal(torch.view_as_real(got_sgn), bits_tensor(sgn, F32), "sgn")


def test_complex_draws_are_draws_of_the_float_view():
    with carbon.enabled(seed=11):
        u = torch.rand(3, 5, dtype=torch.cfloat)
        n = torch.randn(4, dtype=torch.cfloat)
        filled = torch.empty(2, 3, dtype=torch.cfloat).uniform_(-2, 2)
    with carbon.enabled(seed=11):
        u_view = torch.rand(3, 5, 2)
        n_view = torch.normal(0.0, 1 / math.sqrt(2), (4, 2))  # torch's rule: each part has variance 1/2
        filled_view = torch.empty(2, 3, 2).uniform_(-2, 2)
    assert torch.equal(torch.view_as_real(u), u_view)
    assert torch.equal(torch.view_as_real(n), n_view)
    assert torch.equal(torch.view_as_real(filled), filled_view)
    with carbon.enabled(seed=12):
        big = torch.randn(200000, dtype=torch.cfloat)
    assert abs(big.abs().square().mean().item() - 1) < 0.02  # E|z|² = 1


@pytest.mark.parametrize("make", [lambda ps: torch.optim.Adam(ps, lr=0.01),
                                  lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
                                  lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True)])
def test_optimizers_step_a_complex_parameter_as_its_float_view(make):
    """torch.optim treats a complex parameter's parts as independent real parameters (its _view_as_real); so
    does carbon's step: the same bits as stepping the float view, and torch.optim's state format."""
    w0 = _complex(8, 6, 4)
    complex_param = torch.nn.Parameter(w0.clone())
    view_param = torch.nn.Parameter(torch.view_as_real(w0).clone())
    opt_c, opt_v = make([complex_param]), make([view_param])
    for step in range(3):
        grad = _complex(20 + step, 6, 4)
        complex_param.grad, view_param.grad = grad.clone(), torch.view_as_real(grad).clone()
        with carbon.enabled():
            opt_c.step()
            opt_v.step()
    assert torch.equal(as_bits(torch.view_as_real(complex_param.detach())), as_bits(view_param.detach()))
    assert all(v.dtype == torch.complex64 for k, v in opt_c.state[complex_param].items() if k != "step")


def test_clip_grad_norm_over_complex_parameters_is_the_float_views_norm():
    params = [torch.nn.Parameter(_complex(30, 5, 3)), torch.nn.Parameter(torch.randn(7))]
    views = [torch.nn.Parameter(torch.view_as_real(params[0].detach()).clone()), torch.nn.Parameter(params[1].detach().clone())]
    grads = [_complex(31, 5, 3) * 10, torch.randn(7) * 10]
    for p, v, g in zip(params, views, grads):
        p.grad = g.clone()
        v.grad = (torch.view_as_real(g) if g.is_complex() else g).clone()
    with carbon.enabled():
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        view_norm = torch.nn.utils.clip_grad_norm_(views, 1.0)
    assert torch.equal(as_bits(norm), as_bits(view_norm))
    assert torch.equal(as_bits(torch.view_as_real(params[0].grad)), as_bits(views[0].grad))
    assert torch.equal(as_bits(params[1].grad), as_bits(views[1].grad))
    want = math.sqrt(sum(float(np.sum(np.abs(g.numpy().astype(np.complex128)) ** 2)) for g in grads))
    assert abs(norm.item() - want) <= 1e-6 * want


def test_complex128_is_refused():
    z = _complex(40, 3, 3).to(torch.complex128)
    with carbon.enabled():
        for fn in (lambda: z @ z, lambda: z.abs(), lambda: torch.fft.fft(z), lambda: torch.randn(3, dtype=torch.cdouble)):
            with pytest.raises(carbon.NotExactError, match="complex128|cdouble|ComplexDouble"):
                fn()
