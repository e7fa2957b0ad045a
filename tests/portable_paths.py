"""The *_paths tests: a script's results computed in two fresh processes, one on the CPU's fastest
loops and one with the environment switches that select slower loops (the portable ones, or the
AVX2 ones with CARBON_CPU_NO_AVX512 fixed), compared bit for bit. On a CPU without the faster
loops both runs take the same loops, and the comparison checks only that they are deterministic.
csrc/cpu_features.h documents the CARBON_CPU_* switches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest
import torch


def cpu_has_avx512() -> bool:
    """Whether the CPU has AVX-512 (Linux: /proc/cpuinfo's flags), i.e. whether the fastest loops differ
    from the AVX2 ones."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


# For the comparisons of the AVX-512 loops with the next ones: without AVX-512 both runs would take the
# same loops (the AVX2-vs-portable comparisons still run).
needs_avx512 = pytest.mark.skipif(not cpu_has_avx512(), reason="no AVX-512: both runs would take the same loops")

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def run_script(script: str, path: Path, switches: Sequence[str], portable: bool, fixed: Sequence[str] = ()) -> list:
    """Run `script` (which saves a list of tensors to sys.argv[1]) with every switch set to 1 or
    unset (and every `fixed` one set to 1), and load its results."""
    env = dict(os.environ)
    for name in fixed:
        env[name] = "1"
    for name in switches:
        env.pop(name, None)
        if portable:
            env[name] = "1"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, timeout=600)
    return torch.load(path)


def assert_portable_gives_the_same_bits(script: str, tmp_path: Path, switches: Sequence[str],
                                        fixed: Sequence[str] = ()) -> None:
    fast = run_script(script, tmp_path / "fast.pt", switches, False, fixed)
    portable = run_script(script, tmp_path / "portable.pt", switches, True, fixed)
    assert len(fast) == len(portable) > 0
    for k, (a, b) in enumerate(zip(fast, portable)):
        assert torch.equal(a.view(_BITS[a.dtype]), b.view(_BITS[b.dtype])), f"result {k}"
