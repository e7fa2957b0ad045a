"""An exact oracle for Carbon's correctly rounded matmul family.

Written from the contract alone, with Python integers: it never imports
carbon. Every input value of float32 / bfloat16 / float16 is an integer
multiple of 2^-149, so scaled by 2^SCALE (SCALE = 150) it is an exact Python
int; a product of two such values is an exact int at scale 2^(2*SCALE). The
whole sum is formed exactly and rounded ONCE, to nearest with ties to even,
by integer arithmetic (subnormals kept, overflow to +-inf).

Special values (the contract's rules):
  * a NaN term, an inf*0 product, or both a +inf and a -inf term -> NaN, with
    the canonical bits of the output format;
  * otherwise any +-inf term -> that inf;
  * an exact zero sum is -0 iff there is at least one term and EVERY term is
    -0 (a product's sign is the XOR of its factors' signs); otherwise +0;
  * a nonzero exact sum that rounds to zero keeps its sign (IEEE).

Expected results are returned as tensors of BITS (int32 for float32, int16
for the 16-bit formats), to be compared bit for bit, NaN bits included.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Iterator, Optional, Sequence

import torch

SCALE = 150  # every supported input value times 2^SCALE is an integer


@dataclass(frozen=True)
class Format:
    name: str
    precision: int  # significand bits, hidden bit included
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number (also the exponent bias)
    total_bits: int
    nan_bits: int  # the canonical NaN Carbon writes
    bits_dtype: torch.dtype

    @property
    def quantum_exp(self) -> int:  # exponent of the smallest subnormal
        return self.emin - self.precision + 1

    @property
    def sign_bit(self) -> int:
        return 1 << (self.total_bits - 1)

    @property
    def inf_bits(self) -> int:
        return ((1 << (self.total_bits - self.precision)) - 1) << (self.precision - 1)


FORMATS = {
    torch.float32: Format("float32", 24, -126, 127, 32, 0x7FC00000, torch.int32),
    torch.bfloat16: Format("bfloat16", 8, -126, 127, 16, 0x7FC0, torch.int16),
    torch.float16: Format("float16", 11, -14, 15, 16, 0x7E00, torch.int16),
}
DTYPES = tuple(FORMATS)


# float64: an output format only (carbon's float64 functions and square root); not among the input DTYPES.
FLOAT64 = Format("float64", 53, -1022, 1023, 64, 0x7FF8000000000000, torch.int64)


def fmt_of(dtype: torch.dtype) -> Format:
    if dtype == torch.float64:
        return FLOAT64
    if dtype not in FORMATS:
        raise TypeError(f"oracle: unsupported dtype {dtype}")
    return FORMATS[dtype]


# ----------------------------------------------------------------------------
# Rounding a nonnegative rational n / d into a format, by integers only.


def _round_rational(n: int, d: int, negative: bool, f: Format) -> int:
    """Bits of RN_f((-1)^negative * n / d) for n >= 0, d > 0."""
    sign = f.sign_bit if negative else 0
    if n == 0:
        return sign
    # e = floor(log2(n / d))
    e = n.bit_length() - d.bit_length()
    if (n << -e if e < 0 else n) < (d << e if e > 0 else d):
        e -= 1
    q = max(e - f.precision + 1, f.quantum_exp)  # exponent of the result's last bit
    num, den = (n << -q, d) if q < 0 else (n, d << q)
    kept, rem = divmod(num, den)  # value / 2^q = kept + rem / den
    if 2 * rem > den or (2 * rem == den and kept & 1):
        kept += 1
    if kept == 0:
        return sign  # underflow to a signed zero
    if kept.bit_length() > f.precision:  # rounding carried into the next binade
        kept >>= 1
        q += 1
    if kept.bit_length() < f.precision:  # subnormal (only possible at the lowest q)
        assert q == f.quantum_exp
        return sign | kept
    exponent = q + f.precision - 1
    if exponent > f.emax:
        return sign | f.inf_bits
    biased = exponent + f.emax
    return sign | (biased << (f.precision - 1)) | (kept - (1 << (f.precision - 1)))


def round_bits(x, dtype: torch.dtype) -> int:
    """Bits (as an unsigned int) of RN_dtype(x) for an exact x: an int, a
    Fraction or a Python float (whose sign of zero, inf and NaN are kept)."""
    f = fmt_of(dtype)
    if isinstance(x, float):
        if math.isnan(x):
            return f.nan_bits
        if math.isinf(x):
            return (f.sign_bit if x < 0 else 0) | f.inf_bits
        if x == 0:
            return f.sign_bit if math.copysign(1.0, x) < 0 else 0
        x = Fraction(x)
    x = Fraction(x)
    return _round_rational(abs(x.numerator), x.denominator, x < 0, f)


def sqrt_bits(x, dtype: torch.dtype) -> int:
    """Bits of RN_dtype(sqrt(x)) for an exact x >= 0 (an int, a Fraction or a finite float): an integer
    square root with a sticky bit, rounded once. sqrt(n / d) = sqrt(n d) / d, scaled by 4^j so that the root
    has >= 80 bits: no rounding boundary of the format lies strictly between root and root + 1."""
    q = Fraction(x)
    if q < 0:
        raise ValueError("oracle.sqrt_bits: negative argument")
    m = q.numerator * q.denominator
    j = max(0, 80 - m.bit_length() // 2)
    big = m << (2 * j)
    root = math.isqrt(big)
    sticky = 1 if root * root != big else 0
    return _round_rational(2 * root + sticky, q.denominator << (j + 1), False, fmt_of(dtype))


def round_value(x, dtype: torch.dtype) -> Fraction:
    """RN_dtype(x) of an exact x as an exact Fraction (for oracles that round at every step; finite results)."""
    return Fraction(bits_to_float(round_bits(x, dtype), dtype))


def bits_to_float(bits: int, dtype: torch.dtype) -> float:
    """The value of a bit pattern of the format (decoded with integers)."""
    f = fmt_of(dtype)
    bits &= (1 << f.total_bits) - 1
    negative = bool(bits & f.sign_bit)
    field = (bits >> (f.precision - 1)) & ((1 << (f.total_bits - f.precision)) - 1)
    frac = bits & ((1 << (f.precision - 1)) - 1)
    if field == (1 << (f.total_bits - f.precision)) - 1:
        v = math.nan if frac else math.inf
    elif field == 0:
        v = math.ldexp(frac, f.quantum_exp)
    else:
        v = math.ldexp(frac + (1 << (f.precision - 1)), field - f.emax - f.precision + 1)
    return -v if negative else v


def _signed(bits: int, f: Format) -> int:
    """An unsigned pattern as the signed integer a bits tensor stores."""
    return bits - (1 << f.total_bits) if bits & f.sign_bit else bits


def bits_tensor(bits: Sequence, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of the given (possibly nested) unsigned patterns, typed int32 / int16."""
    f = fmt_of(dtype)

    def conv(x):
        return [conv(y) for y in x] if isinstance(x, (list, tuple)) else _signed(x, f)

    return torch.tensor(conv(list(bits)) if isinstance(bits, (list, tuple)) else _signed(bits, f), dtype=f.bits_dtype)


