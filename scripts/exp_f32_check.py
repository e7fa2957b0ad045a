"""Exhaustive check of exp_f32_core: the float32 EXP's bits for all 2^32 inputs.

    python scripts/exp_f32_check.py [--march ARCH]

Compiles scripts/exp_f32_check.cpp with g++ (-O3 -fopenmp -ffp-contract=off;
the header needs only csrc/exact/*.h, no torch) into build/ and runs it: for
every float32 bit pattern d it compares RN32(exp_f32_core(d)) with
RN32(exp_core(d)) (csrc/elementwise/elementwise_math.h) bit for bit and
prints how many patterns give identical doubles, how many give different
doubles with the same float32 bits (the clamped tails: 0 and inf) and how
many mismatch (must be 0; exit status 1 otherwise). --march compiles the
loop over exp_f32_core for that target (default: native, so it runs the
vectorized code the kernels' AVX2 / AVX-512 clones run; "x86-64" for the
scalar SSE2 path).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "scripts", "exp_f32_check.cpp")
HEADERS = [os.path.join(ROOT, "csrc", "elementwise", "elementwise_math.h"),
           os.path.join(ROOT, "csrc", "exact", "float_format.h"), os.path.join(ROOT, "csrc", "exact", "portable.h")]


def build(march: str, out_dir: str = os.path.join(ROOT, "build")) -> str:
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, f"exp_f32_check_{march}")
    newest = max(os.path.getmtime(p) for p in [SOURCE] + HEADERS)
    if os.path.exists(binary) and os.path.getmtime(binary) >= newest:
        return binary
    cmd = ["g++", "-std=c++17", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math",
           "-fno-math-errno", f"-march={march}", "-I", os.path.join(ROOT, "csrc"), SOURCE, "-o", binary]
    subprocess.run(cmd, check=True)
    return binary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--march", default="native", help="g++ -march for the check (default: native)")
    args = ap.parse_args(argv)
    binary = build(args.march)
    print(f"{binary} (-march={args.march})")
    sys.stdout.flush()
    return subprocess.run([binary]).returncode


if __name__ == "__main__":
    sys.exit(main())
