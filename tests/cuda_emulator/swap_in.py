"""Route carbon's own ops (torch.ops.carbon.*) to the emulated CUDA kernels, in this process.

After `use_emulated_kernels()`, every carbon op called on CPU tensors runs the implementation of
torch.ops.carbon_emu (the op files' CUDA branches and the .cu kernels on the emulator, see build.py) in place of
carbon's CPU kernels, below carbon's autograd and above nothing else: carbon.enable, carbon.nn, carbon.optim
and the demo then train with the GPU's kernels. For whole-program checks such as the demo's golden fingerprint
(tests/test_cuda_emulated_demo.py); run it in a process of its own, since it cannot be undone."""

from __future__ import annotations

import warnings

import torch

import carbon  # noqa: F401  (registers torch.ops.carbon and its autograd)

from .build import load

_KEYS = ("CPU", "CompositeExplicitAutograd")


def use_emulated_kernels() -> torch.library.Library:
    """Overrides the CPU (and device-generic) kernel of every carbon op with the emulated CUDA one. Returns the
    torch.library.Library that holds the overrides (keep it alive)."""
    emu = load()
    lib = torch.library.Library("carbon", "IMPL")
    names = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("carbon::"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        for name in names:
            op, _, overload = name.partition(".")
            packet = getattr(getattr(emu, op), overload or "default")
            for key in _KEYS:
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{name}", key):
                    lib.impl(name, packet, key)
    return lib
