"""Prints the constants of csrc/elementwise/binary64_math.h from mpmath at
1600 bits: the words of 2/pi for the float64 argument reduction (held by
elementwise_math.h's two_over_pi_word, which float32 sin / cos share), and the
double-double / triple-double splits of ln 2, pi/2 and log2(e).
Run: python scripts/binary64_constants.py (mpmath ships with torch's sympy)."""

import mpmath
from mpmath import mp, mpf

mp.prec = 1600


def hexd(v: mpf) -> str:
    return float(v).hex()


def split(v: mpf, parts: int, first_bits: int = 53) -> list:
    out, rest = [], v
    for i in range(parts):
        bits = first_bits if i == 0 else 53
        e = int(mpmath.floor(mpmath.log(abs(rest), 2)))
        q = mpmath.nint(rest * mpf(2) ** (bits - 1 - e)) * mpf(2) ** (e - bits + 1)
        out.append(q)
        rest -= q
    return out


def main() -> None:
    words = int(mpf(2) / mp.pi * mpf(2) ** 1280)
    print("// 2/pi = sum_i c_i 2^-i: bits c_1 .. c_1280 in 20 words, c_1 the top bit of the first")
    for k in range(20):
        print(f"0x{(words >> (64 * (19 - k))) & (2**64 - 1):016x}ull,")
    ln2 = mpmath.log(2)
    print("ln2 (42 + 53 + 53 bits):", ", ".join(hexd(x) for x in split(ln2, 3, 42)))
    print("ln2 double-double:", ", ".join(hexd(x) for x in split(ln2, 2)))
    print("pi/2 double-double:", ", ".join(hexd(x) for x in split(mp.pi / 2, 2)))
    print("log2(e):", hexd(1 / ln2))
    print("sqrt(2) rounded down:", float(mpmath.sqrt(2)).hex())


if __name__ == "__main__":
    main()
