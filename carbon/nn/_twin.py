"""How a carbon.nn module is made from its torch.nn original without copying."""

from __future__ import annotations

from typing import Iterable, Type, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)


def shared_twin(cls: Type[M], module: torch.nn.Module, torch_cls: type, attributes: Iterable[str],
                parameters: Iterable[str]) -> M:
    """A ``cls`` object (its ``__init__`` not run) with ``module``'s attributes,
    the *same* Parameter objects (no copy, so an optimizer built on them keeps
    working) and ``module``'s training mode."""
    if not isinstance(module, torch_cls):
        raise TypeError(f"{cls.__name__}.from_torch expects a torch.nn.{torch_cls.__name__}, "
                        f"got {type(module).__name__}")
    twin = cls.__new__(cls)
    torch.nn.Module.__init__(twin)
    for name in attributes:
        setattr(twin, name, getattr(module, name))
    for name in parameters:
        twin.register_parameter(name, getattr(module, name))
    twin.train(module.training)
    return twin
