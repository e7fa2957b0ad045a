"""Drop-in twins of torch.nn modules whose forward and backward run Carbon's
correctly rounded ops. Constructors and state_dicts match torch.nn's.
``convert(model)`` turns the supported modules of an existing model into
their twins in place; ``CausalSelfAttention`` is a GPT-style attention block."""

from carbon.nn import init
from carbon.nn.activation import GELU, SiLU
from carbon.nn.dropout import Dropout
from carbon.nn.linear import Linear
from carbon.nn.normalization import LayerNorm, RMSNorm
from carbon.nn.sparse import Embedding
from carbon.nn.attention import CausalSelfAttention
from carbon.nn.convert import convert
from carbon.nn import utils

__all__ = ["Linear", "LayerNorm", "RMSNorm", "GELU", "SiLU", "Dropout", "Embedding", "CausalSelfAttention",
           "convert", "init", "utils"]
