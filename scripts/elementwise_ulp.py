"""Exhaustive float32 accuracy check of Carbon's elementwise math.

    python scripts/elementwise_ulp.py [--functions exp,log,...] [--stride K] [--grads]

Compiles scripts/elementwise_ulp.cpp with g++ (-O2 -fopenmp -ffp-contract=off;
the header needs only csrc/exact/*.h, no torch) into build/, then runs it:
for each function, every float32 bit pattern (or every K-th) goes through the
kernels' code and is compared with a long double reference. Prints per
function the max error in ulps, where it occurs, how many results are not
the correctly rounded value, and how many the reference cannot decide.
Functions: exp log tanh sigmoid erf gelu gelu_tanh silu sin cos log1p softplus
log_sigmoid expm1 log2 log10 exp2 erfc sinh cosh tan atan asin acos erfinv asinh acosh
atanh (default), and with --grads (or by name) their derivatives exp_grad ... atanh_grad.
--sincos-reduction instead measures the smallest reduced argument of sin/cos, and
--erfinv-start the largest relative error of erfinv's starting approximation.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "scripts", "elementwise_ulp.cpp")
HEADERS = [os.path.join(ROOT, "csrc", "elementwise", "elementwise_math.h"),
           os.path.join(ROOT, "csrc", "exact", "float_format.h"), os.path.join(ROOT, "csrc", "exact", "portable.h")]
FORWARD = ["exp", "log", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "sin", "cos", "log1p", "softplus",
           "log_sigmoid", "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos",
           "erfinv", "asinh", "acosh", "atanh"]
GRADS = [f + "_grad" for f in FORWARD]


def _has_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " fma " in f.read()
    except OSError:
        return False


def build(out_dir: str = os.path.join(ROOT, "build")) -> str:
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, "elementwise_ulp")
    newest = max(os.path.getmtime(p) for p in [SOURCE] + HEADERS)
    if os.path.exists(binary) and os.path.getmtime(binary) >= newest:
        return binary
    # -mfma only makes fma() a single instruction; results are the same
    # (fma is correctly rounded either way), and contraction stays off.
    cmd = ["g++", "-std=c++17", "-O2", "-fopenmp", "-ffp-contract=off", "-fno-fast-math",
           *(["-mfma"] if _has_fma() else []), "-I", os.path.join(ROOT, "csrc"), SOURCE, "-o", binary]
    subprocess.run(cmd, check=True)
    return binary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", default=None,
                    help=f"comma-separated list (default: every forward function, {len(FORWARD)}: "
                         f"{', '.join(FORWARD)})")
    ap.add_argument("--grads", action="store_true",
                    help=f"also check the derivative of every function in the default list ({len(GRADS)}: "
                         f"{GRADS[0]} ... {GRADS[-1]}); "
                         "with --functions, name derivatives there instead")
    ap.add_argument("--stride", type=int, default=1, help="check every K-th bit pattern (default 1: all 2^32)")
    ap.add_argument("--sincos-reduction", action="store_true",
                    help="print the smallest |f| of sin/cos's reduction x 2/pi = q + f over all float32 x > pi/4")
    ap.add_argument("--erfinv-start", action="store_true",
                    help="print the largest relative error of erfinv's starting approximation over all float32 in (0, 1)")
    args = ap.parse_args(argv)
    if args.sincos_reduction:
        return subprocess.run([build(), "--sincos-reduction"]).returncode
    if args.erfinv_start:
        return subprocess.run([build(), "--erfinv-start"]).returncode
    names = args.functions.split(",") if args.functions else FORWARD + (GRADS if args.grads else [])
    binary = build()
    sys.stdout.flush()
    return subprocess.run([binary, "--functions", ",".join(names), "--stride", str(args.stride)]).returncode


if __name__ == "__main__":
    sys.exit(main())
