"""carbon.sum / carbon.mean: gradients (each correctly rounded into x's dtype),
the custom-op machinery (opcheck, torch.compile, fakes / meta tensors) and
the documented errors.

    sum:  x.grad = RN_{x.dtype}(g)        broadcast back over the reduced dims
    mean: x.grad = RN_{x.dtype}(g / n)    the exact quotient, rounded once
"""

import math
import zlib
from fractions import Fraction

import pytest
import torch

import carbon
from data import BF16, DTYPE_PAIRS, DTYPES, F16, F32, exact_tensor, generator, random_values
from oracle import (
    as_bits, assert_bits_equal, bits_tensor, bits_to_float, mean_bits, reduce_grad_bits, reduced_shape, round_bits,
    sum_bits,
)

pytestmark = pytest.mark.skipif(not (hasattr(carbon, "sum") and hasattr(carbon, "mean")),
                                reason="carbon.sum / carbon.mean not built yet")

F64 = torch.float64
INF, NAN = math.inf, math.nan


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def check_grad(op, x, dim, keepdim, dtype, grad, context=""):
    xl = leaf(x)
    out = getattr(carbon, op)(xl, dim, keepdim, dtype=dtype)
    out.backward(grad)
    expected = reduce_grad_bits(grad, x.shape, dim, keepdim, x.dtype, divide_by_n=(op == "mean"))
    assert_bits_equal(xl.grad, expected, f"{op} grad, {tuple(x.shape)} dim={dim} keepdim={keepdim} {context}",
                      dtype=x.dtype)


# ---------------------------------------------------------------- gradients

GRAD_DIMS = [None, 1, (0, 2), [-1], [2, 0, 1], []]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_gradients_match_the_oracle(op, in_dtype, out_dtype):
    g = generator(zlib.crc32(f"{op}{in_dtype}{out_dtype}".encode()))
    x = random_values((3, 5, 7), in_dtype, g)
    for dim in GRAD_DIMS:
        for keepdim in (False, True):
            shape = reduced_shape((3, 5, 7), dim, keepdim)
            grad = random_values(shape, out_dtype or in_dtype, g, spread=6 if F16 in (in_dtype, out_dtype) else 40)
            check_grad(op, x, dim, keepdim, out_dtype, grad)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_gradients_of_0_dim_and_empty_inputs(op):
    for x, dim in [(torch.tensor(2.5), None), (torch.tensor(2.5, dtype=BF16), 0), (torch.tensor(-1.0, dtype=F16), -1),
                   (torch.zeros(3, 0), 1), (torch.zeros(0, 4, dtype=BF16), 0), (torch.zeros(2, 0, 3), (0, 2))]:
        for keepdim in (False, True):
            shape = reduced_shape(tuple(x.shape), dim, keepdim)
            grad = torch.full(shape, 3.0, dtype=F32)
            check_grad(op, x, dim, keepdim, F32, grad, context="0-dim / empty")


def test_sum_gradient_rounds_once_into_the_input_dtype():
    """bfloat16 x, float32 output: the gradient is RN_bf16 of the float32 gradient."""
    cases = [  # (float32 gradient value, bfloat16 bits)
        (1.0 + 2.0**-8, 0x3F80),  # tie -> even
        (1.0 + 2.0**-8 + 2.0**-23, 0x3F81),  # just above
        (1.0 + 3 * 2.0**-8, 0x3F82),  # tie -> even (up)
        (-(1.0 + 2.0**-8 + 2.0**-23), 0xBF81),
        ((2 - 2.0**-23) * 2.0**127, 0x7F80),  # float32 max overflows bfloat16
        (2.0**-140, 0x0000),  # below half a bfloat16 quantum -> +0
        (-(2.0**-140), 0x8000),
        (3 * 2.0**-134, 0x0002),  # 1.5 quanta -> 2
        (INF, 0x7F80), (-INF, 0xFF80), (NAN, 0x7FC0), (-0.0, 0x8000),
    ]
    x = leaf(torch.zeros(len(cases), 3, dtype=BF16))
    grad = exact_tensor([v for v, _ in cases], F32)
    carbon.sum(x, 1, dtype=F32).backward(grad)
    expected = bits_tensor([[b] * 3 for _, b in cases], BF16)
    assert_bits_equal(x.grad, expected, "by hand")
    assert_bits_equal(x.grad, reduce_grad_bits(grad, (len(cases), 3), 1, False, BF16, False), "oracle")


