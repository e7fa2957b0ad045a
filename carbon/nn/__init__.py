"""Drop-in twins of torch.nn modules whose forward and backward run Carbon's
correctly rounded ops. Constructors and state_dicts match torch.nn's."""

from carbon.nn.activation import GELU, SiLU
from carbon.nn.linear import Linear
from carbon.nn.normalization import LayerNorm, RMSNorm
from carbon.nn import utils

__all__ = ["Linear", "LayerNorm", "RMSNorm", "GELU", "SiLU", "utils"]
