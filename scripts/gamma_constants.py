"""Prints the constants of csrc/elementwise/gamma_math.h from mpmath at 400
bits: pi, log(pi), log(2 pi)/2 and Euler's gamma (double-double splits or
doubles), and the coefficients of the asymptotic series of lgamma, digamma,
trigamma and tetragamma (B_2j the Bernoulli numbers):
  lgamma(z)  ~ (z - 1/2) log z - z + log(2 pi)/2 + sum_j B_2j / (2j (2j-1)) z^(1-2j)
  digamma(z) ~ log z - 1/(2z) - sum_j B_2j / (2j) z^(-2j)
  trigamma(z) ~ 1/z + 1/(2z^2) + sum_j B_2j z^(-2j-1)
  tetragamma(z) ~ -1/z^2 - 1/z^3 - sum_j (2j+1) B_2j z^(-2j-2)
Each series is printed from its last coefficient down (Horner's order), the
first kDd as double-double pairs.
Run: python scripts/gamma_constants.py (mpmath ships with torch's sympy)."""

import mpmath
from mpmath import mp, mpf

mp.prec = 400


def hexd(v: mpf) -> str:
    return float(v).hex()


def dd(v: mpf) -> str:
    hi = mpf(float(v))
    return f"{{{hexd(hi)}, {hexd(v - hi)}}}"


def series(name: str, coef, count: int, dd_count: int) -> None:
    print(f"// {name}: j = {count} .. {dd_count + 1} (double), then j = {dd_count} .. 1 (double-double)")
    print("{" + ", ".join(hexd(coef(j)) for j in range(count, dd_count, -1)) + "}")
    print("{" + ", ".join(dd(coef(j)) for j in range(dd_count, 0, -1)) + "}")


def main() -> None:
    print("pi:", dd(mp.pi))
    print("log(pi):", dd(mpmath.log(mp.pi)))
    print("log(2 pi)/2:", dd(mpmath.log(2 * mp.pi) / 2))
    print("Euler gamma:", hexd(mp.euler), " pi^2/6:", hexd(mp.pi ** 2 / 6), " pi^2/12:", hexd(mp.pi ** 2 / 12),
          " zeta(3):", hexd(mpmath.zeta(3)), " pi^2:", hexd(mp.pi ** 2), " 2 pi^3:", hexd(2 * mp.pi ** 3))
    b = mpmath.bernoulli
    series("lgamma", lambda j: b(2 * j) / (2 * j * (2 * j - 1)), 16, 5)
    series("digamma", lambda j: b(2 * j) / (2 * j), 17, 4)
    series("trigamma", lambda j: b(2 * j), 8, 0)
    series("tetragamma", lambda j: (2 * j + 1) * b(2 * j), 9, 0)


if __name__ == "__main__":
    main()