def test_mean_gradient_is_one_rounding_of_the_quotient():
    """bfloat16 x (rows of n = 3), float32 output and gradient. In bfloat16's
    subnormal range: g = 3 * 2^-134 + 2^-149, g / 3 = 2^-134 + 2^-149/3 is
    just above half a bfloat16 quantum (2^-133) -> 2^-133 (0x0001). Rounding
    g / 3 to float32 first gives exactly 2^-134, the tie -> 0 (0x0000).
    (In the normal range a float32 quotient cannot land on a bfloat16
    midpoint, so this is where the single rounding shows.)"""
    g_val = 3 * 2.0**-134 + 2.0**-149
    assert round_bits(g_val, F32) == round_bits(Fraction(g_val), F32) == (3 << 15) + 1  # g is a float32 value
    exact = Fraction(g_val) / 3
    assert round_bits(exact, BF16) == 0x0001
    via_f32 = bits_to_float(round_bits(exact, F32), F32)
    assert via_f32 == 2.0**-134 and round_bits(via_f32, BF16) == 0x0000, "the trap: float32 first gives the other answer"
    x = leaf(torch.ones(2, 3, dtype=BF16))
    grad = exact_tensor([g_val, -g_val], F32)
    carbon.mean(x, 1, dtype=F32).backward(grad)
    assert_bits_equal(x.grad, bits_tensor([[0x0001] * 3, [0x8001] * 3], BF16), "by hand")
    # the same with the reduced dim first, keepdim, and over two dims (n = 3 * 1)
    x2 = leaf(torch.ones(3, 2, 1, dtype=BF16))
    carbon.mean(x2, (0, 2), keepdim=True, dtype=F32).backward(grad.reshape(1, 2, 1))
    assert_bits_equal(x2.grad, bits_tensor([[[0x0001], [0x8001]]] * 3, BF16), "dims (0, 2), keepdim")
    # float16 x: g / 3 rounded once into float16 (just above a float16 midpoint, 1 + 2^-11)
    g16 = 3 * (1 + 2.0**-11) + 2.0**-21
    assert round_bits(Fraction(g16) / 3, F16) == 0x3C01
    x3 = leaf(torch.ones(1, 3, dtype=F16))
    carbon.mean(x3, 1, dtype=F32).backward(exact_tensor([g16], F32))
    assert_bits_equal(x3.grad, bits_tensor([[0x3C01] * 3], F16), "float16 x")


@pytest.mark.parametrize("x_dtype,out_dtype", [(F16, None), (F32, None), (BF16, None), (F32, F16), (F16, F32), (BF16, BF16)])
def test_mean_gradient_special_values_and_small_quotients(x_dtype, out_dtype):
    gd = out_dtype or x_dtype
    just_above_one = {F32: 1.0 + 2.0**-23, BF16: 1.0 + 2.0**-7, F16: 1.0 + 2.0**-10}[gd]
    vals = [1.0, -1.0, 3.0, 0.0, -0.0, INF, -INF, NAN, 2.0**-24, -(2.0**-24), 2.0**-14, just_above_one]
    grad = exact_tensor(vals, gd)
    for n in (1, 3, 5, 6, 100):
        x = leaf(torch.zeros(len(vals), n, dtype=x_dtype))
        carbon.mean(x, -1, dtype=out_dtype).backward(grad)
        assert_bits_equal(x.grad, reduce_grad_bits(grad, x.shape, -1, False, x_dtype, True), f"n={n}")
    # by hand: 1/3 in each format, and -0 / 3 = -0, inf / 3 = inf
    one_third = {F32: 0x3EAAAAAB, BF16: 0x3EAB, F16: 0x3555}[x_dtype]
    x = leaf(torch.zeros(3, 3, dtype=x_dtype))
    carbon.mean(x, 1, dtype=out_dtype).backward(exact_tensor([1.0, -0.0, INF], gd))
    sign = 0x80000000 if x_dtype == F32 else 0x8000
    inf = {F32: 0x7F800000, BF16: 0x7F80, F16: 0x7C00}[x_dtype]
    assert_bits_equal(x.grad, bits_tensor([[one_third] * 3, [sign] * 3, [inf] * 3], x_dtype), "by hand")


