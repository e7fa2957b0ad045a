"""carbon.enable routes for the reparameterized gradients of the gamma family's samplers: ``aten._standard_gamma_grad``
(``Gamma``, ``Chi2``, ``StudentT`` ``rsample`` with ``requires_grad``) and ``aten._dirichlet_grad`` (``Dirichlet``,
``Beta``). Definitions in docs/enable.md; tests/test_enable_sampler_grads.py has an independent scalar oracle.

Both are torch's approximations (Jankowiak and Obermeyer, "Pathwise derivatives beyond the reparameterization
trick", 2018): dx/dα = −(∂F/∂α)/f for a sample x of Gamma(α) (F its CDF, f its density), and the scaled Beta
gradient for the Dirichlet — piecewise: Taylor series where x is small, Rice saddle-point expansions where the
parameters are large, fitted rational functions elsewhere. torch evaluates them with the platform's libm
(and float arithmetic on a GPU, double on the CPU), so the bits depend on the device. Here every branch is
the same expression tree in binary64, one IEEE operation at a time in torch's evaluation order, with carbon's
float64 log, exp and x^c (c a constant; correctly rounded except next to a midpoint, contract §float64),
x^y = EXP(RN(y·LOG x)) for a tensor exponent (1 when y = 0), and ψ = carbon's float32 digamma of the float32
parameters (exact in binary64). Every branch is computed for every element and the branch is selected by the
same comparisons as torch's; the binary64 result is rounded to float32, then to bfloat16 / float16 (carbon's rounding). The branch constants are
torch's: 0.8f, 0.9f, 1.1f as float32 values, the others exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["standard_gamma_grad", "dirichlet_grad"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

_F32 = {c: float(torch.tensor(c, dtype=torch.float32)) for c in (0.8, 0.9, 1.1)}  # torch's float literals 0.8f, …

# The bivariate rational approximation of dx/dα for Gamma(α), 1 ≤ … (torch's coef_uv): rows are the constant,
# u and u² parts of the eight coefficients (four of p, four of q, as polynomials in v = log α).
_GAMMA_UV = (
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1.0, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367,
     -1.5247877e-07),
)

# The rational correction of the Dirichlet (Beta) gradient: [p or q][power of u][power of a][power of b].
_DIRICHLET_C = (
    (((1.003668233, -0.01061107488, -0.0657888334, 0.01201642863),
      (0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033),
      (-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013)),
     ((0.221950385, -0.3187676331, 0.01799915743, 0.01074823814),
      (-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057),
      (0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05)),
     ((-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565),
      (0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181),
      (0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05))),
    (((1.0, -0.02924021934, -0.04438342661, 0.007285809825),
      (0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521),
      (-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149)),
     ((0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273),
      (0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956),
      (-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05)),
     ((0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05),
      (0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05),
      (-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06))),
)


# ---- binary64 steps (each one IEEE operation, or one correctly rounded function) -------------------------------

def _add(x: Any, y: Any) -> Tensor:
    return aten.add(x, y) if isinstance(x, Tensor) else aten.add(y, x)


def _sub(x: Any, y: Any) -> Tensor:
    return aten.sub(x, y) if isinstance(x, Tensor) else aten.rsub(y, x)


def _mul(x: Any, y: Any) -> Tensor:
    return aten.mul(x, y) if isinstance(x, Tensor) else aten.mul(y, x)


def _div(x: Any, y: Any) -> Tensor:
    return routes.true_divide(x, y)


def _log(x: Tensor) -> Tensor:
    return carbon_ops.log(x)


def _exp(x: Tensor) -> Tensor:
    return carbon_ops.exp(x)


def _pow_const(x: Tensor, c: float) -> Tensor:
    return carbon_ops.pow_tensor_scalar(x, c)


def _sqrt(x: Tensor) -> Tensor:
    return routes.sqrt_rn(x)


def _pow(x: Tensor, y: Tensor, log_x: Any = None) -> Tensor:
    """x^y = EXP(RN(y·LOG x)), 1 where y = 0 (log_x: LOG x when the caller has it already; same value)."""
    return aten.where(aten.eq(y, 0.0), 1.0, _exp(_mul(y, _log(x) if log_x is None else log_x)))


def _digamma(x32: Tensor) -> Tensor:
    """ψ of float32 values, carbon's correctly rounded float32 digamma, as binary64."""
    return carbon_ops.digamma(x32).double()


def _nan_to_zero(x: Tensor) -> Tensor:
    return aten.where(aten.isnan(x), 0.0, x)


