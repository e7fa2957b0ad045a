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

from native_check import ROOT, build_check  # scripts/ is on sys.path when a script runs

HEADERS = [os.path.join(ROOT, "csrc", "elementwise", "elementwise_math.h")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--march", default="native", help="g++ -march for the check (default: native)")
    args = ap.parse_args(argv)
    binary = build_check("exp_f32_check", HEADERS, args.march)
    print(f"{binary} (-march={args.march})")
    sys.stdout.flush()
    return subprocess.run([binary]).returncode


if __name__ == "__main__":
    sys.exit(main())
