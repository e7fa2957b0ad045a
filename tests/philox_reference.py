"""Independent reference for carbon's random numbers (docs/contract.md §10):
Philox4x32-10 in Python integers, written from the paper's description
(Salmon et al., SC'11) and checked against Random123's known-answer vectors,
and the draw definitions on top of it. Normals are checked against a
high-precision (mpmath) evaluation of Box-Muller with the same uniforms."""

from __future__ import annotations

from fractions import Fraction
from typing import List, Tuple

import mpmath

MASK32 = 0xFFFFFFFF
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: int, b: int) -> Tuple[int, int]:
    product = a * b
    return product >> 32, product & MASK32


def philox4x32_10(counter: Tuple[int, int, int, int], key: Tuple[int, int]) -> Tuple[int, int, int, int]:
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for r in range(10):
        hi0, lo0 = _mulhilo(M0, x0)
        hi1, lo1 = _mulhilo(M1, x2)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return x0, x1, x2, x3


def block(seed: int, offset: int, index: int) -> Tuple[int, int, int, int]:
    """Block `index` of the draw at (seed, offset); seed and offset as uint64."""
    seed %= 1 << 64
    counter = (index & MASK32, index >> 32 & MASK32, offset & MASK32, offset >> 32 & MASK32)
    return philox4x32_10(counter, (seed & MASK32, seed >> 32))


def words(seed: int, offset: int, n: int) -> List[int]:
    """The 32-bit words of element i = 0..n-1 for uniform/bernoulli/dropout."""
    out: List[int] = []
    for b in range((n + 3) // 4):
        out.extend(block(seed, offset, b))
    return out[:n]


def uniform01(word: int) -> Fraction:
    return Fraction(word >> 8, 1 << 24)


def dropout_bits(x, p: float, seed: int, offset: int) -> List[int]:
    """Bit patterns of dropout (contract §10) of tensor x at the draw (seed,
    offset), element i its row-major index: kept when uniform01(word i) >= p,
    as RN(x_i / (1 - p)) (binary64 division, one rounding to x's dtype), +0
    otherwise."""
    from oracle import round_bits  # the exact rounding (tests/oracle.py)

    flat = x.detach().cpu().reshape(-1).tolist()
    return [round_bits(v / (1.0 - p), x.dtype) if uniform01(w) >= Fraction(p) else 0
            for v, w in zip(flat, words(seed, offset, len(flat)))]


def normal_uniforms(seed: int, offset: int, i: int) -> Tuple[Fraction, Fraction]:
    """(u1, u2) of normal element i: u1 in (0, 1], u2 in [0, 1)."""
    w = block(seed, offset, i // 2)
    w0, w1 = w[2 * (i % 2)], w[2 * (i % 2) + 1]
    return Fraction((w0 >> 8) + 1, 1 << 24), Fraction(w1 >> 8, 1 << 24)


def box_muller(u1: Fraction, u2: Fraction, prec: int = 120) -> mpmath.mpf:
    """sqrt(-2 ln u1) cos(2 pi u2) to `prec` bits."""
    with mpmath.workprec(prec):
        a = mpmath.mpf(u1.numerator) / u1.denominator
        b = mpmath.mpf(u2.numerator) / u2.denominator
        return mpmath.sqrt(-2 * mpmath.log(a)) * mpmath.cos(2 * mpmath.pi * b)


def trunc_normal_uniforms(seed: int, offset: int, i: int, attempt: int) -> Tuple[Fraction, Fraction]:
    w = block(seed, offset, i * 64 + attempt)
    return Fraction((w[0] >> 8) + 1, 1 << 24), Fraction(w[1] >> 8, 1 << 24)


# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key, output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
