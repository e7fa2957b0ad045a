"""carbon.save / carbon.load: checkpoints for bit-exact resume.

A checkpoint is a torch.save'd dict of state_dicts: the model's, the
optimizer's (torch's format; carbon.optim keeps its float32 states) and the
generator's state (any object with get_state() / set_state(tensor):
torch.Generator, carbon.Generator). Training k steps, saving, loading in
another process and training on gives the same bits as training straight
through, because every carbon op and optimizer step is a function of the
values alone (docs/contract.md §12)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

__all__ = ["save", "load"]

FORMAT = "carbon.checkpoint/1"


def save(path, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
         generator: Any = None, **extra: Any) -> None:
    """Save the states of model / optimizer / generator and ``extra`` (values
    that torch.load(weights_only=True) accepts: tensors, numbers, strings,
    lists, dicts) to ``path``. ``generator`` is one generator or a list of
    them (e.g. ``[carbon.default_generator, dropout_generator]`` when a model
    draws from several streams); :func:`load` takes the same list."""
    checkpoint: Dict[str, Any] = {"format": FORMAT, "extra": extra}
    if model is not None:
        checkpoint["model"] = model.state_dict()
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    if isinstance(generator, (list, tuple)):
        checkpoint["generators"] = [_generator_state(g) for g in generator]
    elif generator is not None:
        checkpoint["generator"] = _generator_state(generator)
    torch.save(checkpoint, path)


def _generator_state(generator: Any) -> torch.Tensor:
    if not hasattr(generator, "get_state"):
        raise TypeError(f"carbon.save: generator must have get_state() (torch.Generator, carbon.Generator), "
                        f"got {type(generator).__name__}")
    return generator.get_state()


def _set_generator_state(generator: Any, state: torch.Tensor) -> None:
    if isinstance(generator, torch.Generator):
        state = state.cpu()  # every torch.Generator, a CUDA one too, takes a CPU ByteTensor
    generator.set_state(state)


def load(path, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
         generator: Any = None, map_location=None) -> Dict[str, Any]:
    """Restore what ``save`` wrote into the given objects; returns the extras.
    ``generator`` is one generator or a list of as many as were saved, in the
    same order."""
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"carbon.load: {path} is not a carbon checkpoint ({FORMAT})")
    several = isinstance(generator, (list, tuple))
    for name, obj in (("model", model), ("optimizer", optimizer), ("generators" if several else "generator", generator)):
        if obj is not None and name not in checkpoint:
            saved = " (it has a list of generators)" if name == "generator" and "generators" in checkpoint else ""
            raise ValueError(f"carbon.load: the checkpoint has no {name} state{saved}")
    if several and len(generator) != len(checkpoint["generators"]):
        raise ValueError(f"carbon.load: the checkpoint has {len(checkpoint['generators'])} generator states, "
                         f"got {len(generator)} generators")
    if model is not None:
        model.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if several:
        for g, state in zip(generator, checkpoint["generators"]):
            _set_generator_state(g, state)
    elif generator is not None:
        _set_generator_state(generator, checkpoint["generator"])
    return checkpoint.get("extra", {})
