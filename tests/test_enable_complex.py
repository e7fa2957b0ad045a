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


def _f32(v: float) -> float:
    return float(np.float32(v))


def test_complex_scalars_promote_as_torch_and_products_round_each_operation():
    """``1j * t`` reaches mul with a 0-dim complex128 wrapped scalar: it is rounded to complex64 as torch does."""
    t, z = torch.randn(50), _complex(9, 50)
    with carbon.enabled():
        imaginary = 1j * t
        scaled = z * (0.1 + 3j)
    assert torch.equal(imaginary.real, torch.zeros(50)) and torch.equal(imaginary.imag, t)
    c, d = np.float32(0.1), np.float32(3.0)
    want = [[round_bits(_f32(np.float32(a) * c - np.float32(b) * d), F32),
             round_bits(_f32(np.float32(a) * d + np.float32(b) * c), F32)] for a, b in zip(z.real.tolist(), z.imag.tolist())]
    assert_bits_equal(torch.view_as_real(scaled), bits_tensor(want, F32))


def test_complex_quotients_are_binary64_expressions_rounded_once():
    x, y = _complex(10, 400, spread=30), _complex(11, 400, spread=30)
    r = torch.randn(400)
    with carbon.enabled():
        q, by_real, real_by_complex, inverse = x / y, x / r, r / y, 1 / y
    (a, b), (c, d) = (x.real.tolist(), x.imag.tolist()), (y.real.tolist(), y.imag.tolist())
    den = [ci * ci + di * di for ci, di in zip(c, d)]  # Python floats: binary64, the squares exact
    checks = [
        (q, [((ai * ci + bi * di) / n, (bi * ci - ai * di) / n) for ai, bi, ci, di, n in zip(a, b, c, d, den)]),
        (by_real, [(Fraction(ai) / Fraction(ri), Fraction(bi) / Fraction(ri)) for ai, bi, ri in zip(a, b, r.tolist())]),
        (real_by_complex, [((ri * ci) / n, -(ri * di) / n) for ri, ci, di, n in zip(r.tolist(), c, d, den)]),
        (inverse, [(ci / n, -di / n) for ci, di, n in zip(c, d, den)]),
    ]
    for got, parts in checks:
        want = [[round_bits(Fraction(re) if not isinstance(re, Fraction) else re, F32),
                 round_bits(Fraction(im) if not isinstance(im, Fraction) else im, F32)] for re, im in parts]
        assert_bits_equal(torch.view_as_real(got), bits_tensor(want, F32))


def test_complex_exp_is_binary64_exp_cos_sin_rounded_once():
    z = _complex(12, 300, spread=3)
    z[0] = complex(0.0, 0.0)
    with carbon.enabled():
        got = torch.exp(z)
    want = []
    with mpmath.workprec(200):
        for a, b in zip(z.real.tolist(), z.imag.tolist()):
            e, c, s = (float(f(mpmath.mpf(v))) for f, v in ((mpmath.exp, a), (mpmath.cos, b), (mpmath.sin, b)))
            want.append([round_bits(e * c, F32), round_bits(e * s, F32)])  # e·c: one binary64 rounding
    assert_bits_equal(torch.view_as_real(got), bits_tensor(want, F32))
    ref = torch.exp(z.to(torch.complex128))
    assert ((got.to(torch.complex128) - ref).abs() / ref.abs()).max().item() < 1.2e-7


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


