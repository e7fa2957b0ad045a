"""``carbon.nn.convert(model)``: make an existing torch.nn model run Carbon's
bit-exact modules, in place.

Every submodule whose type is *exactly* one of the supported torch.nn classes
becomes its carbon twin:

    torch.nn.Linear    -> carbon.nn.Linear       torch.nn.Embedding -> carbon.nn.Embedding
    torch.nn.LayerNorm -> carbon.nn.LayerNorm    torch.nn.Dropout   -> carbon.nn.Dropout
    torch.nn.RMSNorm   -> carbon.nn.RMSNorm      torch.nn.GELU      -> carbon.nn.GELU
                                                 torch.nn.SiLU      -> carbon.nn.SiLU

Each twin is a subclass of the torch class that only replaces ``forward``, so
the conversion keeps the module *object* and changes its class: parameters
(the same Parameter objects, so an optimizer built before keeps working),
buffers, hooks, training mode, attributes and every other reference to the
module stay as they were, and a module that appears in several places is
converted once. Subclasses of the supported classes (their forward may
differ) and every other module are left alone; so is anything computed in a
module's own ``forward`` with torch functions (use ``carbon.enable`` for
those).
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import torch

from carbon.nn.activation import GELU, SiLU
from carbon.nn.dropout import Dropout
from carbon.nn.linear import Linear
from carbon.nn.normalization import LayerNorm, RMSNorm
from carbon.nn.sparse import Embedding
from carbon.random import Generator

__all__ = ["convert", "SUPPORTED"]

SUPPORTED: Dict[Type[torch.nn.Module], Type[torch.nn.Module]] = {
    torch.nn.Linear: Linear,
    torch.nn.LayerNorm: LayerNorm,
    torch.nn.RMSNorm: RMSNorm,
    torch.nn.Embedding: Embedding,
    torch.nn.Dropout: Dropout,
    torch.nn.GELU: GELU,
    torch.nn.SiLU: SiLU,
}


def _check(name: str, module: torch.nn.Module) -> None:
    """Refuse configurations the twin does not support, naming the module."""
    where = f"carbon.nn.convert: module {name or '<root>'!r} ({type(module).__name__})"
    if isinstance(module, torch.nn.Embedding):
        for option, bad in (("max_norm", module.max_norm is not None), ("sparse", module.sparse),
                            ("scale_grad_by_freq", module.scale_grad_by_freq)):
            if bad:
                raise ValueError(f"{where}: {option} is not supported by carbon.nn.Embedding; "
                                 "turn it off or leave this module out of the conversion")
    if isinstance(module, torch.nn.GELU) and module.approximate not in ("none", "tanh"):
        raise ValueError(f"{where}: approximate={module.approximate!r} is not supported")


def convert(model: torch.nn.Module, *, generator: Optional[Generator] = None) -> torch.nn.Module:
    """Convert ``model`` and all its submodules in place (see the module
    docstring) and return ``model``. ``generator`` (a carbon.Generator;
    default: carbon.default_generator) is the one that converted Dropout
    modules draw from.

    Raises TypeError if ``model`` is not a torch.nn.Module, and ValueError,
    before changing anything, if a supported module uses an option its twin
    does not support (e.g. Embedding(max_norm=...))."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"carbon.nn.convert expects a torch.nn.Module, got {type(model).__name__}")
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"carbon.nn.convert: generator must be a carbon.Generator, got {type(generator).__name__}")
    todo = []
    for name, module in model.named_modules(remove_duplicate=True):
        twin = SUPPORTED.get(type(module))
        if twin is not None:
            _check(name, module)
            todo.append((module, twin))
    for module, twin in todo:  # all checked: now change them
        module.__class__ = twin
        if twin is Dropout:
            module.generator = generator
    return model
