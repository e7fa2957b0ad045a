"""float64 exp, log, sin, cos and pow (docs/contract.md §6, "float64"):
carbon's double-double cores round correctly, checked against mpmath at 300
bits rounded to binary64 here (Python's Fraction -> float rounds once, ties
to even, subnormals included). The inputs stress each piece of the
algorithms: the Payne-Hanek reduction next to multiples of pi/2 up to
1e308, the shortcuts for tiny arguments, exp's overflow and subnormal
results, log of subnormals and of values next to 1, and the position tables
of diffusion transformers (10000 ** (arange / d), then sin and cos), which
is why float64 is covered at all."""

import math
import random
from fractions import Fraction

import mpmath
import pytest
import torch

import carbon

mpmath.mp.prec = 300
mpf = mpmath.mpf
CANONICAL_NAN = 0x7FF8000000000000


def rn(v) -> float:
    """The double nearest to an mpmath value (ties to even), subnormals and overflow included."""
    if mpmath.isnan(v):
        return math.nan
    if mpmath.isinf(v):
        return math.copysign(math.inf, v)
    sign, man, exp, _ = mpf(v)._mpf_  # the exact binary value (-1)^sign man 2^exp
    exact = (-1) ** sign * Fraction(int(man)) * (Fraction(2) ** int(exp))
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def bits(x: float) -> int:
    return torch.tensor([x], dtype=torch.float64).view(torch.int64).item() & (2**64 - 1)


def check(got: torch.Tensor, xs, ref, what: str) -> None:
    assert got.dtype == torch.float64
    bad = []
    for x, g in zip(xs, got.tolist()):
        want = ref(x)
        if math.isnan(want):
            ok = bits(g) == CANONICAL_NAN
        else:
            ok = g == want and math.copysign(1.0, g) == math.copysign(1.0, want)
        if not ok:
            bad.append((x, g, want))
    assert not bad, f"{what}: {len(bad)} of {len(xs)} not correctly rounded, e.g. (x, got, want) {bad[:3]}"


def run(fn, xs):
    return fn(torch.tensor(xs, dtype=torch.float64))


RNG = random.Random(20261201)


def spread(lo: int, hi: int, n: int, rng=RNG) -> list:
    """n values with random signs and significands, exponents uniform in [lo, hi]."""
    return [math.ldexp(rng.uniform(-1.0, 1.0), rng.randint(lo, hi)) for _ in range(n)]


def near_quarter_turns(n: int, rng=RNG) -> list:
    """Doubles next to k pi/2 (the reduction's cancellation), k up to 2^1000."""
    out = []
    for _ in range(n):
        k = rng.randint(1, 2 ** rng.randint(1, 1000))
        x = rn(k * mpmath.pi / 2)
        if math.isfinite(x):
            out += [x, math.nextafter(x, math.inf), math.nextafter(x, -math.inf)]
    return out


HARD_SIN_COS = [
    6381956970095103 * 2.0**797,  # the double closest to a multiple of pi/2
    math.pi / 4, math.nextafter(math.pi / 4, 0), math.nextafter(math.pi / 4, 4), math.pi / 2, math.pi, 2 * math.pi,
    1e22, 1e300, 1.7976931348623157e308, 2.0**-26, math.nextafter(2.0**-26, 0), 2.0**-27,
    math.nextafter(2.0**-27, 0), 1.5 * 2.0**-27, 5e-324, 2.2250738585072014e-308, 0.0, -0.0, 1.0, -1.0, 0.5, 3.0,
]


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_correctly_rounded(name):
    fn, ref = getattr(carbon, name), getattr(mpmath, name)
    xs = spread(-60, 60, 4000) + spread(60, 1023, 1500) + near_quarter_turns(400) + HARD_SIN_COS
    xs += [math.ldexp(RNG.uniform(1, 2), RNG.choice([-27, -26, -25])) for _ in range(300)]
    check(run(fn, xs), xs, lambda x: rn(ref(mpf(x))) if x != 0 else (x if name == "sin" else 1.0), name)


