"""Regenerates the two polynomial fits of erfcx(u) = exp(u^2) * erfc(u) used by
csrc/elementwise/elementwise_math.h (needs mpmath; prints C++ arrays).

    python scripts/elementwise_fit.py

Mid range  u in [0.5, 2.125]:    erfcx(u) ~ P(u - 1.3125)
Large      u in [2.125, 10.625]: erfcx(u) ~ Q(1/u - 0.28125)
Chebyshev fits (mpmath.chebyfit, 50 digits) of degree 21, rounded to double.
The printed max relative error is mpmath's estimate for the unrounded fit; the
exhaustive script (scripts/elementwise_ulp.py) checks the end result.
"""

import mpmath as mp

mp.mp.dps = 50
N = 22  # coefficients (degree 21)


def erfcx(u):
    return mp.erfc(u) * mp.exp(u * u)


def emit(name, f, lo, hi, fmin):
    poly, err = mp.chebyfit(f, [lo, hi], N, error=True)
    print(f"// {name}: {N} coefficients, highest degree first; "
          f"fit error ~2^{float(mp.log(err / fmin, 2)):.1f} relative")
    print(f"constexpr double {name}[{N}] = {{")
    for c in poly:
        print(f"    {float(c).hex()},")
    print("};")


emit("kErfcxMid", lambda h: erfcx(mp.mpf("1.3125") + h), mp.mpf("-0.8125"), mp.mpf("0.8125"), erfcx(mp.mpf("2.125")))
lo, hi = 1 / mp.mpf("10.625") - mp.mpf("0.28125"), 1 / mp.mpf("2.125") - mp.mpf("0.28125")
emit("kErfcxLarge", lambda d: erfcx(1 / (mp.mpf("0.28125") + d)), lo, hi, erfcx(mp.mpf("10.625")))


def emit_list(name, values, comment):
    print(f"// {comment}")
    print(f"constexpr double {name}[{len(values)}] = {{")
    for v in values:
        print(f"    {float(v).hex()},")
    print("};")


# Taylor coefficients, highest degree first (RN of the exact rationals).
emit_list("kExpTaylor", [1 / mp.factorial(n) for n in range(12, -1, -1)], "exp(r): 1/n!, n = 12..0")
emit_list("kExpm1Taylor", [1 / mp.factorial(n + 1) for n in range(18, -1, -1)], "expm1(y)/y: 1/(n+1)!, n = 18..0")
emit_list("kAtanhSeries", [mp.mpf(1) / (2 * n + 3) for n in range(9, -1, -1)], "(atanh(s)/s - 1)/s^2: 1/(2n+3), n = 9..0")
emit_list("kErfSmall", [2 / mp.sqrt(mp.pi) * (-1) ** n / (mp.factorial(n) * (2 * n + 1)) for n in range(12, -1, -1)],
          "erf(u)/u = (2/sqrt(pi)) sum (-1)^n z^n / (n! (2n+1)), n = 12..0")
for name, v in [("kTwoOverSqrtPi", 2 / mp.sqrt(mp.pi)), ("kInvSqrt2", 1 / mp.sqrt(2)), ("kInvSqrt2Pi", 1 / mp.sqrt(2 * mp.pi)),
                ("kSqrt2", mp.sqrt(2)), ("kLog2e", 1 / mp.log(2)), ("kTwoSqrt2OverPi", 2 * mp.sqrt(2 / mp.pi))]:
    print(f"constexpr double {name} = {float(v).hex()};")