# ----------------------------------------------------------------------------
# Exact sums of terms, with the special-value rules.


def _scaled(v: float) -> int:
    """v * 2^SCALE as an exact integer (v finite, a value of a supported format)."""
    n, d = v.as_integer_ratio()
    assert (1 << SCALE) % d == 0, f"{v!r} is not a value of float32/bfloat16/float16"
    return n * ((1 << SCALE) // d)


def _is_neg(v: float) -> bool:
    return math.copysign(1.0, v) < 0


def exact_sum_bits(terms: Iterable[tuple], dtype: torch.dtype) -> int:
    """Bits of RN_dtype of the exact sum of `terms`. Each term is a tuple of one
    factor (a plain value, e.g. a bias) or two factors (a product); factors
    are Python floats holding values of the supported formats."""
    f = fmt_of(dtype)
    total = 0
    nan = pos_inf = neg_inf = False
    any_term = False
    all_neg_zero = True
    for term in terms:
        any_term = True
        assert len(term) in (1, 2)
        negative = sum(_is_neg(x) for x in term) % 2 == 1
        if any(math.isnan(x) for x in term):
            nan = True
        elif any(math.isinf(x) for x in term):
            if any(x == 0 for x in term):
                nan = True  # inf * 0
            elif negative:
                neg_inf = True
            else:
                pos_inf = True
        elif any(x == 0 for x in term):
            all_neg_zero = all_neg_zero and negative
            continue
        else:
            all_neg_zero = False
            value = 1
            for x in term:
                value *= _scaled(x)
            total += value << (SCALE * (2 - len(term)))  # everything at scale 2^(2*SCALE)
    if nan or (pos_inf and neg_inf):
        return f.nan_bits
    if pos_inf:
        return f.inf_bits
    if neg_inf:
        return f.sign_bit | f.inf_bits
    if total == 0:
        return f.sign_bit if (any_term and all_neg_zero) else 0
    return _round_rational(abs(total), 1 << (2 * SCALE), total < 0, f)


def _floats(t: torch.Tensor) -> list:
    assert t.dtype in FORMATS, f"oracle: unsupported input dtype {t.dtype}"
    return t.detach().cpu().double().tolist()


class _Vectors:
    """Rows of a matrix prepared for exact dot products: floats, scaled ints
    and whether the row holds a non-finite value."""

    def __init__(self, rows: list):
        self.floats = rows
        self.special = [any(not math.isfinite(x) for x in r) for r in rows]
        self.ints = [[_scaled(x) if math.isfinite(x) else 0 for x in r] for r in rows]


def _matmul_2d(a: list, bt: list, bias: Optional[list], out_dtype: torch.dtype) -> list:
    """Unsigned bits of RN(bias + a @ bt^T) for row lists a (M x K), bt (N x K),
    bias an M x N list of floats or None."""
    f = fmt_of(out_dtype)
    A, B = _Vectors(a), _Vectors(bt)
    one = 1 << (2 * SCALE)
    out = []
    for i in range(len(a)):
        row = []
        for j in range(len(bt)):
            beta = None if bias is None else bias[i][j]
            special = A.special[i] or B.special[j] or (beta is not None and not math.isfinite(beta))
            total = 0 if special else sum(map(operator.mul, A.ints[i], B.ints[j]))
            if beta is not None and not special:
                total += _scaled(beta) << SCALE
            if special or total == 0:  # the special-value and signed-zero rules
                terms = list(zip(A.floats[i], B.floats[j]))
                if beta is not None:
                    terms.append((beta,))
                row.append(exact_sum_bits(terms, out_dtype))
                continue
            row.append(_round_rational(abs(total), one, total < 0, f))
        out.append(row)
    return out


def default_out_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    return out_dtype if out_dtype is not None else torch.promote_types(a.dtype, b.dtype)


def mm_bits(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
            out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of RN(bias + a @ b) for a (M, K), b (K, N); bias broadcast to (M, N)."""
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]
    out_dtype = default_out_dtype(a, b, out_dtype)
    M, N = a.shape[0], b.shape[1]
    bias_rows = None if bias is None else _floats(torch.broadcast_to(bias, (M, N)))
    bits = _matmul_2d(_floats(a), _floats(b.t()), bias_rows, out_dtype)
    f = fmt_of(out_dtype)
    return torch.tensor([[_signed(x, f) for x in r] for r in bits], dtype=f.bits_dtype).reshape(M, N)


def bmm_bits(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
             out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of RN(bias + a[i] @ b[i]) for a (B, M, K), b (B, K, N)."""
    assert a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]
    out_dtype = default_out_dtype(a, b, out_dtype)
    Bn, M, N = a.shape[0], a.shape[1], b.shape[2]
    full_bias = None if bias is None else torch.broadcast_to(bias, (Bn, M, N))
    f = fmt_of(out_dtype)
    out = torch.empty((Bn, M, N), dtype=f.bits_dtype)
    for i in range(Bn):
        out[i] = mm_bits(a[i], b[i], None if full_bias is None else full_bias[i], out_dtype)
    return out


def linear_bits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of RN(x @ weight^T + bias) for x (..., K), weight (N, K)."""
    rows = x.reshape(-1, x.shape[-1])
    out = mm_bits(rows, weight.t(), bias, out_dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def sum_to_shape_bits(grad: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Expected bits of a broadcast operand's gradient: for each element of
    `shape`, RN_dtype of the exact sum of every element of `grad` that the
    broadcast of `shape` to grad.shape maps onto it."""
    shape = tuple(shape)
    lead = grad.dim() - len(shape)
    assert lead >= 0
    g = _floats(grad)
    groups = {idx: [] for idx in itertools.product(*(range(s) for s in shape))}
    for gidx in itertools.product(*(range(s) for s in grad.shape)):
        target = tuple(0 if shape[d] == 1 else gidx[lead + d] for d in range(len(shape)))
        value = g
        for i in gidx:
            value = value[i]
        groups[target].append((value,))
    f = fmt_of(dtype)
    flat = [_signed(exact_sum_bits(groups[idx], dtype), f) for idx in groups]
    return torch.tensor(flat, dtype=f.bits_dtype).reshape(shape)


def is_midpoint(x, dtype: torch.dtype) -> bool:
    """Whether the exact value x lies exactly halfway between two adjacent
    values of the format (a tie), ignoring overflow."""
    x = abs(Fraction(x))
    if x == 0:
        return False
    f = fmt_of(dtype)
    n, d = x.numerator, x.denominator
    e = n.bit_length() - d.bit_length()
    if (n << -e if e < 0 else n) < (d << e if e > 0 else d):
        e -= 1
    q = max(e - f.precision + 1, f.quantum_exp)
    return (x / Fraction(2) ** q - Fraction(1, 2)).denominator == 1


# ----------------------------------------------------------------------------
# Comparison.


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float32 / bfloat16 / float16 (or float64) tensor (on the CPU)."""
    return t.detach().cpu().contiguous().view(fmt_of(t.dtype).bits_dtype)


def assert_bits_equal(actual: torch.Tensor, expected_bits: torch.Tensor, context: str = "",
                      dtype: Optional[torch.dtype] = None, show: int = 6) -> None:
    """Assert that `actual` has exactly the expected bits (NaN bits included)."""
    prefix = f"{context}: " if context else ""
    if dtype is not None:
        assert actual.dtype == dtype, f"{prefix}dtype {actual.dtype}, expected {dtype}"
    f = fmt_of(actual.dtype)
    assert expected_bits.dtype == f.bits_dtype, f"{prefix}expected bits of dtype {expected_bits.dtype} for a {actual.dtype} result"
    assert tuple(actual.shape) == tuple(expected_bits.shape), (
        f"{prefix}shape {tuple(actual.shape)}, expected {tuple(expected_bits.shape)}")
    got = as_bits(actual)
    expected = expected_bits.cpu()
    bad = (got != expected).nonzero().tolist()
    if not bad:
        return
    mask = (1 << f.total_bits) - 1
    lines = [f"{prefix}{len(bad)} of {got.numel()} {f.name} outputs differ from the correctly rounded result:"]
    for idx in bad[:show]:
        e, g = int(expected[tuple(idx)]) & mask, int(got[tuple(idx)]) & mask
        width = f.total_bits // 4
        lines.append(
            f"  at {tuple(idx)}: expected {bits_to_float(e, actual.dtype)!r} (0x{e:0{width}X}), "
            f"got {bits_to_float(g, actual.dtype)!r} (0x{g:0{width}X})")
    raise AssertionError("\n".join(lines))


# ----------------------------------------------------------------------------
# Reductions: sum and mean over some dimensions (torch.sum / torch.mean shape
# semantics), each output the exact sum (or exact sum / n) rounded ONCE.


def reduced_dims(ndim: int, dim) -> tuple:
    """The reduced dimensions, normalized and sorted: `dim` None, an int, or a
    list/tuple of ints (negative allowed); None or an empty list = all dims.
    A 0-dim tensor accepts dim 0 / -1 (its one element) and reduces nothing
    away (the result stays 0-dim)."""
    if dim is None:
        dims = list(range(ndim))
    elif isinstance(dim, int):
        dims = [dim]
    else:
        dims = list(dim)
        if not dims:
            dims = list(range(ndim))
    rank = max(ndim, 1)
    out = []
    for d in dims:
        assert -rank <= d < rank, f"oracle: dim {d} out of range for {ndim}-D"
        out.append(d % rank)
    assert len(set(out)) == len(out), f"oracle: repeated dim in {dim}"
    return tuple(sorted(d for d in out if d < ndim))


def reduced_shape(shape: Sequence[int], dim, keepdim: bool) -> tuple:
    dims = reduced_dims(len(shape), dim)
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in dims)


def reduction_rows(x: torch.Tensor, dim, keepdim: bool = False):
    """(output shape, rows): rows[i] lists (as Python floats, exact) the
    elements reduced into the i-th output element in row-major order of the
    output. Independent of carbon: a permute + reshape of the float64 copy."""
    assert x.dtype in FORMATS, f"oracle: unsupported input dtype {x.dtype}"
    dims = reduced_dims(x.dim(), dim)
    kept = [d for d in range(x.dim()) if d not in dims]
    y = x.detach().cpu().double()
    if x.dim():
        y = y.permute(kept + list(dims))
    n = math.prod(x.shape[d] for d in dims)
    k = math.prod(x.shape[d] for d in kept)
    rows = y.reshape(k, n).tolist()
    return reduced_shape(tuple(x.shape), dim, keepdim), rows


@dataclass
class RowSum:
    """The exact sum of a list of values: `total` = sum * 2^SCALE (an int)
    and the facts the special-value / signed-zero rules need."""
    total: int
    n: int
    nan: bool
    pos_inf: bool
    neg_inf: bool
    all_neg_zero: bool  # every element is -0 (vacuously true for n = 0)


def running_sums(values: Sequence[float]) -> Iterator[RowSum]:
    """row_sum of each prefix values[:1], values[:2], ...: one running exact sum."""
    total, nan, pos_inf, neg_inf, all_neg_zero = 0, False, False, False, True
    for n, v in enumerate(values, 1):
        if v != v:
            nan = True
        elif v == math.inf:
            pos_inf = True
        elif v == -math.inf:
            neg_inf = True
        elif v == 0:
            all_neg_zero = all_neg_zero and _is_neg(v)
        else:
            all_neg_zero = False
            total += _scaled(v)
        yield RowSum(total, n, nan, pos_inf, neg_inf, all_neg_zero)


def row_sum(values: Sequence[float]) -> RowSum:
    s = RowSum(0, 0, False, False, False, True)
    for s in running_sums(values):
        pass
    return s


def _special_bits(s: RowSum, f: Format) -> Optional[int]:
    if s.nan or (s.pos_inf and s.neg_inf):
        return f.nan_bits
    if s.pos_inf:
        return f.inf_bits
    if s.neg_inf:
        return f.sign_bit | f.inf_bits
    return None


def row_quotient_bits(values: Sequence[float], divisor: int, dtype: torch.dtype) -> int:
    """Unsigned bits of RN_dtype(exact sum of values / divisor): ONE rounding of
    the exact quotient, with the rules of the contract. divisor 0 -> NaN;
    inf / divisor = inf; an exact zero sum -> the sum's zero (-0 only if every
    term is -0)."""
    f = fmt_of(dtype)
    if divisor == 0:
        return f.nan_bits
    return _quotient_bits(row_sum(values), divisor, f)


def _quotient_bits(s: RowSum, divisor: int, f: Format) -> int:
    special = _special_bits(s, f)
    if special is not None:
        return special
    if s.total == 0:
        return f.sign_bit if (s.n > 0 and s.all_neg_zero) else 0
    return _round_rational(abs(s.total), divisor << SCALE, s.total < 0, f)


def prefix_sum_bits(values: Sequence[float], dtype: torch.dtype) -> list:
    """Unsigned bits of RN_dtype(values[0] + ... + values[i]) for every i (cumsum's contract): row_sum_bits of
    each prefix, kept as one running exact sum instead of n sums."""
    f = fmt_of(dtype)
    return [_quotient_bits(s, 1, f) for s in running_sums(values)]


def row_sum_bits(values: Sequence[float], dtype: torch.dtype) -> int:
    """Unsigned bits of RN_dtype(exact sum of values)."""
    return row_quotient_bits(values, 1, dtype)


def row_mean_bits(values: Sequence[float], dtype: torch.dtype) -> int:
    """Unsigned bits of RN_dtype(exact sum / n); n = 0 -> NaN."""
    return row_quotient_bits(values, len(values), dtype)


def _reduce_bits(x: torch.Tensor, dim, keepdim: bool, dtype: Optional[torch.dtype], row_fn) -> torch.Tensor:
    out_dtype = x.dtype if dtype is None else dtype
    f = fmt_of(out_dtype)
    shape, rows = reduction_rows(x, dim, keepdim)
    flat = [_signed(row_fn(r, out_dtype), f) for r in rows]
    return torch.tensor(flat, dtype=f.bits_dtype).reshape(shape)


def sum_bits(x: torch.Tensor, dim=None, keepdim: bool = False, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of carbon.sum(x, dim, keepdim, dtype=dtype)."""
    return _reduce_bits(x, dim, keepdim, dtype, row_sum_bits)


def mean_bits(x: torch.Tensor, dim=None, keepdim: bool = False, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Expected bits of carbon.mean(x, dim, keepdim, dtype=dtype)."""
    return _reduce_bits(x, dim, keepdim, dtype, row_mean_bits)


def exact_value(values: Sequence[float]) -> Fraction:
    """The exact sum of finite values as a Fraction."""
    return Fraction(row_sum(values).total, 1 << SCALE)


# ----------------------------------------------------------------------------
# Elementwise rounding (carbon.round_to).


def round_to_bits(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Expected bits of carbon.round_to(x, dtype): RN_dtype of each value
    (NaN -> the canonical NaN, infinities and signed zeros kept)."""
    f = fmt_of(dtype)
    values = _floats(x.reshape(-1))
    cache: dict = {}
    flat = []
    for v in values:
        key = (v, math.copysign(1.0, v)) if v == v else "nan"
        b = cache.get(key)
        if b is None:
            b = cache[key] = _signed(round_bits(v, dtype), f)
        flat.append(b)
    return torch.tensor(flat, dtype=f.bits_dtype).reshape(x.shape)


def reduce_grad_bits(grad: torch.Tensor, x_shape: Sequence[int], dim, keepdim: bool, x_dtype: torch.dtype,
                     divide_by_n: bool) -> torch.Tensor:
    """Expected bits of x.grad for y = sum(x, dim, keepdim) (divide_by_n False:
    RN_{x.dtype}(g) broadcast back) or y = mean(...) (divide_by_n True:
    RN_{x.dtype}(g / n), the exact quotient rounded once; inf / n = inf,
    +-0 / n = +-0, NaN -> the canonical NaN), g the incoming gradient."""
    x_shape = tuple(x_shape)
    dims = reduced_dims(len(x_shape), dim)
    n = math.prod(x_shape[d] for d in dims)
    keep_shape = reduced_shape(x_shape, dim, True)
    f = fmt_of(x_dtype)
    if n == 0:  # x has no elements
        return torch.zeros(x_shape, dtype=f.bits_dtype)
    values = _floats(grad.reshape(keep_shape).reshape(-1))
    flat = []
    for v in values:
        if divide_by_n and math.isfinite(v) and v != 0:
            flat.append(_signed(round_bits(Fraction(v) / n, x_dtype), f))
        else:
            flat.append(_signed(round_bits(v, x_dtype), f))
    bits = torch.tensor(flat, dtype=f.bits_dtype).reshape(keep_shape)
    return bits.expand(x_shape).contiguous()
