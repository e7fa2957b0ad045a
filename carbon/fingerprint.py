"""``carbon.fingerprint``: a SHA-256 over the bits of a model's (and an
optimizer's) tensors, the same for the same bits on every device, in every
process, for every memory layout.

The byte format (version 1) is specified in docs/fingerprint.md; in short,
for every entry in ascending order of the UTF-8 bytes of its name::

    entry  = u32(len(name)) name  record
    record = u32(len(dtype)) dtype  u32(ndim)  u64(size_0) ... u64(size_{ndim-1})  u64(nbytes)  data

where u32/u64 are little-endian unsigned integers, ``dtype`` is torch's name
without the ``torch.`` prefix (``float32``, ``bfloat16``, ``int64``, ...) and
``data`` the raw little-endian bytes of the tensor's elements in row-major
(C-contiguous) order. The overall digest is SHA-256(``carbon.fingerprint/1\\n``
entry entry ...); the per-tensor digest of a name is SHA-256(record), so it
does not depend on the name.
"""

from __future__ import annotations

import hashlib
import numbers
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Tuple

import torch
from torch import Tensor

__all__ = ["Fingerprint", "fingerprint", "tensor_record", "FORMAT_HEADER"]

FORMAT_HEADER = b"carbon.fingerprint/1\n"
OPTIMIZER_PREFIX = "optimizer.state."


@dataclass(frozen=True)
class Fingerprint:
    """The result of :func:`fingerprint`.

    ``hexdigest``: SHA-256 (64 hex digits) over every entry;
    ``tensors``: name -> SHA-256 hex digest of that tensor's record (dtype,
    shape and bytes; not the name), in the order the entries are hashed.
    ``str()`` gives the first 16 hex digits. Two fingerprints compare equal
    iff their overall digests are equal."""

    hexdigest: str
    tensors: Dict[str, str] = field(compare=False)

    @property
    def short(self) -> str:
        """The first 16 hex digits of :attr:`hexdigest`."""
        return self.hexdigest[:16]

    def diff(self, other: "Fingerprint") -> List[str]:
        """Sorted names whose per-tensor digests differ between ``self`` and
        ``other`` (including names present in only one of them)."""
        names = set(self.tensors) | set(other.tensors)
        return sorted(n for n in names if self.tensors.get(n) != other.tensors.get(n))

    def __str__(self) -> str:
        return self.short

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fingerprint):
            return NotImplemented
        return self.hexdigest == other.hexdigest

    def __hash__(self) -> int:
        return hash(self.hexdigest)


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _tensor_bytes(name: str, t: Tensor) -> bytes:
    """The row-major little-endian bytes of ``t``'s elements (a CPU copy)."""
    if t.layout != torch.strided:
        raise TypeError(f"carbon.fingerprint: {name!r} has layout {t.layout}; only dense (strided) tensors are supported")
    if t.is_quantized:
        raise TypeError(f"carbon.fingerprint: {name!r} is a quantized tensor; not supported")
    if t.device.type == "meta":
        raise ValueError(f"carbon.fingerprint: {name!r} is on the meta device and has no values")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    flat = t.cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    if flat.dtype == torch.bool:  # one byte per element, 0 or 1
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8).numpy()
    if sys.byteorder != "little" and flat.element_size() > 1:  # pragma: no cover (no big-endian torch build)
        raw = flat.numpy().byteswap().view("u1")
    return raw.tobytes()


def tensor_record(t: Tensor, name: str = "tensor") -> bytes:
    """The record of one tensor: ``u32(len(dtype)) dtype u32(ndim) u64(size)...
    u64(nbytes) data`` (docs/fingerprint.md). ``name`` is used in errors only."""
    if not isinstance(t, Tensor):
        raise TypeError(f"carbon.fingerprint: {name!r} is a {type(t).__name__}, not a tensor")
    dtype = str(t.dtype).removeprefix("torch.").encode("utf-8")
    data = _tensor_bytes(name, t)
    header = _u32(len(dtype)) + dtype + _u32(t.dim()) + b"".join(_u64(s) for s in t.shape) + _u64(len(data))
    return header + data