def test_complex_vector_norms():
    """ord 2: RN(√RN(exact Σ re² + im²)) (the float view's norm); ord 1: RN(exact Σ |z|) with |z| abs's rounding."""
    from tests.oracle import sqrt_bits
    z = _complex(13, 5, 9, spread=12)
    with carbon.enabled():
        whole, rows, ones = torch.linalg.vector_norm(z), torch.linalg.vector_norm(z, dim=1), torch.linalg.vector_norm(z, 1, dim=1)
        fro = torch.linalg.norm(z)
    parts_ = [[(Fraction(a), Fraction(b)) for a, b in zip(ra, rb)] for ra, rb in zip(z.real.tolist(), z.imag.tolist())]
    squares = [sum((a * a + b * b for a, b in row), Fraction(0)) for row in parts_]
    assert_bits_equal(whole, bits_tensor(sqrt_bits(round_value(sum(squares, Fraction(0)), F32), F32), F32), "ord 2")
    assert torch.equal(as_bits(fro), as_bits(whole))
    assert_bits_equal(rows, bits_tensor([sqrt_bits(round_value(q, F32), F32) for q in squares], F32), "ord 2, rows")
    moduli = [[round_value(math.sqrt(float(a) ** 2 + float(b) ** 2), F32) for a, b in row] for row in parts_]
    assert_bits_equal(ones, bits_tensor([round_bits(sum(row, Fraction(0)), F32) for row in moduli], F32), "ord 1")


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


class S4DKernel(torch.nn.Module):
    """S4D's diagonal state-space kernel (Gu et al., the state-spaces repository's minimal S4D): complex exp of
    dt·A, a complex quotient, a Vandermonde product through a complex einsum."""

    def __init__(self, channels: int, states: int) -> None:
        super().__init__()
        log_dt = torch.rand(channels) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
        self.C = torch.nn.Parameter(torch.view_as_real(torch.randn(channels, states // 2, dtype=torch.cfloat)))
        self.log_dt = torch.nn.Parameter(log_dt)
        self.log_A_real = torch.nn.Parameter(torch.log(0.5 * torch.ones(channels, states // 2)))
        self.A_imag = torch.nn.Parameter(math.pi * torch.arange(states // 2).repeat(channels, 1).float())

    def forward(self, length: int) -> torch.Tensor:
        dt = torch.exp(self.log_dt)
        c = torch.view_as_complex(self.C)
        a = -torch.exp(self.log_A_real) + 1j * self.A_imag
        dt_a = a * dt.unsqueeze(-1)
        k = dt_a.unsqueeze(-1) * torch.arange(length, device=a.device)
        c = c * (torch.exp(dt_a) - 1.0) / a
        return 2 * torch.einsum("hn,hnl->hl", c, torch.exp(k)).real


class S4D(torch.nn.Module):
    def __init__(self, channels: int = 8, states: int = 16) -> None:
        super().__init__()
        self.D = torch.nn.Parameter(torch.randn(channels))
        self.kernel = S4DKernel(channels, states)
        self.output = torch.nn.Sequential(torch.nn.Conv1d(channels, 2 * channels, 1), torch.nn.GLU(dim=-2))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        n = u.shape[-1]
        k = self.kernel(n)
        y = torch.fft.irfft(torch.fft.rfft(u, n=2 * n) * torch.fft.rfft(k, n=2 * n), n=2 * n)[..., :n]
        return self.output(torch.nn.functional.gelu(y + u * self.D.unsqueeze(-1)))


def test_s4d_trains_under_strict_mode_with_the_same_bits_at_any_thread_count(restore_num_threads):
    prints = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=4):
            model = S4D()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            u = torch.randn(2, 8, 50)
            for _ in range(2):
                model(u).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        prints.append(carbon.fingerprint(model, optimizer))
    assert prints[0] == prints[1]


def test_s4d_kernel_is_close_to_complex128():
    torch.manual_seed(5)
    kernel = S4DKernel(4, 16)
    with carbon.enabled():
        got = kernel(64)
    params = {name: p.detach().double() for name, p in kernel.named_parameters()}
    dt = torch.exp(params["log_dt"])
    c = torch.view_as_complex(params["C"])
    a = -torch.exp(params["log_A_real"]) + 1j * params["A_imag"]
    dt_a = a * dt.unsqueeze(-1)
    want = 2 * torch.einsum("hn,hnl->hl", c * (torch.exp(dt_a) - 1.0) / a,
                            torch.exp(dt_a.unsqueeze(-1) * torch.arange(64, dtype=torch.float64))).real
    assert (got.double() - want).abs().max().item() <= 2e-5 * want.abs().max().item()
