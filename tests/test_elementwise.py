"""Carbon's elementwise math against an independent high-precision reference
(tests/elementwise_ref.py, mpmath at 256 bits): every result must be the
correctly rounded value of the function (or, within 2^-41 relative of a
rounding midpoint, its neighbour), for special values, thresholds of
overflow / underflow / saturation, subnormals, random bit patterns over all
exponents and hypothesis-drawn values; in float32, bfloat16 and float16.
Gradients: RN(g * f'(x)) against f' evaluated independently."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import carbon
from data import seed_of
from elementwise_ref import FORWARD, expected_bits, grad_expected_bits
from oracle import as_bits, bits_to_float, fmt_of

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def call(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "gelu_tanh":
        return carbon.gelu(x, approximate="tanh")
    return getattr(carbon, name)(x)


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def from_bits(bits, dtype) -> torch.Tensor:
    f = fmt_of(dtype)
    signed = [b - (1 << f.total_bits) if b & f.sign_bit else b for b in bits]
    return torch.tensor(signed, dtype=f.bits_dtype).view(dtype)


# Thresholds and branch points of the functions (float32 values near them are
# added with their neighbours).
POINTS = [
    0.0, 1.0, 0.5, 0.55, 0.7071067811865476, 1.4142135623730951, 2.125, 3.0052038200428273, 10.625,
    15.026019100214136, 88.72283935546875, 88.7228317, 89.0, 103.97208, 103.279, 87.33654, 104.0, 150.0,
    3.9192059, 3.92, 4.0, 6.0, 9.010913, 9.02, 14.5, 16.0, 20.0, 36.0, 40.0, 1e10, 1e30, 3.4028234663852886e38,
    1.1754943508222875e-38, 1e-10, 2.0**-60, 2.0**-40, 0.75179, 1.2785, 2.0**-24, 2.0**-25,
    # sin / cos: the reduction's branch at pi/4, multiples of pi/2, the float32 closest to a multiple of pi/2
    0.7853981633974483, 1.5707963267948966, 3.141592653589793, 4.71238898038469, 6.283185307179586, 2.0**25,
    16367173 * 2.0**72, 1e20,
]


def special_bits_f32():
    out = {0x00000001, 0x00000002, 0x00000003, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F800000, 0x7FC00000,
           0x7FA00001, 0x3F800000, 0x3F7FFFFF, 0x3F800001}
    for p in POINTS:
        b = struct.unpack("<I", struct.pack("<f", p))[0] if abs(p) < 3.5e38 else 0x7F7FFFFF
        for d in (-2, -1, 0, 1, 2):
            if 0 <= b + d < 0x7F800000:
                out.add(b + d)
    return sorted(out | {b | 0x80000000 for b in out})


def random_bits(dtype, count, seed):
    f = fmt_of(dtype)
    rng = random.Random(seed)
    return [rng.getrandbits(f.total_bits) for _ in range(count)]


def special_bits_16(dtype):
    f = fmt_of(dtype)
    inf = f.inf_bits
    out = {0, 1, 2, 3, (1 << (f.precision - 1)) - 1, 1 << (f.precision - 1), inf - 1, inf, f.nan_bits}
    for p in POINTS[:30]:
        t = torch.tensor([p], dtype=torch.float64).to(dtype)
        b = int(t.view(f.bits_dtype).item()) & ((1 << f.total_bits) - 1)
        for d in (-1, 0, 1):
            if 0 <= b + d < inf:
                out.add(b + d)
    return sorted(out | {b | f.sign_bit for b in out})


def check(name: str, dtype: torch.dtype, bits_list) -> None:
    x = from_bits(bits_list, dtype)
    got = as_bits(call(name, x)).tolist()
    mask = (1 << fmt_of(dtype).total_bits) - 1
    bad = []
    for b, g in zip(bits_list, got):
        xv = bits_to_float(b, dtype)
        want = expected_bits(name, xv, dtype)
        if g & mask not in want:
            bad.append((xv, hex(b), bits_to_float(g & mask, dtype), [bits_to_float(w, dtype) for w in want]))
    assert not bad, f"{name} {dtype}: {len(bad)} of {len(bits_list)} wrong, e.g. (x, bits, got, want): {bad[:4]}"


@pytest.mark.parametrize("name", FORWARD)
def test_float32_specials_and_thresholds(name):
    check(name, torch.float32, special_bits_f32())


@pytest.mark.parametrize("name", FORWARD)
def test_float32_random_bit_patterns(name):
    # uniform over all bit patterns: every exponent, both signs, NaNs
    check(name, torch.float32, random_bits(torch.float32, 1500, seed=seed_of(name) % 1000))


@pytest.mark.parametrize("name", FORWARD)
def test_float32_random_moderate_values(name):
    # where the functions are not saturated: |x| in [2^-8, 2^5)
    rng = random.Random(7 + len(name))
    bits = [(rng.getrandbits(1) << 31) | ((rng.randrange(127 - 8, 127 + 5)) << 23) | rng.getrandbits(23) for _ in range(1500)]
    check(name, torch.float32, bits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", FORWARD)
def test_16_bit_formats(name, dtype):
    check(name, dtype, sorted(set(special_bits_16(dtype) + random_bits(dtype, 700, seed=3))))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=8),
       st.sampled_from(FORWARD))
def test_hypothesis_float32(values, name):
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
    check(name, torch.float32, bits)


def test_known_values_and_signs():
    # A few hand-checked values (independent of any reference code).
    def u32(t):
        return [b & 0xFFFFFFFF for b in as_bits(t).tolist()]

    x = torch.tensor([0.0, -0.0, float("-inf"), float("inf"), 1.0])
    assert u32(carbon.exp(x)) == [0x3F800000, 0x3F800000, 0, 0x7F800000, 0x402DF854]  # e = 2.71828175
    assert u32(carbon.log(x))[:4] == [0xFF800000, 0xFF800000, 0x7FC00000, 0x7F800000]
    assert u32(carbon.tanh(x))[:4] == [0, 0x80000000, 0xBF800000, 0x3F800000]
    assert u32(carbon.erf(x))[:4] == [0, 0x80000000, 0xBF800000, 0x3F800000]
    assert u32(carbon.gelu(x))[:4] == [0, 0x80000000, 0x80000000, 0x7F800000]
    assert u32(carbon.silu(x))[:4] == [0, 0x80000000, 0x80000000, 0x7F800000]
    assert u32(carbon.sigmoid(x))[:4] == [0x3F000000, 0x3F000000, 0, 0x3F800000]
    # NaN inputs of any payload give the canonical NaN
    nan = torch.tensor([0x7F800001, -0x00400000, 0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
    for name in FORWARD:
        assert u32(call(name, nan)) == [0x7FC00000] * 3, name
    # gelu of the smallest subnormal: x/2 is a tie, the x^2 term decides (rounds up)
    tiny = torch.tensor([2.0**-149, -(2.0**-149)])
    for name in ("gelu", "gelu_tanh", "silu"):
        assert call(name, tiny).tolist() == [2.0**-149, -0.0], name


# ---------------------------------------------------------------- gradients


def check_grad(name: str, dtype: torch.dtype, xs, gs) -> None:
    x = torch.tensor(xs, dtype=torch.float64).to(dtype).requires_grad_(True)
    g = torch.tensor(gs, dtype=torch.float64).to(dtype)
    y = call(name, x)
    (grad,) = torch.autograd.grad(y, x, g)
    assert grad.dtype == dtype
    got = as_bits(grad).tolist()
    mask = (1 << fmt_of(dtype).total_bits) - 1
    xv, gv = x.detach().double().tolist(), g.double().tolist()
    bad = []
    for xi, gi, b in zip(xv, gv, got):
        want = grad_expected_bits(name, gi, xi, dtype)
        if b & mask not in want:
            bad.append((xi, gi, bits_to_float(b & mask, dtype), [bits_to_float(w, dtype) for w in want]))
    assert not bad, f"d{name} {dtype}: {len(bad)} of {len(xv)} wrong, e.g. (x, g, got, want): {bad[:4]}"


GRAD_POINTS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.55, -0.75179, -1.2785, 3.0, -3.0, 10.0, -10.0, -14.0, 20.0, -40.0,
               88.0, -88.0, 100.0, -100.0, 1e-30, -1e-30, 1e30, -1e30, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FORWARD)
def test_gradients(name, dtype):
    rng = random.Random(11)
    xs = [x for x in GRAD_POINTS if not (dtype == torch.float16 and abs(x) > 60000 and math.isfinite(x))]
    xs += [rng.gauss(0, 1) * 2.0 ** rng.randint(-6, 4) for _ in range(300)]
    gs = [rng.gauss(0, 1) * 2.0 ** rng.randint(-3, 3) for _ in xs]
    if name in ("log", "log2", "log10"):
        xs = [abs(x) for x in xs]  # plus the negative points above, for NaN
        xs[:4] = [-1.0, -0.0, 0.0, 2.0]
    if name in ("asin", "acos", "erfinv", "atanh"):
        xs = [math.tanh(x) for x in xs]  # mostly inside the domain [-1, 1]
        xs[:8] = [1.0, -1.0, 1.5, -3.0, math.inf, math.nan, 0.0, -0.0]
    if name == "acosh":
        xs = [1.0 + abs(x) for x in xs]  # the domain [1, inf), plus the points below it
        xs[:8] = [1.0, 0.5, -1.0, -3.0, math.inf, math.nan, 0.0, -math.inf]
    check_grad(name, dtype, xs, gs)


def test_gradient_special_g():
    x = torch.tensor([1.0, -2.0, 0.0, 3.0], requires_grad=True)
    g = torch.tensor([float("inf"), float("nan"), -0.0, 0.0])
    (grad,) = torch.autograd.grad(carbon.tanh(x), x, g)
    assert [b & 0xFFFFFFFF for b in as_bits(grad).tolist()] == [0x7F800000, 0x7FC00000, 0x80000000, 0]


@pytest.mark.parametrize("name", ["sigmoid", "silu", "exp", "gelu", "gelu_tanh", "tanh"])
def test_structural_midpoints_strict(name):
    """Inputs k * 2^-23 and k * 2^-24 (k odd): 1/2 + x/4 (sigmoid) and
    x/2 + x^2/4 (silu) are then exact rounding midpoints, decided by terms far
    below double's resolution; here the result must be exactly RN(f(x))."""
    xs = [s * k * 2.0**e for k in range(1, 400, 2) for e in (-23, -24, -30) for s in (1, -1)]
    xs += [s * 2.0**e for e in range(-149, -9) for s in (1, -1)]
    x = torch.tensor(xs, dtype=torch.float32)
    got = as_bits(call(name, x)).tolist()
    from fractions import Fraction
    bad = [(v, bits_to_float(g & 0xFFFFFFFF, torch.float32)) for v, g in zip(xs, got)
           if g & 0xFFFFFFFF not in expected_bits(name, v, torch.float32, rel=Fraction(1, 2**200))]
    assert not bad, f"{name}: {len(bad)} of {len(xs)} not correctly rounded, e.g. {bad[:4]}"