def test_sin_keeps_the_sign_of_zero_and_specials_are_nan():
    y = carbon.sin(torch.tensor([-0.0, 0.0, math.inf, -math.inf, math.nan], dtype=torch.float64))
    assert [bits(v) for v in y.tolist()[:2]] == [bits(-0.0), bits(0.0)]
    assert all(bits(v) == CANONICAL_NAN for v in y.tolist()[2:])
    y = carbon.cos(torch.tensor([-0.0, math.inf, -math.inf, -math.nan], dtype=torch.float64))
    assert y[0].item() == 1.0 and all(bits(v) == CANONICAL_NAN for v in y.tolist()[1:])


def test_exp_correctly_rounded_including_overflow_and_subnormal_results():
    xs = [RNG.uniform(-745.2, 709.8) for _ in range(4000)] + spread(-80, 3, 1500)
    xs += [RNG.uniform(-745.2, -708.3) for _ in range(1500)]  # subnormal results
    xs += [709.782712893384, 709.7827128933841, 709.79, 709.8, 709.81, -745.1332191019411, -745.1332191019412,
           -745.14, -745.2, -745.3, 1000.0, -1000.0, 5e-324, -5e-324, 0.0, -0.0, 1.0, -1.0, math.inf, -math.inf]
    check(run(carbon.exp, xs), xs, lambda x: rn(mpmath.exp(mpf(x))) if math.isfinite(x) else math.exp(x), "exp")
    assert bits(carbon.exp(torch.tensor([math.nan], dtype=torch.float64)).item()) == CANONICAL_NAN


def test_log_correctly_rounded():
    xs = [abs(v) for v in spread(-1074, 1023, 4000)]
    xs += [math.ldexp(RNG.random(), -1040 - RNG.randint(0, 34)) for _ in range(300)]  # subnormal inputs
    xs += [1 + RNG.uniform(-2.0**-20, 2.0**-20) for _ in range(500)] + [math.nextafter(1.0, 0), math.nextafter(1.0, 2)]
    xs += [math.sqrt(2), math.nextafter(math.sqrt(2), 2), math.sqrt(0.5), 2.0, 0.5, 1.0, 5e-324, 1.7976931348623157e308]
    check(run(carbon.log, xs), xs, lambda x: rn(mpmath.log(mpf(x))), "log")
    y = carbon.log(torch.tensor([0.0, -0.0, -1.0, math.inf, math.nan], dtype=torch.float64)).tolist()
    assert y[:2] == [-math.inf, -math.inf] and bits(y[2]) == CANONICAL_NAN and y[3] == math.inf
    assert bits(y[4]) == CANONICAL_NAN


def pow_ref(x: float, p: float) -> float:
    """C's pow for the special cases (Python's math.pow), mpmath for the rest."""
    if p == 0 or x == 1 or not (math.isfinite(x) and math.isfinite(p)) or x == 0:
        try:
            return math.pow(x, p)
        except (OverflowError, ValueError):
            return math.nan if x < 0 else math.inf
    if x < 0 and not float(p).is_integer():
        return math.nan
    v = rn(mpf(abs(x)) ** mpf(p))
    return -v if x < 0 and float(p).is_integer() and int(p) % 2 == 1 else v


