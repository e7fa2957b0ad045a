"""Drop-in twins of torch.nn modules whose forward and backward run Carbon's
correctly rounded ops. Constructors and state_dicts match torch.nn's."""

from carbon.nn.activation import GELU, SiLU
from carbon.nn.linear import Linear

__all__ = ["Linear", "GELU", "SiLU"]
