"""Test data: seeded random matrices and exactly constructed values."""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from typing import Optional, Sequence

import torch

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPES = (F32, BF16, F16)
# (a dtype, b dtype, out_dtype argument): every combination, out_dtype None = promoted
DTYPE_COMBOS = list(itertools.product(DTYPES, DTYPES, (None,) + DTYPES))

# Exponent spread of random data per dtype: wide, but keeping float16's
# products and sums mostly finite.
DEFAULT_SPREAD = {F32: 20, BF16: 20, F16: 3}


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def seed_of(*parts) -> int:
    """A seed derived from a test's parameters, the same in every process
    (Python's hash() of a str changes with PYTHONHASHSEED, so a failure seen
    once could not be rerun on the same data)."""
    return zlib.crc32(repr(parts).encode())


def random_values(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator,
                  spread: Optional[int] = None, scale_exp: int = 0) -> torch.Tensor:
    """Normal samples times 2^e, e uniform in [-spread, spread] per element
    (times 2^scale_exp overall), converted to `dtype`."""
    spread = DEFAULT_SPREAD[dtype] if spread is None else spread
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    e = torch.randint(-spread, spread + 1, tuple(shape), generator=g, dtype=torch.int64)
    return (x * torch.pow(2.0, (e + scale_exp).double())).to(dtype)


def exact_tensor(values, dtype: torch.dtype) -> torch.Tensor:
    """A tensor holding exactly the given Python floats (asserts none is rounded)."""
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    back = t.double()
    src = torch.tensor(values, dtype=torch.float64)
    same = (back == src) | (back.isnan() & src.isnan())
    assert bool(same.all()) and bool((back.signbit() == src.signbit()).all()), \
        f"{values} is not exactly representable in {dtype}"
    return t


PRECISION = {F32: (24, -126), BF16: (8, -126), F16: (11, -14)}


def _representable(x: float, dtype) -> bool:
    return torch.tensor(x, dtype=torch.float64).to(dtype).item() == x


def tie_rows(a_dtype, out_dtype, rows, K, nudge, rng, pairs=1):
    """Rows of `a` (values of a_dtype, shuffled, zero-padded to K) whose plain
    sum is a tie of out_dtype: v + ulp(v)/2 with v a random out_dtype value
    (split into a_dtype-sized chunks when a_dtype is narrower), plus `pairs`
    pairs y, -y that cancel, plus, when nudge is nonzero, a term
    nudge * |ulp(v)/2| (or a larger one if a_dtype cannot hold it) that moves
    the sum just off the tie. (rng: a random.Random.)"""
    p_out, emin_out = PRECISION[out_dtype]
    p_in = PRECISION[a_dtype][0]
    e_range = (-10, 10) if F16 in (a_dtype, out_dtype) else (-40, 40)
    result = []
    while len(result) < rows:
        E = rng.randint(*e_range)
        m = rng.randrange(2 ** (p_out - 1), 2**p_out)
        sign = rng.choice([1.0, -1.0])
        lsb = E - p_out + 1
        chunks = []
        for shift in range(0, p_out, p_in):  # p_in-bit pieces of m, lowest first
            piece = (m >> shift) & ((1 << p_in) - 1)
            if piece:
                chunks.append(sign * math.ldexp(piece, lsb + shift))
        half = sign * math.ldexp(1.0, lsb - 1)
        terms = chunks + [half]
        for _ in range(pairs):
            y = math.ldexp(rng.choice([1.0, -1.0]) * rng.randrange(1, 2**p_in), E + rng.randint(-2, 2) - p_in + 1)
            terms += [y, -y]
        if nudge:  # the first of these sizes that a_dtype can hold
            sizes = [t for t in (abs(nudge), 2.0**-12, 2.0**-4, 0.5) if _representable(abs(half) * t, a_dtype)]
            terms.append(math.copysign(abs(half) * sizes[0], nudge) if sizes else math.nan)
        if not all(_representable(t, a_dtype) for t in terms) or not (emin_out <= E):
            continue
        assert len(terms) <= K
        terms += [0.0] * (K - len(terms))
        rng.shuffle(terms)
        result.append(terms)
    return result