@pytest.mark.parametrize("base", [10000.0, 500000.0, 10.0, 2.0, 0.5, 1e-3])
def test_number_to_a_float64_tensor_power(base):
    # diffusers' sin-cos tables: 1 / 10000 ** (arange(d // 2) / (d / 2)); Flux: theta ** (arange(0, d, 2) / d)
    es = sorted({i / (d / 2.0) for d in (16, 64, 256, 1152) for i in range(d // 2)})
    es += [RNG.uniform(-300, 300) / math.log10(base if base > 1 else 1 / base) for _ in range(1500)]
    got = torch.ops.carbon.pow_scalar_tensor(base, torch.tensor(es, dtype=torch.float64))
    check(got, es, lambda e: pow_ref(base, e), f"{base} ** e")


@pytest.mark.parametrize("p", [1.7, -0.37, 0.5, 3.0, -2.0, 1 / 3, 1e-3, 250.5])
def test_float64_tensor_to_a_number_power(p):
    xs = [abs(v) for v in spread(-40, 40, 1500)] + [-2.0, -0.5, -3.0, 0.0, -0.0, math.inf, -math.inf, 1.0, -1.0]
    got = torch.ops.carbon.pow_tensor_scalar(torch.tensor(xs, dtype=torch.float64), p)
    check(got, xs, lambda x: pow_ref(x, p), f"x ** {p}")


@pytest.mark.parametrize("name,derivative", [
    ("sin", lambda x: rn(mpmath.cos(mpf(x)))),
    ("cos", lambda x: -rn(mpmath.sin(mpf(x)))),
    ("exp", lambda x: rn(mpmath.exp(mpf(x)))),
])
def test_gradients_are_torch_formulas_rounded_once_per_step(name, derivative):
    xs = spread(-20, 6, 300)
    gs = spread(-5, 5, 300)
    x = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(getattr(carbon, name)(x), x, torch.tensor(gs, dtype=torch.float64))
    want = [g * derivative(v) for v, g in zip(xs, gs)]  # a Python float product: one rounding
    assert dx.tolist() == want


def test_log_gradient_is_one_division():
    xs = [abs(v) for v in spread(-20, 20, 300)]
    gs = spread(-5, 5, 300)
    x = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(carbon.log(x), x, torch.tensor(gs, dtype=torch.float64))
    assert dx.tolist() == [g / v for v, g in zip(xs, gs)]


def test_same_bits_at_one_and_two_threads_and_in_any_layout(restore_num_threads):
    x = torch.tensor(spread(-30, 300, 20_000), dtype=torch.float64).reshape(100, 200)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append([f(x) for f in (carbon.sin, carbon.cos, carbon.exp, lambda t: carbon.log(t.abs()))])
    for a, b in zip(*outs):
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    t = x.t()  # non-contiguous
    assert torch.equal(carbon.sin(t).view(torch.int64), carbon.sin(t.contiguous()).view(torch.int64))


def test_other_functions_still_refuse_float64():
    with pytest.raises(TypeError, match="float64"):
        carbon.tanh(torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="float64"):
        carbon.gelu(torch.ones(2, dtype=torch.float64))


def sincos_table(d: int, n: int) -> torch.Tensor:
    """diffusers' get_1d_sincos_pos_embed_from_grid (output_type="pt"), written out."""
    omega = torch.arange(d // 2, dtype=torch.float64) / (d / 2.0)
    omega = 1.0 / 10000**omega
    out = torch.outer(torch.arange(n, dtype=torch.float64), omega)
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def test_diffusion_position_tables_under_strict_enable(restore_num_threads, carbon_disabled_after):
    tables = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled(seed=0, strict=True):
            tables.append(sincos_table(64, 50))
    assert torch.equal(tables[0].view(torch.int64), tables[1].view(torch.int64))
    # each step one rounding: the omega powers, their reciprocals and products, then sin / cos
    omega = [1.0 / rn(mpf(10000) ** mpf(i / 32.0)) for i in range(32)]
    for pos in (0, 1, 7, 49):
        args = [pos * w for w in omega]
        want = [rn(mpmath.sin(mpf(a))) for a in args] + [rn(mpmath.cos(mpf(a))) for a in args]
        assert tables[1][pos].tolist() == want, pos


def test_fakes_and_opcheck_accept_float64():
    x = torch.rand(3, 4, dtype=torch.float64) + 0.5
    for name in ("exp", "log", "sin", "cos"):
        torch.library.opcheck(getattr(torch.ops.carbon, name), (x,))
        torch.library.opcheck(torch.ops.carbon.elementwise_backward, (x.clone(), x, name))
        m = getattr(torch.ops.carbon, name)(torch.empty(2, 0, dtype=torch.float64, device="meta"))
        assert m.shape == (2, 0) and m.dtype == torch.float64
    torch.library.opcheck(torch.ops.carbon.pow_tensor_scalar, (x, 0.75))
    torch.library.opcheck(torch.ops.carbon.pow_scalar_tensor, (3.0, x))
    with pytest.raises(TypeError, match="carbon.elementwise_backward: x has dtype"):
        torch.ops.carbon.elementwise_backward(x, x, "tanh")