# ---- Gamma ------------------------------------------------------------------------------------------------------

def _gamma_series(x: Tensor, alpha: Tensor, psi_alpha: Tensor) -> Tensor:
    """x < 0.8: −(∂F/∂α)/f from the CDF's Taylor series (six terms); NaN becomes 0."""
    numer, denom = 1.0, alpha
    series1 = _div(1.0, denom)
    series2 = _div(1.0, _mul(denom, denom))
    for i in range(1, 6):
        numer = _mul(numer, _div(aten.neg(x), float(i)))
        denom = _add(denom, 1.0)
        series1 = _add(series1, _div(numer, denom))
        series2 = _add(series2, _div(numer, _mul(denom, denom)))
    log_x = _log(x)
    pow_x_alpha = _pow(x, alpha, log_x)
    pdf = _mul(_pow(x, _sub(alpha, 1.0), log_x), _exp(aten.neg(x)))
    cdf = _mul(pow_x_alpha, series1)
    cdf_alpha = _sub(_mul(_sub(log_x, psi_alpha), cdf), _mul(pow_x_alpha, series2))
    return _nan_to_zero(_div(aten.neg(cdf_alpha), pdf))


def _gamma_saddle_near(x: Tensor, alpha: Tensor) -> Tensor:
    """α > 8 and 0.9α ≤ x ≤ 1.1α: the Rice saddle-point expansion at its centre."""
    aa = _mul(alpha, alpha)
    numer1 = _add(1.0, _mul(_mul(24.0, alpha), _add(1.0, _mul(12.0, alpha))))
    numer2 = _add(_sub(_add(_mul(1440.0, aa), _mul(_mul(6.0, x), _sub(53.0, _mul(120.0, x)))),
                       _div(_mul(_mul(65.0, x), x), alpha)),
                  _mul(alpha, _add(107.0, _mul(3600.0, x))))
    denom = _mul(_mul(1244160.0, aa), aa)
    return _div(_mul(numer1, numer2), denom)


def _gamma_saddle_far(x: Tensor, alpha: Tensor) -> Tensor:
    """α > 8 elsewhere: the Rice saddle-point expansion."""
    denom = _sqrt(_mul(8.0, alpha))
    term2 = _div(denom, _sub(alpha, x))
    log_ratio = _log(_div(x, alpha))
    term3 = _pow_const(_sub(_sub(x, alpha), _mul(alpha, log_ratio)), -1.5)
    term23 = aten.where(aten.lt(x, alpha), _sub(term2, term3), _add(term2, term3))
    gap = _sub(alpha, x)
    term1 = _sub(_mul(log_ratio, term23), _div(_mul(_sqrt(_div(2.0, alpha)), _add(alpha, x)), _mul(gap, gap)))
    stirling = _add(1.0, _mul(_div(1.0, _mul(12.0, alpha)), _add(1.0, _div(1.0, _mul(24.0, alpha)))))
    numer = _mul(x, term1)
    return _div(_mul(aten.neg(stirling), numer), denom)


def _gamma_rational(x: Tensor, alpha: Tensor) -> Tensor:
    """Elsewhere: EXP(p/q), p and q cubics in v = log α whose coefficients are quadratics in u = log(x/α)."""
    u, v = _log(_div(x, alpha)), _log(alpha)
    coef = [_add(c0, _mul(u, _add(c1, _mul(u, c2)))) for c0, c1, c2 in zip(*_GAMMA_UV)]
    p = _add(coef[0], _mul(v, _add(coef[1], _mul(v, _add(coef[2], _mul(v, coef[3]))))))
    q = _add(coef[4], _mul(v, _add(coef[5], _mul(v, _add(coef[6], _mul(v, coef[7]))))))
    return _exp(_div(p, q))


def _gamma_grad64(alpha32: Tensor, x32: Tensor) -> Tensor:
    alpha, x = alpha32.double(), x32.double()
    large = aten.where(aten.logical_and(aten.le(_mul(_F32[0.9], alpha), x), aten.le(x, _mul(_F32[1.1], alpha))),
                       _gamma_saddle_near(x, alpha), _gamma_saddle_far(x, alpha))
    rest = aten.where(aten.gt(alpha, 8.0), large, _gamma_rational(x, alpha))
    return aten.where(aten.lt(x, _F32[0.8]), _gamma_series(x, alpha, _digamma(alpha32)), rest)


# ---- Dirichlet (Beta) ------------------------------------------------------------------------------------------