def test_gradient_nan_payload_becomes_the_canonical_nan():
    """Every NaN Carbon writes has the canonical bits -- gradients included."""
    payload = torch.tensor([0x7FC12345, 0x7F800001], dtype=torch.int32).view(F32)
    for op in ("sum", "mean"):
        x = leaf(torch.zeros(2, 4))
        getattr(carbon, op)(x, 1).backward(payload)
        assert_bits_equal(x.grad, bits_tensor([[0x7FC00000] * 4] * 2, F32), f"{op}, same dtype")
        xb = leaf(torch.zeros(2, 4, dtype=BF16))
        getattr(carbon, op)(xb, 1, dtype=F32).backward(payload)
        assert_bits_equal(xb.grad, bits_tensor([[0x7FC0] * 4] * 2, BF16), f"{op}, float32 -> bfloat16")


def test_gradients_through_a_chain_of_reductions():
    g = generator(40)
    x = leaf(random_values((4, 6, 5), BF16, g))
    y = carbon.sum(x, 2, dtype=F32)  # (4, 6) float32
    y.retain_grad()
    z = carbon.mean(y, (0, 1))  # scalar float32, n = 24
    z.backward(torch.tensor(1.0))
    assert_bits_equal(y.grad, reduce_grad_bits(torch.tensor(1.0), (4, 6), (0, 1), False, F32, True), "mean grad")
    assert_bits_equal(x.grad, reduce_grad_bits(y.grad, (4, 6, 5), 2, False, BF16, False), "sum grad")


# ---------------------------------------------------------------- opcheck, torch.compile

OPCHECK = [
    ("sum", (3, 4, 5), F32, [1], False, None),
    ("sum", (3, 4, 5), BF16, [0, 2], True, F32),
    ("sum", (6,), F16, None, False, BF16),
    ("sum", (2, 3), F32, [], True, F16),
    ("mean", (3, 4, 5), F32, [-1], False, None),
    ("mean", (3, 4, 5), BF16, [2, 0], True, F32),
    ("mean", (6,), F16, None, False, None),
    ("mean", (2, 0), F32, [0], False, BF16),  # (an empty output: opcheck compares NaN outputs as unequal)
]


@pytest.mark.parametrize("op,shape,dtype,dim,keepdim,out_dtype", OPCHECK)
def test_opcheck(op, shape, dtype, dim, keepdim, out_dtype):
    x = random_values(shape, dtype, generator(25))
    opdef = getattr(torch.ops.carbon, op).default
    for inp in (x, leaf(x)):
        torch.library.opcheck(opdef, (inp, dim, keepdim, out_dtype))


def test_opcheck_round_to():
    x = random_values((4, 5), F32, generator(26))
    for dtype in DTYPES:
        torch.library.opcheck(torch.ops.carbon.round_to.default, (x, dtype))
        torch.library.opcheck(torch.ops.carbon.round_to.default, (x.to(BF16), dtype))


