"""carbon's CUDA kernels run on the CPU emulator (tests/cuda_emulator/): torch.ops.carbon_emu is carbon's op library
rebuilt so that every tensor takes the ops' CUDA branch into the .cu kernels, compiled as C++ and run by the
emulator. Tests compare its results bit for bit with carbon's CPU kernels (torch.ops.carbon) -- the GPU-vs-CPU
comparisons of the *_cuda.py tests, on machines without a GPU.

The library is built once per session (a few minutes on 2 cores; build/cuda_emulator/ keeps the objects between
runs). CARBON_CUDA_EMULATOR=0 skips these tests."""

from __future__ import annotations

import os

import pytest
import torch

_ops = None


def emulated_ops():
    """torch.ops.carbon_emu, built and loaded on first use (or a skip when disabled)."""
    global _ops
    if os.environ.get("CARBON_CUDA_EMULATOR") == "0":
        pytest.skip("CARBON_CUDA_EMULATOR=0: the CUDA emulator tests are disabled")
    if _ops is None:
        from cuda_emulator.build import load

        _ops = load()
    return _ops


def launches() -> int:
    return int(emulated_ops()._emu_launches())


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.dtype.is_floating_point:
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def assert_same(emulated, cpu, context: str = "") -> None:
    """Equal bits (NaN payloads and signed zeros included) in every tensor of two results."""
    if isinstance(cpu, (tuple, list)):
        assert isinstance(emulated, (tuple, list)) and len(emulated) == len(cpu), context
        for i, (e, c) in enumerate(zip(emulated, cpu)):
            assert_same(e, c, f"{context}[{i}]")
        return
    if not isinstance(cpu, torch.Tensor):
        assert emulated == cpu or (emulated != emulated and cpu != cpu), f"{context}: {emulated!r} vs {cpu!r}"
        return
    assert emulated.dtype == cpu.dtype and emulated.shape == cpu.shape, (
        f"{context}: {emulated.dtype} {tuple(emulated.shape)} vs {cpu.dtype} {tuple(cpu.shape)}")
    got, want = _as_bits(emulated).reshape(-1), _as_bits(cpu).reshape(-1)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{context}: {bad.numel()} of {got.numel()} outputs differ between the emulated CUDA kernels and the CPU "
        f"kernels, first at flat indices {bad[:5].tolist()}: emulated {emulated.reshape(-1)[bad[0]].item()!r} vs "
        f"CPU {cpu.reshape(-1)[bad[0]].item()!r}")


def _clone(v):
    """A copy with v's exact layout: a non-contiguous tensor keeps its strides (clone() would make an expanded or
    sliced operand contiguous, and the kernels' strided paths would go untested), over a copy of its storage."""
    if isinstance(v, torch.Tensor):
        if v.is_contiguous() or v.requires_grad:
            return v.clone()
        return torch.empty(0, dtype=v.dtype, device=v.device).set_(
            v.untyped_storage().clone(), v.storage_offset(), v.size(), v.stride())
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    return v


def check_op(name: str, *args, context: str = "", expect_launch: bool = True, **kwargs):
    """Runs torch.ops.carbon.<name> and torch.ops.carbon_emu.<name> on copies of the same arguments; asserts the
    same bits in the results and in every tensor argument afterwards (in-place ops), and, unless told otherwise,
    that the emulated op launched at least one kernel. Returns the CPU result."""
    emu = emulated_ops()
    cpu_args, emu_args = _clone(args), _clone(args)
    cpu_kwargs, emu_kwargs = _clone(kwargs), _clone(kwargs)
    want = getattr(torch.ops.carbon, name)(*cpu_args, **cpu_kwargs)
    before = launches()
    got = getattr(emu, name)(*emu_args, **emu_kwargs)
    label = f"{name}{': ' + context if context else ''}"
    if expect_launch:
        assert launches() > before, f"{label}: the emulated op launched no kernel (did it take the CPU path?)"
    assert_same(got, want, label)
    assert_same(emu_args, cpu_args, f"{label} (arguments after the call)")
    assert_same(list(emu_kwargs.values()), list(cpu_kwargs.values()), f"{label} (keyword arguments after the call)")
    return want