def _beta_alpha_small(x: Tensor, alpha: Tensor, beta: Tensor, psi_alpha: Tensor, psi_total: Tensor,
                      log_x: Tensor) -> Tensor:
    """x near 0: the series in x (eleven terms); NaN becomes 0."""
    factor = _sub(_sub(psi_alpha, psi_total), log_x)
    numer = 1.0
    series = _mul(_div(numer, alpha), _add(factor, _div(1.0, alpha)))
    for i in range(1, 11):
        numer = _mul(numer, _div(_mul(_sub(float(i), beta), x), float(i)))
        denom = _add(alpha, float(i))
        series = _add(series, _mul(_div(numer, denom), _add(factor, _div(1.0, denom))))
    return _nan_to_zero(_mul(_mul(x, _pow(_sub(1.0, x), aten.neg(beta))), series))


def _beta_beta_small(y: Tensor, alpha: Tensor, beta: Tensor, psi_beta: Tensor, psi_total: Tensor) -> Tensor:
    """The gradient with respect to the second parameter for y near 0 (nine terms); NaN becomes 0. Called with
    y = 1 − x and the parameters swapped."""
    factor = _sub(psi_total, psi_beta)
    numer, betas, dbetas = 1.0, 1.0, 0.0
    series = _div(factor, alpha)
    for i in range(1, 9):
        numer = _mul(numer, _div(aten.neg(y), float(i)))
        dbetas = _add(_mul(dbetas, _sub(beta, float(i))), betas)
        betas = _mul(betas, _sub(beta, float(i)))
        series = _add(series, _mul(_div(numer, _add(alpha, float(i))), _add(dbetas, _mul(factor, betas))))
    return _nan_to_zero(aten.neg(_mul(_pow(_sub(1.0, y), _sub(1.0, beta)), series)))