# ----------------------------------------------------------------------------
# Reductions (carbon.sum / carbon.mean): dims, layouts, adversarial rows.

DTYPE_PAIRS = list(itertools.product(DTYPES, (None,) + DTYPES))  # (input dtype, dtype argument)


def dim_spellings(ndim: int):
    """Every subset of the dims of an ndim-D tensor, each spelled several
    ways: a tuple of nonnegative dims, a list of negative dims (reversed), an
    int for one dim; plus None and []."""
    out = [None, []]
    for r in range(1, ndim + 1):
        for combo in itertools.combinations(range(ndim), r):
            out.append(tuple(combo))
            out.append([d - ndim for d in reversed(combo)])
            if r == 1:
                out.append(combo[0])
                out.append(combo[0] - ndim)
    return out


def normalized_dims(ndim: int, dim) -> tuple:
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(d % max(ndim, 1) for d in dims if ndim))


def to_rows(x: torch.Tensor, dim) -> torch.Tensor:
    """x rearranged as (outputs, reduced elements), a contiguous copy."""
    dims = normalized_dims(x.dim(), dim)
    kept = [d for d in range(x.dim()) if d not in dims]
    n = math.prod(x.shape[d] for d in dims)
    return x.permute(kept + list(dims)).reshape(-1, n).contiguous() if x.dim() else x.reshape(1, 1)


def from_rows(rows: torch.Tensor, shape: Sequence[int], dim) -> torch.Tensor:
    """The inverse of to_rows: a contiguous tensor of `shape`."""
    shape = tuple(shape)
    if not shape:
        return rows.reshape(())
    dims = normalized_dims(len(shape), dim)
    kept = [d for d in range(len(shape)) if d not in dims]
    perm = kept + list(dims)
    y = rows.reshape([shape[d] for d in perm])
    inverse = [perm.index(d) for d in range(len(shape))]
    return y.permute(inverse).contiguous()


def shuffle_reduced(x: torch.Tensor, dim, g: torch.Generator) -> torch.Tensor:
    """x with the elements of every reduction permuted (a different random
    permutation for each output element)."""
    rows = to_rows(x, dim)
    if rows.numel() == 0:
        return x.clone()
    idx = torch.rand(rows.shape, generator=g).argsort(dim=1)
    return from_rows(rows.gather(1, idx), x.shape, dim)


def reduction_values(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator, dim=None,
                     spread: Optional[int] = None) -> torch.Tensor:
    """Random values (see random_values) in which every third reduction has
    exactly cancelling halves plus one small term, so that sums much smaller
    than the terms (and exact zeros) occur."""
    x = random_values(shape, dtype, g, spread=spread)
    if x.dim() == 0 or x.numel() == 0:
        return x
    rows = to_rows(x, dim)
    n = rows.shape[1]
    if n >= 3:
        half = n // 2
        rows[::3, half : 2 * half] = -rows[::3, :half]
        if n % 2 == 0:
            rows[::6, 0] = rows[::6, 0] * 2.0**-12  # breaks the exact zero in half of them
    return from_rows(rows, shape, dim)


def finite_bit_patterns(count: int, rng, exp_lo: int = 0, exp_hi: int = 254) -> list:
    """Random float32 values whose biased exponent field is uniform in
    [exp_lo, exp_hi] (0 = subnormal), random significand and sign."""
    out = []
    for _ in range(count):
        bits = (rng.getrandbits(1) << 31) | (rng.randint(exp_lo, exp_hi) << 23) | rng.getrandbits(23)
        out.append(struct.unpack("<f", struct.pack("<I", bits))[0])
    return out


