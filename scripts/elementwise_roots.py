"""Taylor expansions of the derivatives that cross zero: gelu', gelu_tanh' and silu' (near -0.75, -0.75 and
-1.28). There the core's formula Φ(x) + x·φ(x) (and the like) subtracts nearly equal terms, and its relative
error grows without bound as x approaches the root; csrc/elementwise/elementwise_math.h evaluates
Σ c_k d^k with d = (x − r_hi) − r_lo instead, for |x − r| < 2^-7.

    python scripts/elementwise_roots.py      # prints the C++ constants (r as a double-double, c_1 … c_10)

Needs mpmath (a test dependency). The root is found to 200 bits; the coefficients f^(k)(r)/k! are rounded
to binary64. Truncation after degree 10 over |d| < 2^-7 is below 2^-70 relative to c_1·d (printed)."""

from __future__ import annotations

import mpmath as mp

mp.mp.prec = 240


def gelu_grad(x):
    return mp.ncdf(x) + x * mp.npdf(x)


def gelu_tanh_grad(x):
    c = mp.sqrt(2 / mp.pi)
    a = mp.mpf("0.044715")
    y = 2 * c * x * (1 + a * x * x)  # sigmoid(2v) form: 2v = 2c·x(1 + a x²)
    s = 1 / (1 + mp.exp(-y))
    dy = 2 * c * (1 + 3 * a * x * x)
    return s + x * s * (1 - s) * dy


def silu_grad(x):
    s = 1 / (1 + mp.exp(-x))
    return s * (1 + x * (1 - s))


def hexd(v) -> str:
    return float(v).hex()


def main() -> None:
    for name, f, guess in (("gelu", gelu_grad, -0.75), ("gelu_tanh", gelu_tanh_grad, -0.75),
                           ("silu", silu_grad, -1.28)):
        r = mp.findroot(f, mp.mpf(guess))
        hi = mp.mpf(float(r))
        lo = mp.mpf(float(r - hi))
        coeffs = mp.taylor(f, r, 11)
        print(f"// {name}': root r = {mp.nstr(r, 30)}")
        print(f"constexpr double k{name.title().replace('_', '')}RootHi = {hexd(hi)};")
        print(f"constexpr double k{name.title().replace('_', '')}RootLo = {hexd(lo)};")
        print("  // c_1 ... c_10")
        print("  " + ", ".join(hexd(c) for c in coeffs[1:11]))
        d = mp.mpf(2) ** -7
        print(f"  // truncation at |d| = 2^-7: c_11 d^10 / c_1 = {mp.nstr(abs(coeffs[11]) * d ** 10 / abs(coeffs[1]), 5)}")
        # the float32 closest to the root
        import struct
        f32 = struct.unpack("f", struct.pack("f", float(r)))[0]
        best = min((abs(mp.mpf(v) - r), v) for v in (
            struct.unpack("f", struct.pack("I", struct.unpack("I", struct.pack("f", f32))[0] + k))[0]
            for k in (-1, 0, 1)))
        print(f"  // nearest float32 {best[1]!r}: |x - r| = {mp.nstr(best[0], 5)}")


if __name__ == "__main__":
    main()
