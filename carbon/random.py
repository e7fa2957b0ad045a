"""Carbon's random numbers: a counter-based generator (Philox4x32-10) whose
draws are the same bits on every CPU and CUDA GPU, at any thread count and
launch configuration (docs/contract.md §10).

A :class:`Generator`'s state (seed, offset) is a tensor, int64 [seed, offset],
on the generator's device. Each draw hands the ops a copy of it (the draw's
state) and adds one to the offset in place: tensor operations only, so no draw
reads the state on the host. Under torch.compile the state is a graph input
(no constants to recompile for); in a captured CUDA graph a generator on the
GPU advances on the device at every replay. Element i of a draw is a function
of (seed, offset, i) only, so a draw of n values is a prefix of a draw of 2n
values at the same state, and the same on every device.
"""

from __future__ import annotations

import struct
import time
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    "rand", "randn", "bernoulli", "uniform", "normal", "trunc_normal",
]

_U64 = 1 << 64
_OFFSET_LIMIT = 1 << 63
_DEFAULT_SEED = 67280421310721  # torch's default seed


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"carbon.Generator: seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < _U64:
        raise ValueError(f"carbon.Generator: seed must be in [0, 2**64), got {seed}")
    return seed


def _as_int64(value: int) -> int:
    """The two's-complement int64 with the bits of the uint64 ``value`` (op schemas take int64)."""
    return value - _U64 if value >= (1 << 63) else value