def _as_tensor(name: str, value: Any) -> Tensor:
    """Optimizer state values: tensors as they are; Python bools, ints and
    floats as 0-dim bool / int64 / float64 tensors."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, bool):
        return torch.tensor(value, dtype=torch.bool)
    if isinstance(value, numbers.Integral):
        return torch.tensor(int(value), dtype=torch.int64)
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value), dtype=torch.float64)
    raise TypeError(f"carbon.fingerprint: optimizer state {name!r} is a {type(value).__name__}; "
                    "expected a tensor, bool, int or float")


def _model_entries(model: Any) -> List[Tuple[str, Tensor]]:
    if isinstance(model, torch.nn.Module):
        state = model.state_dict()
    elif isinstance(model, Mapping):
        state = model
    else:
        raise TypeError(f"carbon.fingerprint: model must be a torch.nn.Module or a state_dict mapping, "
                        f"got {type(model).__name__}")
    entries = []
    for name, value in state.items():
        if not isinstance(name, str):
            raise TypeError(f"carbon.fingerprint: state_dict key {name!r} is not a string")
        if not isinstance(value, Tensor):
            raise TypeError(f"carbon.fingerprint: state_dict entry {name!r} is a {type(value).__name__}, not a "
                            "tensor (extra state is not supported)")
        entries.append((name, value))
    return entries


def _optimizer_entries(optimizer: Any) -> List[Tuple[str, Tensor]]:
    if isinstance(optimizer, torch.optim.Optimizer):
        state_dict = optimizer.state_dict()
    elif isinstance(optimizer, Mapping) and "state" in optimizer:
        state_dict = optimizer
    else:
        raise TypeError(f"carbon.fingerprint: optimizer must be a torch.optim.Optimizer or its state_dict, "
                        f"got {type(optimizer).__name__}")
    entries = []
    for index, per_param in state_dict["state"].items():
        if not isinstance(per_param, Mapping):
            raise TypeError(f"carbon.fingerprint: optimizer state {index!r} is not a mapping")
        for key, value in per_param.items():
            name = f"{OPTIMIZER_PREFIX}{index}.{key}"
            entries.append((name, _as_tensor(name, value)))
    return entries


def _sorted_entries(entries: Iterable[Tuple[str, Tensor]]) -> List[Tuple[str, Tensor]]:
    result: Dict[str, Tensor] = {}
    for name, value in entries:
        if name in result:
            raise ValueError(f"carbon.fingerprint: two entries are named {name!r} (a model entry named like the "
                             f"optimizer's '{OPTIMIZER_PREFIX}*'?)")
        result[name] = value
    return sorted(result.items(), key=lambda kv: kv[0].encode("utf-8"))


def fingerprint(model: Any, optimizer: Any = None) -> Fingerprint:
    """SHA-256 over every tensor of ``model.state_dict()`` (parameters and
    buffers) and, when ``optimizer`` is given, over its per-parameter state
    (``optimizer.state_dict()["state"]``: exp_avg, exp_avg_sq, step, ...,
    named ``optimizer.state.<index>.<key>``; hyperparameters are not
    included).

    ``model`` may also be a state_dict (a mapping name -> tensor) and
    ``optimizer`` an optimizer state_dict. The digest depends only on the
    names, dtypes, shapes and element bits: not on the device, the memory
    layout (strides, views, offsets), the process or the order of
    registration. -0.0 and +0.0, and NaNs with different payloads, give
    different digests. The byte format is documented in docs/fingerprint.md."""
    entries = _model_entries(model)
    if optimizer is not None:
        entries += _optimizer_entries(optimizer)
    overall = hashlib.sha256(FORMAT_HEADER)
    per_tensor: Dict[str, str] = {}
    for name, value in _sorted_entries(entries):
        record = tensor_record(value, name)
        encoded = name.encode("utf-8")
        overall.update(_u32(len(encoded)) + encoded + record)
        per_tensor[name] = hashlib.sha256(record).hexdigest()
    return Fingerprint(overall.hexdigest(), per_tensor)
