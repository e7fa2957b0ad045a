"""Builds the exhaustive C++ checks of scripts/ (exp_f32_check, softmax_exp_check): g++ with the kernels'
floating-point flags (-ffp-contract=off, no fast-math), OpenMP, the -march under test, csrc/ on the
include path, into build/; rebuilt only when the source or a header it checks is newer than the binary."""

from __future__ import annotations

import os
import subprocess
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXACT_HEADERS = [os.path.join(ROOT, "csrc", "exact", "float_format.h"), os.path.join(ROOT, "csrc", "exact", "portable.h")]


def build_check(name: str, headers: List[str], march: str, out_dir: str = os.path.join(ROOT, "build")) -> str:
    """The path of build/<name>_<march>, compiled from scripts/<name>.cpp if needed."""
    source = os.path.join(ROOT, "scripts", f"{name}.cpp")
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, f"{name}_{march}")
    newest = max(os.path.getmtime(p) for p in [source] + headers + EXACT_HEADERS)
    if os.path.exists(binary) and os.path.getmtime(binary) >= newest:
        return binary
    cmd = ["g++", "-std=c++17", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math",
           "-fno-math-errno", f"-march={march}", "-I", os.path.join(ROOT, "csrc"), source, "-o", binary]
    subprocess.run(cmd, check=True)
    return binary