class Generator:
    """A Philox4x32-10 stream: the 64-bit ``seed`` (the key) and a 64-bit
    ``offset`` that counts the draws made (one per draw, whatever its size).
    The state lives on ``device`` (CPU or CUDA) as the int64 tensor [seed,
    offset]; the values drawn do not depend on it. Draws on a CUDA device
    read a CPU generator's state on the host (free: host memory) and a CUDA
    generator's on the device; a CUDA generator is what a captured CUDA graph
    needs, and CPU draws from it wait for the device (they copy the state)."""

    def __init__(self, device: Union[str, torch.device, None] = None, seed: Optional[int] = None) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"carbon.Generator: device must be a CPU or CUDA device, got {device}")
        seed = _DEFAULT_SEED if seed is None else _check_seed(seed)
        # Never inference tensors (created under torch.inference_mode they
        # could not be advanced outside it).
        with torch.inference_mode(False):
            self._state = torch.tensor([_as_int64(seed), 0], dtype=torch.int64, device=device)
            # what one draw adds to the state (a tensor: a CUDA graph replays the add)
            self._step = torch.tensor([0, 1], dtype=torch.int64, device=device)
        self.device = self._state.device

    def _set(self, seed: int, offset: int) -> None:
        """Write the state in place: a captured CUDA graph and compiled code
        hold this very tensor."""
        with torch.inference_mode(False):
            self._state.copy_(torch.tensor([_as_int64(seed), offset], dtype=torch.int64))

    def _values(self) -> Tuple[int, int]:
        """(seed as uint64, offset), read on the host (waits for a CUDA state)."""
        seed_value, offset = self._state.tolist()
        return seed_value % _U64, offset

    # torch.Generator's interface -------------------------------------------------
    def manual_seed(self, seed: int) -> "Generator":
        """Set the seed and reset the offset to 0. Returns self."""
        self._set(_check_seed(seed), 0)
        return self

    def seed(self) -> int:
        """Seed from a nondeterministic source (time and os.urandom), reset the
        offset, and return the new seed."""
        import os

        value = (int.from_bytes(os.urandom(8), "little") ^ time.time_ns()) % _U64
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._values()[0]

    def get_state(self) -> Tensor:
        """The state as a uint8 CPU tensor of 16 bytes: seed then offset, each
        little-endian uint64."""
        data = struct.pack("<QQ", *self._values())
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()

    def set_state(self, new_state: Tensor) -> "Generator":
        if not isinstance(new_state, Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
            raise ValueError("carbon.Generator.set_state: expected a uint8 tensor of 16 bytes (from get_state)")
        seed_value, offset = struct.unpack("<QQ", bytes(new_state.cpu().contiguous().tolist()))
        if offset >= _OFFSET_LIMIT:
            raise ValueError(f"carbon.Generator.set_state: offset {offset} is not below 2**63")
        self._set(seed_value, offset)
        return self

    @property
    def offset(self) -> int:
        """Number of draws made since the seed was set (the next draw's offset)."""
        return self._values()[1]

    @offset.setter
    def offset(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _OFFSET_LIMIT:
            raise ValueError(f"carbon.Generator: offset must be an int in [0, 2**63), got {value!r}")
        self._set(self._values()[0], value)

    # carbon's use ---------------------------------------------------------------------
    def next_state(self) -> Tensor:
        """The state of one draw -- a new tensor, int64 [seed, offset], for the
        ops' ``.state`` overloads -- and advance the offset by one. Tensor
        operations only (a copy and an in-place add on the generator's
        device): nothing is read on the host, so it traces into a compiled
        graph and replays in a CUDA graph. (The offset is not checked against
        2**63 here: that many draws take centuries.)"""
        state = self._state.clone()
        self._state.add_(self._step)
        return state

    def next_draw(self) -> Tuple[int, int]:
        """(seed as int64, offset) of one draw as Python ints, for the ops'
        int overloads, and advance the offset by one. Reads the state on the
        host (waits for a CUDA generator; a constant under torch.compile):
        carbon's own draws use :meth:`next_state`."""
        seed_value, offset = self._values()
        if offset >= _OFFSET_LIMIT - 1:
            raise RuntimeError("carbon.Generator: offset exhausted (2**63 draws)")
        self._state.add_(self._step)
        return _as_int64(seed_value), offset

    def __repr__(self) -> str:
        seed_value, offset = self._values()
        return f"carbon.Generator(seed={seed_value}, offset={offset})"


default_generator = Generator()


def _generator(generator: Optional[Generator]) -> Generator:
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise TypeError(f"carbon: generator must be a carbon.Generator, got {type(generator).__name__}")
    return generator


def manual_seed(seed: int) -> Generator:
    """Seed carbon's default generator (offset back to 0); returns it."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    return default_generator.get_state()


def set_rng_state(new_state: Tensor) -> None:
    default_generator.set_state(new_state)


def _size(size: Sequence) -> list:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return [int(s) for s in size]


def _dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    return torch.get_default_dtype() if dtype is None else dtype


def _device(device: Union[str, torch.device, None]) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


def uniform(size: Sequence[int], low: float = 0.0, high: float = 1.0, *, generator: Optional[Generator] = None,
            dtype: Optional[torch.dtype] = None, device: Union[str, torch.device, None] = None) -> Tensor:
    """RN(low + (high - low) u) with u = (w >> 8) 2^-24, one draw."""
    state = _generator(generator).next_state()
    return torch.ops.carbon.uniform.state(_size(size), state, float(low), float(high), _dtype(dtype), _device(device))


def normal(size: Sequence[int], mean: float = 0.0, std: float = 1.0, *, generator: Optional[Generator] = None,
           dtype: Optional[torch.dtype] = None, device: Union[str, torch.device, None] = None) -> Tensor:
    """RN(mean + std z), z by Box-Muller in binary64, one draw."""
    state = _generator(generator).next_state()
    return torch.ops.carbon.normal.state(_size(size), state, float(mean), float(std), _dtype(dtype), _device(device))


def trunc_normal(size: Sequence[int], mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, *,
                 generator: Optional[Generator] = None, dtype: Optional[torch.dtype] = None,
                 device: Union[str, torch.device, None] = None) -> Tensor:
    """N(mean, std) restricted to [a, b] by per-element rejection (64 attempts,
    then the last attempt clamped), one draw."""
    state = _generator(generator).next_state()
    return torch.ops.carbon.trunc_normal.state(_size(size), state, float(mean), float(std), float(a), float(b),
                                               _dtype(dtype), _device(device))


def rand(*size, generator: Optional[Generator] = None, dtype: Optional[torch.dtype] = None,
         device: Union[str, torch.device, None] = None) -> Tensor:
    """Uniform on [0, 1) (``torch.rand``'s signature): u = (w >> 8) 2^-24,
    exact in float32; rounded to bfloat16 / float16 it can reach 1."""
    return uniform(_size(size), 0.0, 1.0, generator=generator, dtype=dtype, device=device)


def randn(*size, generator: Optional[Generator] = None, dtype: Optional[torch.dtype] = None,
          device: Union[str, torch.device, None] = None) -> Tensor:
    """Standard normal (``torch.randn``'s signature)."""
    return normal(_size(size), 0.0, 1.0, generator=generator, dtype=dtype, device=device)


def bernoulli(input: Tensor, p: Optional[float] = None, *, generator: Optional[Generator] = None) -> Tensor:
    """1 where u_i < p_i, else 0, in input's shape and dtype; p_i = input[i]
    (``torch.bernoulli(input)``), or the float ``p`` for every element
    (``torch.bernoulli(input, p)``). The comparison is exact (binary64)."""
    state = _generator(generator).next_state()
    return torch.ops.carbon.bernoulli.state(input, state, None if p is None else float(p))
