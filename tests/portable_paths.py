"""The *_paths tests: a script's results computed in two fresh processes, one on the AVX-512 CPU
loops and one with the environment switches that select the portable loops, compared bit for bit.
On a CPU without AVX-512 both runs take the portable loops, and the comparison checks only that
they are deterministic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import torch

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def run_script(script: str, path: Path, switches: Sequence[str], portable: bool) -> list:
    """Run `script` (which saves a list of tensors to sys.argv[1]) with every switch set to 1 or
    unset, and load its results."""
    env = dict(os.environ)
    for name in switches:
        env.pop(name, None)
        if portable:
            env[name] = "1"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, timeout=600)
    return torch.load(path)


def assert_portable_gives_the_same_bits(script: str, tmp_path: Path, switches: Sequence[str]) -> None:
    fast = run_script(script, tmp_path / "fast.pt", switches, False)
    portable = run_script(script, tmp_path / "portable.pt", switches, True)
    assert len(fast) == len(portable) > 0
    for k, (a, b) in enumerate(zip(fast, portable)):
        assert torch.equal(a.view(_BITS[a.dtype]), b.view(_BITS[b.dtype])), f"result {k}"
