"""Carbon: bit-exact deep learning for PyTorch.

Every op returns the correctly rounded exact result (round to nearest, ties to
even) in its output dtype, so its bits depend only on its inputs: the same on
any CPU and any CUDA GPU, at any batch size, thread count and memory layout.
docs/contract.md states each op's definition.
"""

import torch  # noqa: F401  (must load before the extension: it links libtorch)

from carbon import _C  # noqa: F401  (loads the kernels and registers torch.ops.carbon.*)
from carbon import _autograd, _fake  # noqa: F401  (registrations)
from carbon import random
from carbon.random import Generator, bernoulli, default_generator, manual_seed, rand, randn
from carbon.dropout import dropout
from carbon import nn, optim
from carbon.checkpoint import load, save
from carbon.fingerprint import Fingerprint, fingerprint
from carbon.elementwise import (acos, acosh, asin, asinh, atan, atan2, atanh, cos, cosh, erf, erfc, erfinv, exp, exp2, expm1,
                                gelu, hypot, lgamma, digamma, trigamma, polygamma, log, log1p, log2, log10, log_sigmoid, sigmoid, silu, sin, sinh, softplus,
                                sqrt, tan, tanh)
from carbon.norm import layer_norm, rms_norm
from carbon.ops import addmm, baddbmm, bmm, linear, matmul, mm
from carbon.attention import scaled_dot_product_attention
from carbon.reductions import mean, round_to, sum  # noqa: A004
from carbon.scatter import embedding, index_add, index_add_, index_put, index_put_, scatter_add, scatter_add_
from carbon.softmax import cross_entropy, log_softmax, softmax
from carbon._enable import NotExactError, disable, enable, enabled, is_enabled
from carbon import data, distributed
from carbon.distributed import allreduce_hook
from carbon.tracing import trace
from carbon import diff

__all__ = [
    "mm", "addmm", "bmm", "baddbmm", "linear", "matmul",
    "sum", "mean", "round_to",
    "exp", "log", "tanh", "sigmoid", "erf", "gelu", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid", "expm1",
    "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh", "acosh", "atanh",
    "lgamma", "digamma", "trigamma", "polygamma", "atan2", "hypot", "sqrt",
    "layer_norm", "rms_norm",
    "softmax", "log_softmax", "cross_entropy",
    "scaled_dot_product_attention",
    "index_add", "scatter_add", "index_put", "index_add_", "scatter_add_", "index_put_", "embedding",
    "nn",
    "random", "Generator", "default_generator", "manual_seed", "rand", "randn", "bernoulli", "dropout",
    "optim", "save", "load", "fingerprint", "Fingerprint",
    "enable", "disable", "enabled", "is_enabled", "NotExactError",
    "data", "distributed", "allreduce_hook",
    "trace", "diff",
]
__version__ = "0.1.0"
