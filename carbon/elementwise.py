"""Carbon's elementwise math: exp, log, tanh, sigmoid, erf, gelu, silu, sin, cos, log1p,
softplus, log_sigmoid, expm1, log2, log10, exp2, erfc, sinh, cosh, tan, atan, asin, acos,
erfinv, asinh, acosh, atanh, lgamma, digamma, trigamma (polygamma).

Each returns, elementwise and in the input's dtype (float32, bfloat16 or
float16), ONE rounding (to nearest, ties to even) of an fp64 evaluation of
the function whose relative error is below 2^-40: so the result is the
correctly rounded value except within ~2^-16 ulp of a rounding midpoint, is
always within 0.5 + 2^-16 ulp, and is bit-identical on every CPU and CUDA GPU
(one shared implementation from IEEE +, -, *, /, sqrt, fma; no libm). Gradients
are RN(grad * f'(x)) with f' evaluated the same way. docs/contract.md §6 and
docs/elementwise.md give the definitions and the measured accuracy.

exp, log, sin and cos also take float64 tensors: a double-double evaluation
(relative error < 2^-98) rounded once, so correctly rounded except within
2^-45 ulp of a midpoint, the same bits everywhere (contract §6, "float64").
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["exp", "log", "tanh", "sigmoid", "erf", "gelu", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid", "expm1",
           "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh", "acosh",
           "atanh", "lgamma", "digamma", "trigamma", "polygamma", "atan2", "hypot", "sqrt"]


def exp(x: Tensor) -> Tensor:
    """e^x, elementwise. exp(-inf) = 0, overflow gives inf. Also float64."""
    return torch.ops.carbon.exp(x)


def log(x: Tensor) -> Tensor:
    """Natural logarithm, elementwise. log(+-0) = -inf, log(x < 0) = NaN.
    Also float64."""
    return torch.ops.carbon.log(x)


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent, elementwise (odd: keeps the sign of zero)."""
    return torch.ops.carbon.tanh(x)


def sigmoid(x: Tensor) -> Tensor:
    """Logistic function 1 / (1 + e^-x), elementwise, accurate also where it
    underflows (large negative x)."""
    return torch.ops.carbon.sigmoid(x)


