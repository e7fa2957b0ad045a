"""Exhaustive check of the softmax kernels' float32 EXPs (csrc/softmax/softmax_exp_cpu.h and, on CPUs with
AVX-512, csrc/softmax/softmax_exp_avx512.h).

    python scripts/softmax_exp_check.py [--march ARCH]

Compiles scripts/softmax_exp_check.cpp with g++ (-O3 -fopenmp
-ffp-contract=off; the headers need no torch) into build/ and runs it: for
every float32 bit pattern d that exp_f32_approx_decided decides, the float32
bits of round32_decided(exp_f32_approx(d)) (as in the kernels) must equal
RN32(exp_f32_core(d)), carbon.exp's (mismatches: must be 0; exit status 1
otherwise); the same for every lane exp16_table_round decides (AVX-512 CPUs,
whatever --march: the function has its own target attribute), whose
kNonPositive variant must also agree with it on every d <= 0 and NaN; and on AVX2 CPUs every pattern
exp_group8_tested's lighter in-register test passes (softmax_exp_avx2.h) must be one exp_f32_approx_decided
decides, with the same bits. --ftz runs it with flush-to-zero and denormals-are-zero set
(as torch.set_flush_denormal(True) does): the same bits. Also prints how many patterns are decided, how
many in [-87, 88] are not (the kernels compute exp32 for those) and the
largest relative difference of the two doubles. --march as in
scripts/exp_f32_check.py (default native: the AVX2 / AVX-512 code the
kernels' clones run; "x86-64" for the scalar SSE2 path).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from native_check import ROOT, build_check  # scripts/ is on sys.path when a script runs

HEADERS = [os.path.join(ROOT, "csrc", "cpu_features.h"),
           os.path.join(ROOT, "csrc", "softmax", "softmax_exp_cpu.h"),
           os.path.join(ROOT, "csrc", "softmax", "softmax_exp_avx2.h"),
           os.path.join(ROOT, "csrc", "softmax", "softmax_exp_avx512.h"),
           os.path.join(ROOT, "csrc", "elementwise", "elementwise_math.h")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--march", default="native", help="g++ -march for the check (default: native)")
    ap.add_argument("--ftz", action="store_true", help="set flush-to-zero and denormals-are-zero (MXCSR)")
    args = ap.parse_args(argv)
    binary = build_check("softmax_exp_check", HEADERS, args.march)
    print(f"{binary} (-march={args.march}{', FTZ+DAZ' if args.ftz else ''})")
    sys.stdout.flush()
    return subprocess.run([binary] + (["--ftz"] if args.ftz else [])).returncode


if __name__ == "__main__":
    sys.exit(main())