def test_torch_compile_fullgraph_matches_eager_and_oracle():
    def f(x):
        a = carbon.sum(x, 1, dtype=F32)
        b = carbon.mean(x, (0,), keepdim=True)
        c = carbon.mean(carbon.sum(x, -1))
        d = carbon.sum(x, dtype=F16)
        return a, b, c, d

    g = generator(27)
    x = random_values((6, 9), BF16, g)
    x[1] = exact_tensor([1.0, 2.0**-8, 2.0**-100, 0, 0, 0, 0, 0, 0], BF16)  # a float32-accumulator trap
    eager = f(x)
    compiled = torch.compile(f, fullgraph=True)(x)
    for name, e, c in zip("abcd", eager, compiled):
        assert e.dtype == c.dtype and e.shape == c.shape, name
        assert torch.equal(as_bits(e), as_bits(c)), f"compiled {name} differs from eager"
    assert_bits_equal(eager[0], sum_bits(x, 1, dtype=F32), "a vs oracle")
    assert_bits_equal(eager[1], mean_bits(x, 0, keepdim=True), "b vs oracle")
    assert_bits_equal(eager[2], mean_bits(sum_bits(x, -1).view(BF16)), "c vs oracle")
    assert_bits_equal(eager[3], sum_bits(x, dtype=F16), "d vs oracle")

    def h(x):
        return carbon.mean(carbon.sum(x, 1, dtype=F32))

    xe, xc = leaf(x), leaf(x)
    h(xe).backward()
    torch.compile(h, fullgraph=True)(xc).backward()
    assert torch.equal(as_bits(xe.grad), as_bits(xc.grad)), "compiled backward differs from eager"
    y_grad = bits_tensor([round_bits(Fraction(1, 6), F32)] * 6, F32).view(F32)  # mean's gradient, n = 6
    assert_bits_equal(xe.grad, reduce_grad_bits(y_grad, (6, 9), 1, False, BF16, False), "compiled chain vs oracle")


# ---------------------------------------------------------------- errors