def erf(x: Tensor) -> Tensor:
    """Error function, elementwise (odd; saturates to +-1)."""
    return torch.ops.carbon.erf(x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU, ``torch.nn.functional.gelu`` semantics: x * Phi(x) for
    ``approximate="none"``, and x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    for ``approximate="tanh"``; each correctly rounded as a function of x
    (no cancellation for negative x). gelu(-inf) = -0."""
    return torch.ops.carbon.gelu(x, approximate)


def silu(x: Tensor) -> Tensor:
    """SiLU (swish) x * sigmoid(x), elementwise. silu(-inf) = -0."""
    return torch.ops.carbon.silu(x)


def sin(x: Tensor) -> Tensor:
    """Sine, elementwise (odd: keeps the sign of zero; NaN at +-inf). The
    argument is reduced modulo pi/2 exactly (with 128 bits of 2/pi), so the
    result is as accurate for x = 1e30 as for x = 1 (torch's float32 sin is
    not, and differs between CPU and GPU). Also float64 (reduced with 1280
    bits of 2/pi, exact up to 1.8e308)."""
    return torch.ops.carbon.sin(x)


def cos(x: Tensor) -> Tensor:
    """Cosine, elementwise (even; NaN at +-inf), with sin's exact argument
    reduction. Also float64."""
    return torch.ops.carbon.cos(x)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), elementwise, accurate for small x (keeps the sign of zero;
    -inf at -1, NaN below)."""
    return torch.ops.carbon.log1p(x)


def expm1(x: Tensor) -> Tensor:
    """e^x - 1, elementwise, accurate for small x (keeps the sign of zero; -1 at
    -inf)."""
    return torch.ops.carbon.expm1(x)


def log2(x: Tensor) -> Tensor:
    """Base-2 logarithm, elementwise. log2(+-0) = -inf, log2(x < 0) = NaN;
    exact integers at powers of two."""
    return torch.ops.carbon.log2(x)


def log10(x: Tensor) -> Tensor:
    """Base-10 logarithm, elementwise. log10(+-0) = -inf, log10(x < 0) = NaN."""
    return torch.ops.carbon.log10(x)


def exp2(x: Tensor) -> Tensor:
    """2^x, elementwise (exact at integers). exp2(-inf) = 0, overflow gives
    inf."""
    return torch.ops.carbon.exp2(x)


def erfc(x: Tensor) -> Tensor:
    """Complementary error function 1 - erf(x), elementwise, without
    cancellation for large x (accurate down to its underflow near x = 10)."""
    return torch.ops.carbon.erfc(x)


def sinh(x: Tensor) -> Tensor:
    """Hyperbolic sine, elementwise (odd: keeps the sign of zero)."""
    return torch.ops.carbon.sinh(x)


def cosh(x: Tensor) -> Tensor:
    """Hyperbolic cosine, elementwise (even; cosh(+-inf) = inf)."""
    return torch.ops.carbon.cosh(x)


def tan(x: Tensor) -> Tensor:
    """Tangent, elementwise (odd; NaN at +-inf), with sin's exact argument
    reduction: as accurate next to odd multiples of pi/2 and for x = 1e30 as
    for x = 1."""
    return torch.ops.carbon.tan(x)


def atan(x: Tensor) -> Tensor:
    """Arctangent, elementwise (odd; +-pi/2 at +-inf)."""
    return torch.ops.carbon.atan(x)


def asin(x: Tensor) -> Tensor:
    """Arcsine, elementwise (odd; NaN for |x| > 1)."""
    return torch.ops.carbon.asin(x)


def acos(x: Tensor) -> Tensor:
    """Arccosine, elementwise (acos(1) = 0, acos(-1) = pi; NaN for |x| > 1)."""
    return torch.ops.carbon.acos(x)


def erfinv(x: Tensor) -> Tensor:
    """Inverse error function, elementwise (odd; erfinv(+-1) = +-inf, NaN for
    |x| > 1), accurate up to the float next to +-1 (``torch.nn.init.trunc_normal_``
    and other initializers map uniform draws through it)."""
    return torch.ops.carbon.erfinv(x)


def asinh(x: Tensor) -> Tensor:
    """Inverse hyperbolic sine, elementwise (odd: keeps the sign of zero;
    +-inf at +-inf), without cancellation for small or negative x."""
    return torch.ops.carbon.asinh(x)


def acosh(x: Tensor) -> Tensor:
    """Inverse hyperbolic cosine, elementwise (acosh(1) = 0, accurate next to
    1; NaN for x < 1)."""
    return torch.ops.carbon.acosh(x)


def atanh(x: Tensor) -> Tensor:
    """Inverse hyperbolic tangent, elementwise (odd; atanh(+-1) = +-inf, NaN
    for |x| > 1)."""
    return torch.ops.carbon.atanh(x)


def softplus(x: Tensor) -> Tensor:
    """log(1 + e^x), elementwise, for every x (no threshold: for large x the
    result rounds to x by itself). ``torch.nn.functional.softplus`` with
    beta=1 under ``carbon.enable`` adds torch's threshold (x above it is
    returned as it is)."""
    return torch.ops.carbon.softplus(x)


def log_sigmoid(x: Tensor) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x), elementwise, without cancellation
    (the loss of DPO and of pairwise reward models)."""
    return torch.ops.carbon.log_sigmoid(x)


def lgamma(x: Tensor) -> Tensor:
    """log|Gamma(x)|, elementwise (+inf at +-inf, at +-0 and at the negative
    integers; lgamma(1) = lgamma(2) = +0), accurate next to its zeros (1, 2 and
    two between each pair of negative integers below -2). Its gradient is
    RN(grad * digamma(x))."""
    return torch.ops.carbon.lgamma(x)


def digamma(x: Tensor) -> Tensor:
    """psi(x) = Gamma'(x) / Gamma(x), elementwise (-inf at +0, +inf at -0 and
    +inf, NaN at -inf and the negative integers), accurate next to its zeros.
    Its gradient is RN(grad * trigamma(x))."""
    return torch.ops.carbon.digamma(x)


def trigamma(x: Tensor) -> Tensor:
    """psi'(x) (torch's polygamma(1, x)), elementwise (+inf at +-0 and at the
    negative integers, +0 at +inf, NaN at -inf). Its gradient is
    RN(grad * psi''(x))."""
    return torch.ops.carbon.trigamma(x)


def polygamma(n: int, x: Tensor) -> Tensor:
    """torch.polygamma for n = 0 (digamma) and n = 1 (trigamma)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    raise ValueError(f"carbon.polygamma: n must be 0 or 1, got {n}")


def atan2(y: Tensor, x: Tensor) -> Tensor:
    """The angle of the point (x, y), elementwise, as C's atan2 (signed zeros and
    infinities give 0, +-pi/4, +-pi/2, +-3pi/4, +-pi with y's sign), correctly rounded
    from a binary64 evaluation. y and x broadcast; they must have one dtype."""
    y, x = torch.broadcast_tensors(y, x)
    return torch.ops.carbon.atan2(y, x)


def hypot(x: Tensor, y: Tensor) -> Tensor:
    """sqrt(x^2 + y^2), elementwise, without overflow, correctly rounded from the
    exact squares (+inf if either is infinite, even with a NaN). x and y
    broadcast; they must have one dtype."""
    x, y = torch.broadcast_tensors(x, y)
    return torch.ops.carbon.hypot(x, y)


def sqrt(x: Tensor) -> Tensor:
    """Square root, elementwise, correctly rounded in x's dtype (float32, bfloat16, float16 or float64): IEEE's
    binary64 root rounded once (sqrt(-0) = -0; negative x and NaN give NaN). Gradient: torch's formula
    grad / (2 * sqrt(x)), 2 * sqrt(x) exact and one IEEE division."""
    return torch.ops.carbon.sqrt(x)