def _beta_alpha_mid(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """Both parameters above 6: the Rice saddle-point expansion (a polynomial at its centre)."""
    total = _add(alpha, beta)
    mean = _div(alpha, total)
    std = _div(_sqrt(_div(_mul(alpha, beta), _add(total, 1.0))), total)
    bb = _mul(beta, beta)
    one_x = _sub(1.0, x)
    inner = _mul(_mul(8.0, one_x), _sub(_mul(135.0, beta), 11.0))
    inner = _add(_mul(_sub(_add(453.0, _mul(_mul(1620.0, beta), one_x)), _mul(455.0, x)), beta), _mul(alpha, inner))
    inner = _add(_mul(_mul(3.0, _sub(_add(59.0, _mul(180.0, beta)), _mul(90.0, x))), bb), _mul(alpha, inner))
    inner = _add(_mul(_mul(_add(43.0, _mul(_mul(20.0, _add(16.0, _mul(27.0, beta))), x)), bb), beta),
                 _mul(alpha, inner))
    poly = _add(_mul(_mul(_mul(47.0, x), bb), bb), _mul(alpha, inner))
    prefactor_num = _div(_mul(_add(1.0, _mul(12.0, alpha)), _add(1.0, _mul(12.0, beta))), _mul(total, total))
    prefactor_den = _mul(_mul(_mul(_mul(_mul(_mul(12960.0, alpha), alpha), alpha), beta), beta),
                         _add(1.0, _mul(12.0, total)))
    near = _div(_mul(_div(prefactor_num, one_x), poly), prefactor_den)

    prefactor = _div(aten.neg(x), _sqrt(_div(_mul(_mul(2.0, alpha), beta), total)))

    def stirling_factor(t: Tensor) -> Tensor:
        return _add(_add(1.0, _div(1.0, _mul(12.0, t))), _div(1.0, _mul(_mul(288.0, t), t)))
    stirling = _div(_mul(stirling_factor(alpha), stirling_factor(beta)), stirling_factor(total))
    x_1 = _sub(x, 1.0)
    term1_num = _sub(_add(_mul(_mul(2.0, _mul(alpha, alpha)), x_1), _mul(_mul(alpha, beta), x_1)), _mul(x, bb))
    axbx = _add(_mul(alpha, x_1), _mul(beta, x))
    term1_den = _mul(_mul(_mul(_sqrt(_div(_mul(2.0, alpha), beta)), _pow_const(total, 1.5)), axbx), axbx)
    term1 = _div(term1_num, term1_den)
    log_a = _log(_div(alpha, _mul(total, x)))
    term2 = _mul(0.5, log_a)
    term3 = _div(_sqrt(_div(_mul(_mul(8.0, alpha), beta), total)), _add(_mul(beta, x), _mul(alpha, x_1)))
    term4_base = _add(_mul(beta, _log(_div(beta, _mul(total, one_x)))), _mul(alpha, log_a))
    term4 = _pow_const(term4_base, -1.5)
    term1234 = _add(term1, _mul(term2, _add(term3, aten.where(aten.lt(x, mean), term4, aten.neg(term4)))))
    far = _mul(_mul(stirling, prefactor), term1234)
    centre = aten.logical_and(aten.le(_sub(mean, _mul(0.1, std)), x), aten.le(x, _add(mean, _mul(0.1, std))))
    return aten.where(centre, near, far)


def _dirichlet_rational(x: Tensor, alpha: Tensor, total: Tensor, beta: Tensor, psi_alpha: Tensor,
                        psi_total: Tensor, log_x: Tensor) -> Tensor:
    """Elsewhere: a rational correction p/q (polynomials in u = log x, a = log α − u, b = log total − a) of
    x·(ψ(total) − ψ(α))/β."""
    u = log_x
    a = _sub(_log(alpha), u)
    b = _sub(_log(total), a)
    pow_u, pow_a = (1.0, u, _mul(u, u)), (1.0, a, _mul(a, a))
    p = q = 0.0
    for i in range(3):
        for j in range(3):
            ua = _mul(pow_u[i], pow_a[j])
            sums = []
            for c in (_DIRICHLET_C[0][i][j], _DIRICHLET_C[1][i][j]):
                sums.append(_mul(ua, _add(c[0], _mul(b, _add(c[1], _mul(b, _add(c[2], _mul(b, c[3]))))))))
            p, q = _add(p, sums[0]), _add(q, sums[1])
    approx = _div(_mul(x, _sub(psi_total, psi_alpha)), beta)
    return _mul(_div(p, q), approx)


def _dirichlet_grad64(x32: Tensor, alpha32: Tensor, total32: Tensor) -> Tensor:
    x, alpha, total = x32.double(), alpha32.double(), total32.double()
    psi_alpha, psi_total = _digamma(alpha32), _digamma(total32)
    beta = _sub(total, alpha)
    boundary = _mul(_mul(total, x), _sub(1.0, x))
    log_x = _log(x)  # shared by two branches (the same value either way)
    small_x = _beta_alpha_small(x, alpha, beta, psi_alpha, psi_total, log_x)
    large_x = aten.neg(_beta_beta_small(_sub(1.0, x), beta, alpha, psi_alpha, psi_total))
    mid = _beta_alpha_mid(x, alpha, beta)
    rational = _dirichlet_rational(x, alpha, total, beta, psi_alpha, psi_total, log_x)
    result = aten.where(aten.logical_and(aten.gt(alpha, 6.0), aten.gt(beta, 6.0)), mid, rational)
    result = aten.where(aten.logical_and(aten.ge(x, 0.5), aten.lt(boundary, 0.75)), large_x, result)
    return aten.where(aten.logical_and(aten.le(x, 0.5), aten.lt(boundary, 2.5)), small_x, result)


# ---- routes -----------------------------------------------------------------------------------------------------

def _round(x64: Tensor, dtype: torch.dtype) -> Tensor:
    """binary64 → float32 (one rounding), then carbon's rounding to bfloat16 / float16."""
    x32 = x64.to(torch.float32)
    return x32 if dtype == torch.float32 else carbon_ops.round_to(x32, dtype, 1)


def _check(op: str, *tensors: Tensor) -> bool:
    """False for arguments torch refuses itself (PASS); float64 and other dtypes raise NotCovered."""
    first = tensors[0]
    if any(not t.is_floating_point() or t.dtype != first.dtype or t.device != first.device for t in tensors):
        return False
    routes._need_carbon_dtype(op, *tensors)
    return True


def standard_gamma_grad(args: dict) -> Any:
    """aten._standard_gamma_grad(self=α, output=x): dx/dα for samples x of Gamma(α, 1)."""
    alpha, x = args["self"], args["output"]
    if not _check("_standard_gamma_grad", alpha, x) or alpha.shape != x.shape:
        return routes.PASS
    return _round(_gamma_grad64(alpha.float(), x.float()), alpha.dtype)


def dirichlet_grad(args: dict) -> Any:
    """aten._dirichlet_grad(x, alpha, total): torch's scaled Beta gradient, elementwise."""
    x, alpha, total = args["x"], args["alpha"], args["total"]
    if not _check("_dirichlet_grad", x, alpha, total) or not (x.shape == alpha.shape == total.shape):
        return routes.PASS
    return _round(_dirichlet_grad64(x.float(), alpha.float(), total.float()), x.dtype)