def z(*shape, dtype=F32, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


def bad_calls(op):
    f = getattr(carbon, op)
    return {
        f"{op} float64": (TypeError, lambda d: f(z(3, dtype=F64, device=d))),
        f"{op} int32": (TypeError, lambda d: f(z(3, dtype=torch.int32, device=d))),
        f"{op} int64 with dim": (TypeError, lambda d: f(z(2, 3, dtype=torch.int64, device=d), 1)),
        f"{op} bool": (TypeError, lambda d: f(z(3, dtype=torch.bool, device=d))),
        f"{op} complex64": (TypeError, lambda d: f(z(3, dtype=torch.complex64, device=d))),
        f"{op} dtype float64": (TypeError, lambda d: f(z(3, device=d), dtype=F64)),
        f"{op} dtype int32": (TypeError, lambda d: f(z(3, device=d), dtype=torch.int32)),
        f"{op} dtype complex64": (TypeError, lambda d: f(z(3, dtype=BF16, device=d), 0, dtype=torch.complex64)),
        f"{op} dim 2 of 2-D": (ValueError, lambda d: f(z(2, 3, device=d), 2)),
        f"{op} dim -3 of 2-D": (ValueError, lambda d: f(z(2, 3, device=d), -3)),
        f"{op} dims (0, 5)": (ValueError, lambda d: f(z(2, 3, device=d), (0, 5))),
        f"{op} repeated dim (0, 0)": (ValueError, lambda d: f(z(2, 3, device=d), (0, 0))),
        f"{op} repeated dim [1, -1]": (ValueError, lambda d: f(z(2, 3, device=d), [1, -1])),
        f"{op} repeated dim [0, 2, -3] keepdim": (ValueError, lambda d: f(z(2, 3, 4, device=d), [0, 2, -3], True)),
        f"{op} 0-dim dim 1": (ValueError, lambda d: f(z(device=d), 1)),
        f"{op} 0-dim dim -2": (ValueError, lambda d: f(z(device=d), -2)),
        f"{op} empty dim out of range": (ValueError, lambda d: f(z(0, device=d), 1)),
    }


ALL_BAD = {**bad_calls("sum"), **bad_calls("mean")} if hasattr(carbon, "sum") else {}


@pytest.mark.parametrize("name", list(ALL_BAD))
def test_bad_input_raises(name):
    exc, call = ALL_BAD[name]
    op = name.split()[0]
    with pytest.raises(exc, match=rf"^carbon\.{op}:"):
        call("cpu")


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_raw_op_errors(op):
    raw = getattr(torch.ops.carbon, op)
    with pytest.raises(TypeError, match=rf"^carbon\.{op}:"):
        raw(z(3, dtype=F64), None, False, None)
    with pytest.raises(TypeError, match=rf"^carbon\.{op}:"):
        raw(z(3), None, False, F64)
    with pytest.raises(ValueError, match=rf"^carbon\.{op}:"):
        raw(z(2, 3), [0, 2], False, None)
    with pytest.raises(ValueError, match=rf"^carbon\.{op}:"):
        raw(z(2, 3), [-2, 0], False, None)


def test_bad_input_raises_the_same_on_meta_tensors():
    """The fakes reject what the kernels reject (same exception type and op
    name), so tracing fails like eager execution. One test listing every
    case that behaves differently."""
    wrong = []
    for name, (exc, call) in ALL_BAD.items():
        op = name.split()[0]
        try:
            out = call("meta")
        except Exception as e:  # noqa: BLE001 -- the type is what is checked
            if not (isinstance(e, exc) and str(e).startswith(f"carbon.{op}:")):
                wrong.append(f"{name}: raised {type(e).__name__}({str(e)[:80]!r}), expected {exc.__name__}")
        else:
            wrong.append(f"{name}: returned a {out.dtype} tensor of shape {tuple(out.shape)}, expected {exc.__name__}")
    assert not wrong, "on meta tensors:\n  " + "\n  ".join(wrong)


# ---------------------------------------------------------------- meta shapes and dtypes

META_CASES = [((2, 3, 4), None, False), ((2, 3, 4), None, True), ((2, 3, 4), 1, False), ((2, 3, 4), -1, True),
              ((2, 3, 4), (0, 2), False), ((2, 3, 4), [2, 0], True), ((2, 3, 4), [], False), ((2, 3, 4), [], True),
              ((), None, False), ((), 0, True), ((), -1, False), ((5, 0, 2), 1, False), ((5, 0, 2), (0, 2), True),
              ((1, 1, 1, 7), (1, 2), False)]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape,dim,keepdim", META_CASES)
def test_meta_tensors_give_shape_and_dtype(op, shape, dim, keepdim):
    want_shape = tuple(getattr(torch, op)(torch.zeros(shape), dim=dim, keepdim=keepdim).shape)
    for in_dtype, out_dtype in DTYPE_PAIRS:
        x = torch.empty(shape, dtype=in_dtype, device="meta")
        out = getattr(carbon, op)(x, dim, keepdim, dtype=out_dtype)
        assert out.device.type == "meta"
        assert tuple(out.shape) == want_shape, f"{op} {shape} dim={dim}: {tuple(out.shape)} vs {want_shape}"
        assert out.dtype == (out_dtype or in_dtype)
        # and the CPU kernel agrees
        cpu = getattr(carbon, op)(torch.zeros(shape, dtype=in_dtype), dim, keepdim, dtype=out_dtype)
        assert tuple(cpu.shape) == want_shape and cpu.dtype == out.dtype


def test_round_to_meta_shape_and_dtype():
    if not hasattr(carbon, "round_to"):
        pytest.skip("carbon.round_to not built yet")
    for shape in [(), (3,), (2, 0, 5), (4, 3)]:
        for src in DTYPES:
            for dst in DTYPES:
                out = carbon.round_to(torch.empty(shape, dtype=src, device="meta"), dst)
                assert out.device.type == "meta" and tuple(out.shape) == shape and out.dtype == dst
