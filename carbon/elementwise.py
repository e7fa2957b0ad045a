"""Carbon's elementwise math: exp, log, tanh, sigmoid, erf, gelu, silu, sin, cos, log1p,
softplus, log_sigmoid, expm1.

Each returns, elementwise and in the input's dtype (float32, bfloat16 or
float16), ONE rounding (to nearest, ties to even) of an fp64 evaluation of
the function whose relative error is below 2^-40: so the result is the
correctly rounded value except within ~2^-16 ulp of a rounding midpoint, is
always within 0.5 + 2^-16 ulp, and is bit-identical on every CPU and CUDA GPU
(one shared implementation from IEEE +, -, *, /, fma; no libm). Gradients
are RN(grad * f'(x)) with f' evaluated the same way. docs/contract.md §6 and
docs/elementwise.md give the definitions and the measured accuracy.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["exp", "log", "tanh", "sigmoid", "erf", "gelu", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid", "expm1"]


def exp(x: Tensor) -> Tensor:
    """e^x, elementwise. exp(-inf) = 0, overflow gives inf."""
    return torch.ops.carbon.exp(x)


def log(x: Tensor) -> Tensor:
    """Natural logarithm, elementwise. log(+-0) = -inf, log(x < 0) = NaN."""
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
    not, and differs between CPU and GPU)."""
    return torch.ops.carbon.sin(x)


def cos(x: Tensor) -> Tensor:
    """Cosine, elementwise (even; NaN at +-inf), with sin's exact argument
    reduction."""
    return torch.ops.carbon.cos(x)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), elementwise, accurate for small x (keeps the sign of zero;
    -inf at -1, NaN below)."""
    return torch.ops.carbon.log1p(x)


def expm1(x: Tensor) -> Tensor:
    """e^x - 1, elementwise, accurate for small x (keeps the sign of zero; -1 at
    -inf)."""
    return torch.ops.carbon.expm1(x)


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