@pytest.mark.parametrize("name", ["silu", "sigmoid", "tanh", "gelu"])
def test_structural_midpoints_strict_gradient(name):
    """silu'(x) = 1/2 + x/2 - x^3/12 + ...: 1/2 + x/2 is an exact midpoint for
    x = k * 2^-24 (k odd); with g = 1 the gradient must be exactly RN(f'(x))."""
    from fractions import Fraction
    xs = [s * k * 2.0**e for k in range(1, 200, 2) for e in (-23, -24, -25) for s in (1, -1)]
    x = torch.tensor(xs, dtype=torch.float32, requires_grad=True)
    (grad,) = torch.autograd.grad(call(name, x), x, torch.ones_like(x))
    tiny = Fraction(1, 2**200)
    bad = [(v, bits_to_float(g & 0xFFFFFFFF, torch.float32)) for v, g in zip(xs, as_bits(grad).tolist())
           if g & 0xFFFFFFFF not in grad_expected_bits(name, 1.0, v, torch.float32, rel=tiny, abs_slack=tiny)]
    assert not bad, f"d{name}: {len(bad)} of {len(xs)} not correctly rounded, e.g. {bad[:4]}"


# ---------------------------------------------------------------- log2 ... atanh: their own edges

def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _f32_value(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _with_neighbours(values, d=2):
    out = set()
    for v in values:
        b = _f32_bits(v) & 0x7FFFFFFF
        for k in range(-d, d + 1):
            if 0 <= b + k <= 0x7F800000:
                out.add(b + k)
    return sorted(out | {b | 0x80000000 for b in out})


EDGES = {
    # powers of two (exact integers), powers of ten (log10: integers), around 1 and the largest / smallest
    "log2": [2.0**e for e in range(-149, 128, 7)] + [1.0 + k * 2.0**-23 for k in range(1, 6)] + [3.0, 10.0, 1e-40],
    "log10": [10.0**k for k in range(-10, 11)] + [1.0 + k * 2.0**-23 for k in range(1, 6)] + [2.0**-149, 3.4e38],
    # integers (exact powers), half-integers, the overflow and underflow edges
    "exp2": [float(k) for k in range(-152, 131, 3)] + [0.5, 1.5, 127.99999, 128.0, -126.0, -149.0, -149.5, -150.0, 2.0**-30],
    # the series / erfcx branch at 0.5 and 2.125, the float32 underflow near 10.05, the clamp at 10.625
    "erfc": [0.5, 2.125, 1.0, 3.0, 9.0, 10.0, 10.05, 10.0548, 10.06, 10.625, 11.0, 26.0, 27.0, 1e-10, 2.0**-149, 1e30],
    # branches at 0.5 / 1.1, float32 overflow near 89.4159, tiny arguments
    "sinh": [0.5, 1.1, 2.0, 20.0, 88.7, 89.4, 89.41598, 89.5, 1e-4, 2.0**-12, 2.0**-30, 2.0**-149],
    # 1 + a^2/2 next to the float32 midpoint 1 + 2^-24 (a near 2^-11.5), branch at 0.5
    "cosh": [2.0**-11.5, 2.0**-11, 2.0**-12, 0.5, 1.1, 20.0, 89.41598, 89.5, 2.0**-149, 1e-4],
    # next to odd multiples of pi/2 (tan huge), to multiples of pi, large arguments, the reduction's branch at pi/4
    "tan": [k * math.pi / 2 for k in range(1, 12)] + [0.7853981633974483, 16367173 * 2.0**72, 2.0**25, 1e20, 1e30,
                                                     2.0**-149, 1e-4],
    # the reduction's breakpoints k/8 and 1, the inversion, large arguments
    "atan": [0.125, 0.375, 0.625, 0.875, 1.0, 1.125, 8.0, 1e10, 1e30, 3.4e38, 2.0**-149, 1e-4],
    "asin": [1.0, 0.5, 0.999, 0.9999999, 1e-4, 2.0**-149, 2.0, 1e30],
    "acos": [1.0, 0.5, 0.999, 0.9999999, 1e-4, 2.0**-149, 2.0, 1e30],
    # erfinv: the branch at 0.53 and Giles' start's at w = 5 (x = 0.99662), the tail up to the float next to 1
    # (erfinv(1 - 2^-24) = 3.83), 1 (inf) and beyond (NaN), tiny and subnormal arguments
    "erfinv": [0.53, 0.5, 0.25, 0.9, 0.99, 0.9966253, 0.999, 0.9999, 0.99999, 1.0 - 2.0**-24, 1.0 - 2.0**-23, 1.0,
               1.0 + 2.0**-23, 2.0, 1e-4, 1e-30, 2.0**-126, 2.0**-149],
    # asinh: tiny (x - x^3/6), the log1p branch at t = 1/4, large (log 2x), the largest float
    "asinh": [2.0**-149, 1e-30, 2.0**-12, 1e-4, 0.25, 0.2475, 0.5, 1.0, 2.0, 1e4, 1e10, 1e30, 3.4e38],
    # acosh: 1 (+0) and the floats next to it (sqrt(2 (x - 1))), large (log 2x), below 1 (NaN)
    "acosh": [1.0, 1.0 + 2.0**-23, 1.0 + 2.0**-20, 1.0001, 1.03, 1.5, 2.0, 1e4, 2.0**53, 1e30, 3.4e38, 0.5, 2.0**-149],
    # atanh: tiny (x + x^3/3), around 1/9 (t = 1/4 in log1p), next to 1 (inf at 1), beyond (NaN)
    "atanh": [2.0**-149, 1e-30, 2.0**-12, 1e-4, 0.1, 0.1111111, 0.5, 0.9, 0.999, 1.0 - 2.0**-24, 1.0, 1.0 + 2.0**-23, 2.0],
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edges_of_the_newer_functions(name):
    check(name, torch.float32, _with_neighbours(EDGES[name]))
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.tensor(EDGES[name], dtype=torch.float64).to(dtype)
        f = fmt_of(dtype)
        bits = sorted({int(b) & ((1 << f.total_bits) - 1) for b in x.view(f.bits_dtype).tolist()})
        check(name, dtype, sorted(set(bits) | {b ^ f.sign_bit for b in bits}))


WORKING_RANGE = {"asin": (-1, 1), "acos": (-1, 1), "atan": (-20, 20), "tan": (-10, 10), "erfc": (-6, 10.1),
                 "erfinv": (-1, 1), "asinh": (-20, 20), "acosh": (1, 30), "atanh": (-1, 1)}


@pytest.mark.parametrize("name", sorted(WORKING_RANGE))
def test_newer_functions_on_their_working_range(name):
    # uniform values where the function is neither NaN nor saturated
    rng = random.Random(len(name))
    lo, hi = WORKING_RANGE[name]
    check(name, torch.float32, [_f32_bits(rng.uniform(lo, hi)) for _ in range(3000)])


def test_newer_functions_known_values():
    def u32(t):
        return [b & 0xFFFFFFFF for b in as_bits(t).tolist()]

    inf, nan = math.inf, math.nan
    x = torch.tensor([0.0, -0.0, -inf, inf, 1.0, -1.0, 8.0, 1024.0, -2.0, nan])
    assert u32(carbon.log2(x)) == [0xFF800000, 0xFF800000, 0x7FC00000, 0x7F800000, 0, 0x7FC00000, 0x40400000,
                                   0x41200000, 0x7FC00000, 0x7FC00000]
    assert carbon.log10(torch.tensor([1.0, 10.0, 1e10, 1e-10])).tolist()[:3] == [0.0, 1.0, 10.0]
    assert carbon.exp2(torch.tensor([0.0, -0.0, 3.0, -149.0, -150.0, 128.0, -inf, inf])).tolist() == \
        [1.0, 1.0, 8.0, 2.0**-149, 0.0, inf, 0.0, inf]
    assert carbon.erfc(torch.tensor([0.0, -inf, inf, 11.0])).tolist() == [1.0, 2.0, 0.0, 0.0]
    assert u32(carbon.sinh(torch.tensor([0.0, -0.0, -inf, inf]))) == [0, 0x80000000, 0xFF800000, 0x7F800000]
    assert carbon.cosh(torch.tensor([0.0, -0.0, -inf, inf])).tolist() == [1.0, 1.0, inf, inf]
    assert u32(carbon.tan(torch.tensor([0.0, -0.0, -inf, inf]))) == [0, 0x80000000, 0x7FC00000, 0x7FC00000]
    half_pi, pi = _f32_bits(math.pi / 2), _f32_bits(math.pi)  # RN32 of the exact values
    assert u32(carbon.atan(torch.tensor([0.0, -0.0, inf, -inf]))) == [0, 0x80000000, half_pi, half_pi | 0x80000000]
    assert u32(carbon.asin(torch.tensor([0.0, -0.0, 1.0, -1.0, 1.0000001, -inf]))) == \
        [0, 0x80000000, half_pi, half_pi | 0x80000000, 0x7FC00000, 0x7FC00000]
    assert u32(carbon.acos(torch.tensor([1.0, -1.0, 0.0, 1.0000001, inf]))) == [0, pi, half_pi, 0x7FC00000, 0x7FC00000]
    inf32, ninf32, nan32 = 0x7F800000, 0xFF800000, 0x7FC00000
    assert u32(carbon.erfinv(torch.tensor([0.0, -0.0, 1.0, -1.0, 1.0000001, -1.0000001, inf, -inf]))) == \
        [0, 0x80000000, inf32, ninf32, nan32, nan32, nan32, nan32]
    # erfinv(1/2) = 0.47693627620446987338..., erfinv(0.9) = 1.16308715367667...: RN32 of them
    assert carbon.erfinv(torch.tensor([0.5, -0.9])).tolist() == [_f32_value(0.4769362762044699), _f32_value(-1.1630871536766742)]
    assert u32(carbon.asinh(torch.tensor([0.0, -0.0, inf, -inf]))) == [0, 0x80000000, inf32, ninf32]
    assert u32(carbon.acosh(torch.tensor([1.0, 0.99999994, 0.0, -1.0, -inf, inf]))) == [0, nan32, nan32, nan32, nan32, inf32]
    assert u32(carbon.atanh(torch.tensor([0.0, -0.0, 1.0, -1.0, 1.0000001, inf]))) == [0, 0x80000000, inf32, ninf32, nan32, nan32]
    # derivatives at the domain edges: asin'(+-1) = +inf, acos'(+-1) = -inf, log2'(0) = +inf, erfinv'(+-1) =
    # atanh'(+-1) = acosh'(1) = +inf
    for name, at, want in (("asin", 1.0, inf), ("acos", -1.0, -inf), ("log2", 0.0, inf), ("log10", -0.0, inf),
                           ("erfinv", -1.0, inf), ("atanh", 1.0, inf), ("acosh", 1.0, inf)):
        t = torch.tensor([at], requires_grad=True)
        (grad,) = torch.autograd.grad(getattr(carbon, name)(t), t, torch.ones(1))
        assert grad.tolist() == [want], name


@pytest.mark.parametrize("name", ["sigmoid", "silu", "gelu_tanh"])
def test_tiny_arguments_beside_ordinary_ones(name):
    """The CPU evaluates these functions' main formula for a whole block of
    elements at once and their Taylor form near 0 (|x| < 2^-10, where
    1/2 + x/4 or x/2 + x^2/4 can be an exact rounding midpoint) only for the
    elements that need it: tiny midpoint-critical arguments are interleaved
    here with ordinary ones, at every position of the 256-element blocks, and
    each result (value and gradient, g = 1) must be exactly RN(f(x))."""
    from fractions import Fraction
    rng = random.Random(f"tiny beside ordinary {name}")
    tiny = [s * k * 2.0**e for k in range(1, 60, 2) for e in (-23, -24, -11) for s in (1, -1)]
    xs = []
    for i in range(700):
        xs.append(rng.choice(tiny) if rng.random() < 0.3 else rng.gauss(0, 2))
    x = torch.tensor(xs, dtype=torch.float32, requires_grad=True)
    xs = x.detach().double().tolist()
    strict = Fraction(1, 2**200)
    got = as_bits(call(name, x.detach())).tolist()
    bad = [(v, bits_to_float(g & 0xFFFFFFFF, torch.float32)) for v, g in zip(xs, got)
           if g & 0xFFFFFFFF not in expected_bits(name, v, torch.float32, rel=strict)]
    assert not bad, f"{name}: {len(bad)} of {len(xs)} wrong, e.g. {bad[:4]}"
    (grad,) = torch.autograd.grad(call(name, x), x, torch.ones_like(x))
    bad = [(v, bits_to_float(g & 0xFFFFFFFF, torch.float32)) for v, g in zip(xs, as_bits(grad).tolist())
           if g & 0xFFFFFFFF not in grad_expected_bits(name, 1.0, v, torch.float32, rel=strict, abs_slack=strict)]
    assert not bad, f"d{name}: {len(bad)} of {len(xs)} wrong, e.g. {bad[:4]}"