def chunks_of(value_num: int, lsb: int, in_dtype: torch.dtype, sign: float = 1.0) -> list:
    """The integer value_num * 2^lsb split into pieces of in_dtype's precision
    (lowest first), each exactly representable (asserted by the caller)."""
    p_in = PRECISION[in_dtype][0]
    pieces, shift = [], 0
    while value_num >> shift:
        piece = (value_num >> shift) & ((1 << p_in) - 1)
        if piece:
            pieces.append(sign * math.ldexp(piece, lsb + shift))
        shift += p_in
    return pieces


MEAN_E_RANGE = {F32: (-40, 40), BF16: (-40, 40), F16: (-3, 6)}


def _nonzero_representable(v: float, dtype) -> bool:
    return v != 0 and _representable(v, dtype)


def midpoint_mean_rows(in_dtype, out_dtype, count, n, eps_rel_exp, rng, toward, pairs=1, max_tries=100_000):
    """Rows of n values of in_dtype whose exact MEAN is M + eps/n, M a random
    midpoint of out_dtype (exactly halfway between two adjacent values): the
    row holds pieces summing to n*M, one term eps = +-2^(exponent of M +
    eps_rel_exp), `pairs` cancelling pairs and zeros up to n, shuffled. eps
    points `toward` the neighbour with the odd significand ("odd"), the even
    one ("even"), or is left out ("tie": the mean is exactly M).
    Returns (rows, expected values): each expected value is the correctly
    rounded mean (a Python float, exact), by construction. Fewer than `count`
    rows when max_tries runs out (n too small for the pieces)."""
    p_out = PRECISION[out_dtype][0]
    p_in = PRECISION[in_dtype][0]
    lo, hi = MEAN_E_RANGE[F16 if F16 in (in_dtype, out_dtype) else out_dtype]
    rows, expected = [], []
    for _ in range(max_tries):
        if len(rows) == count:
            break
        E = rng.randint(lo, hi)
        m = rng.randrange(2 ** (p_out - 1), 2**p_out)  # M = (m + 1/2) * 2^lsb
        sign = rng.choice([1.0, -1.0])
        lsb = E - p_out + 1
        terms = chunks_of(n * (2 * m + 1), lsb - 1, in_dtype, sign)
        up = (m % 2 == 0) if toward == "odd" else (m % 2 == 1)  # toward the larger magnitude?
        if toward == "tie":
            target = m + (m % 2)  # ties to even
        else:
            terms.append(sign * (1.0 if up else -1.0) * math.ldexp(1.0, E + eps_rel_exp))
            target = m + 1 if up else m
        for _ in range(pairs):
            y = math.ldexp(rng.choice([1.0, -1.0]) * rng.randrange(1, 2**p_in), E + rng.randint(-3, 3) - p_in)
            terms += [y, -y]
        if len(terms) > n or not all(_nonzero_representable(t, in_dtype) for t in terms):
            continue
        terms += [0.0] * (n - len(terms))
        rng.shuffle(terms)
        rows.append(terms)
        expected.append(sign * math.ldexp(target, lsb))
    return rows, expected


def softmax_tie_rows(dtype):
    """Rows whose e_j sum exactly to a float32 tie: [0, -k_1 2^-24, ..., -k_(n-1) 2^-24, (-100 nudges)],
    padded with -inf: tier 1 cannot decide S (on a GPU thread 0 runs the exact tiers)."""
    rows = []
    for n in (2, 3, 5, 17, 100, 1000):
        a = math.floor(math.log2(n - 2.0**-10))
        for odd in (1, 3, 5):
            K = 2**a * odd
            if K > 255 * (n - 1):
                continue
            ks = [K // (n - 1) + (1 if i < K % (n - 1) else 0) for i in range(n - 1)]
            for tiny in (0, 1, 5):
                rows.append([0.0] + [-k * 2.0**-24 for k in ks] + [-100.0] * tiny)
    width = max(map(len, rows))
    return exact_tensor([r + [-math.inf] * (width - len(r)) for r in rows], dtype)
