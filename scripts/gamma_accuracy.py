"""Accuracy of Carbon's gamma family (csrc/elementwise/gamma_math.h) on float32 inputs, against mpmath.

    python scripts/gamma_accuracy.py [--random N] [--near K] [--seed S]

Compiles a small driver of the header's cores with g++ (-O2 -ffp-contract=off, no torch) into build/, runs
it on: N random float32 bit patterns, N uniform values in [-20, 20] and N in [-1e4, 1e4], and the K float32
values on each side of every zero a float32 argument can approach (lgamma: 1, 2 and its negative zeros down
to -9; digamma: its positive zero and its negative zeros down to -9), of the negative integers down to -40,
and of the thresholds 2^-25 and 16. For lgamma, digamma, trigamma and tetragamma (trigamma's derivative)
it prints the largest relative error of the binary64 core (log2), where it occurs, how many float32
results (one rounding of the core) differ from the correctly rounded value, and the largest error in
float32 ulps. mpmath's psi(n, x) is slow far below 0 (~25 s a call): there, trigamma and tetragamma's
references use the reflection formulas at 160 bits.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import struct
import subprocess

import mpmath as mp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = r"""
#include <cstdio>
#include <cstring>
#include "elementwise/gamma_math.h"
using namespace carbon::math;
int main() {
  unsigned int b;
  while (scanf("%x", &b) == 1) {
    float f; memcpy(&f, &b, 4); const double x = f;
    printf("%a %a %a %a\n", lgamma_core(x), digamma_core(x), trigamma_core(x), gamma_family::tetragamma_core(x));
  }
}
"""
NAMES = ("lgamma", "digamma", "trigamma", "tetragamma")


def build() -> str:
    out = os.path.join(ROOT, "build")
    os.makedirs(out, exist_ok=True)
    src, binary = os.path.join(out, "gamma_accuracy.cpp"), os.path.join(out, "gamma_accuracy")
    with open(src, "w") as f:
        f.write(DRIVER)
    subprocess.run(["g++", "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-I", os.path.join(ROOT, "csrc"),
                    src, "-o", binary], check=True)
    return binary


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def reference(k: int, x: float):
    X = mp.mpf(x)
    if k == 0:
        return mp.re(mp.loggamma(X))
    if x < -100 and k >= 2:
        s, c = mp.sinpi(X), mp.cospi(X)
        return mp.pi**2 / s**2 - mp.psi(1, 1 - X) if k == 2 else mp.psi(2, 1 - X) - 2 * mp.pi**3 * c / s**3
    return mp.psi(k - 1, X)


def inputs(n: int, near: int, seed: int) -> list:
    rng = random.Random(seed)
    out = {rng.getrandbits(32) for _ in range(n)}
    out |= {f32_bits(rng.uniform(-20, 20)) for _ in range(n)} | {f32_bits(rng.uniform(-1e4, 1e4)) for _ in range(n)}
    lg = lambda t: mp.re(mp.loggamma(t))  # noqa: E731
    centres = [1.0, 2.0, 2.0**-25, 16.0] + [-float(m) for m in range(1, 41)]
    centres += [float(mp.findroot(lg, -m - d)) for m in range(2, 10) for d in (0.1, 0.9)]
    centres += [float(mp.findroot(mp.digamma, s)) for s in [1.46] + [-m - 0.5 for m in range(0, 10)]]
    for c in centres:
        b = f32_bits(c)
        out |= {(b + d) & 0xFFFFFFFF for d in range(-near, near + 1)}
    return sorted(b for b in out if (b >> 23) & 0xFF != 0xFF)  # finite


def rounded_f32(v) -> float:
    """RN32 of an mpf: 24 bits for normal values, the grid of 2^-149 below 2^-126 (nint: ties to even)."""
    if abs(v) < mp.mpf(2) ** -126:
        return float(mp.nint(v * mp.mpf(2) ** 149) * mp.mpf(2) ** -149)
    with mp.workprec(24):
        r = +mp.mpf(v)
    return float(r) if abs(r) < 2**128 else math.copysign(math.inf, float(v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", type=int, default=20000)
    ap.add_argument("--near", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    mp.mp.prec = 160
    xs = inputs(args.random, args.near, args.seed)
    run = subprocess.run([build()], input="\n".join(f"{b:x}" for b in xs), capture_output=True, text=True, check=True)
    rows = [[float.fromhex(t) for t in line.split()] for line in run.stdout.splitlines()]
    worst = [(-math.inf, None)] * 4
    wrong, ulps = [0] * 4, [0.0] * 4
    for b, row in zip(xs, rows):
        x = f32(b)
        if x <= 0 and x == math.floor(x):
            continue  # the poles: special values, tests/test_elementwise_gamma.py
        for k, got in enumerate(row):
            ref = reference(k, x)
            if ref == 0:
                continue
            e = float(mp.log(abs((mp.mpf(got) - ref) / ref), 2)) if got != ref else -math.inf
            if e > worst[k][0]:
                worst[k] = (e, x)
            want = rounded_f32(ref)
            with np.errstate(over="ignore"):
                mine = float(np.float32(got))  # RN32 of the core (inf beyond float32's range)
            if mine != want and not (math.isinf(want) and math.isinf(mine)):
                wrong[k] += 1
            if math.isfinite(want) and want != 0:
                ulp = 2.0 ** (math.frexp(want)[1] - 24) if abs(want) >= 2**-126 else 2.0**-149
                ulps[k] = max(ulps[k], float(abs(mp.mpf(mine) - ref) / ulp))
    print(f"{len(xs)} float32 inputs (seed {args.seed})")
    print("| function | max relative error of the core | at x | float32 results not correctly rounded | max error (ulp) |")
    print("|---|---|---|---|---|")
    for k, name in enumerate(NAMES):
        print(f"| {name} | 2^{worst[k][0]:.1f} | {worst[k][1]!r} | {wrong[k]} | {ulps[k]:.9f} |")


if __name__ == "__main__":
    main()
