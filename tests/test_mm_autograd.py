"""Every gradient is itself a correctly rounded exact result, rounded once into
the dtype of the input it belongs to:
    grad_a = RN_{a.dtype}(grad @ b^T),  grad_b = RN_{b.dtype}(a^T @ grad),
    grad_bias = RN_{bias.dtype}(exact sum of grad over the broadcast dims)."""

import random

import pytest
import torch

import carbon
from data import BF16, F16, F32, exact_tensor, generator, random_values
from oracle import as_bits, assert_bits_equal, bits_to_float, bmm_bits, mm_bits, round_bits, sum_to_shape_bits


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def out_dtype_of(a, b, out_dtype):
    return out_dtype if out_dtype is not None else torch.promote_types(a.dtype, b.dtype)


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [
    (F32, F32, None), (BF16, BF16, None), (F16, F16, None), (BF16, BF16, F32), (F32, BF16, F16), (F16, F32, BF16),
])
@pytest.mark.parametrize("bias_shape", [None, (7,), (5, 7), (5, 1), (1, 7), ()], ids=str)
def test_mm_and_addmm_gradients(a_dtype, b_dtype, out_dtype, bias_shape):
    g = generator(21)
    a, b = leaf(random_values((5, 9), a_dtype, g)), leaf(random_values((9, 7), b_dtype, g))
    grad = random_values((5, 7), out_dtype_of(a, b, out_dtype), g)
    if bias_shape is None:
        out = carbon.mm(a, b, out_dtype=out_dtype)
    else:
        bias = leaf(random_values(bias_shape, b_dtype, g))
        out = carbon.addmm(bias, a, b, out_dtype=out_dtype)
    out.backward(grad)
    assert_bits_equal(a.grad, mm_bits(grad, b.detach().t(), out_dtype=a_dtype), "grad a", dtype=a_dtype)
    assert_bits_equal(b.grad, mm_bits(a.detach().t(), grad, out_dtype=b_dtype), "grad b", dtype=b_dtype)
    if bias_shape is not None:
        assert_bits_equal(bias.grad, sum_to_shape_bits(grad, bias_shape, b_dtype), "grad bias", dtype=b_dtype)


@pytest.mark.parametrize("bias_shape", [None, (6,), (4, 6), (3, 1, 6), (1, 4, 1), ()], ids=str)
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None)])
def test_bmm_and_baddbmm_gradients(bias_shape, dtype, out_dtype):
    g = generator(22)
    a, b = leaf(random_values((3, 4, 8), dtype, g)), leaf(random_values((3, 8, 6), dtype, g))
    grad = random_values((3, 4, 6), out_dtype_of(a, b, out_dtype), g)
    if bias_shape is None:
        out = carbon.bmm(a, b, out_dtype=out_dtype)
    else:
        bias = leaf(random_values(bias_shape, F32, g))
        out = carbon.baddbmm(bias, a, b, out_dtype=out_dtype)
    out.backward(grad)
    assert_bits_equal(a.grad, bmm_bits(grad, b.detach().transpose(1, 2), out_dtype=dtype), "grad a", dtype=dtype)
    assert_bits_equal(b.grad, bmm_bits(a.detach().transpose(1, 2), grad, out_dtype=dtype), "grad b", dtype=dtype)
    if bias_shape is not None:
        assert_bits_equal(bias.grad, sum_to_shape_bits(grad, bias_shape, F32), "grad bias", dtype=F32)


def test_gradients_follow_the_special_value_and_signed_zero_rules():
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 2.0**-133, 2.0**100]
    rng = random.Random(27)

    def pick(rows, cols):
        return exact_tensor([[rng.choice(vals) for _ in range(cols)] for _ in range(rows)], F32)

    a, b, bias = leaf(pick(6, 3)), leaf(pick(3, 5)), leaf(pick(1, 5))
    grad = pick(6, 5)
    g16 = grad.to(BF16)  # every value above is exact in bfloat16
    carbon.addmm(bias, a, b, out_dtype=BF16).backward(g16)
    assert_bits_equal(a.grad, mm_bits(g16, b.detach().t(), out_dtype=F32), "grad a")
    assert_bits_equal(b.grad, mm_bits(a.detach().t(), g16, out_dtype=F32), "grad b")
    assert_bits_equal(bias.grad, sum_to_shape_bits(g16, (1, 5), F32), "grad bias")


def test_gradients_round_once_into_bfloat16():
    """bfloat16 inputs, float32 output and gradient. grad_a[0, 0] is exactly
    1 + 2^-8 + 2^-30: RN_bf16 gives 1 + 2^-7, but rounding to float32 first
    (1 + 2^-8, a bfloat16 tie) and then to bfloat16 would give 1."""
    a = leaf(torch.ones(1, 2, dtype=BF16))
    b = leaf(torch.ones(2, 2, dtype=BF16))
    out = carbon.mm(a, b, out_dtype=F32)
    assert out.dtype == F32
    grad = exact_tensor([[1.0 + 2.0**-8, 2.0**-30]], F32)
    out.backward(grad)
    assert a.grad.dtype == BF16 and b.grad.dtype == BF16
    assert as_bits(a.grad).tolist() == [[0x3F81, 0x3F81]]  # 1 + 2^-7, by hand
    assert_bits_equal(a.grad, mm_bits(grad, b.detach().t(), out_dtype=BF16))
    assert_bits_equal(b.grad, mm_bits(a.detach().t(), grad, out_dtype=BF16))
    double_rounded = torch.tensor(1.0 + 2.0**-8, dtype=F32).to(BF16)
    assert as_bits(double_rounded).item() != 0x3F81  # the alternative this test rules out


def test_linear_weight_and_bias_gradients_are_one_rounding_over_all_tokens():
    """input (2, 3, K): dW and dbias sum over all 6 rows at once. The data makes
    batch 0's partial 1 + 2^-24 (a tie -> 1) and batch 1's 2^-24 + 2^-60 (-> 2^-24),
    so rounding per batch gives 1 while the exact total 1 + 2^-23 + 2^-60 rounds to 1 + 2^-23."""
    K, N = 3, 2
    g = generator(23)
    x = random_values((2, 3, K), F32, g, spread=2)
    x[..., 0] = 1.0
    w = random_values((N, K), F32, g, spread=2)
    bias = random_values((N,), F32, g)
    grad = random_values((2, 3, N), F32, g, spread=2)
    grad[..., 0] = torch.tensor([[1.0, 2.0**-24, 0.0], [2.0**-24, 2.0**-60, 0.0]])
    x, w, bias = leaf(x), leaf(w), leaf(bias)
    out = carbon.linear(x, w, bias)
    assert out.shape == (2, 3, N)
    out.backward(grad)

    rows, grad_rows = x.detach().reshape(6, K), grad.reshape(6, N)
    expected_dw = mm_bits(grad_rows.t(), rows, out_dtype=F32)
    expected_db = sum_to_shape_bits(grad_rows, (N,), F32)
    assert_bits_equal(w.grad, expected_dw, "dW")
    assert_bits_equal(bias.grad, expected_db, "dbias")
    assert_bits_equal(x.grad, mm_bits(grad_rows, w.detach(), out_dtype=F32).reshape(2, 3, K), "dx")
    assert as_bits(w.grad)[0, 0].item() == 0x3F800001 and as_bits(bias.grad)[0].item() == 0x3F800001

    # The per-batch alternative (round each batch's partial, then round their sum) differs:
    def per_batch(partials_bits):
        return round_bits(sum(bits_to_float(int(p), F32) for p in partials_bits), F32)

    dw_parts = [mm_bits(grad[i].t(), x.detach()[i], out_dtype=F32)[0, 0] for i in range(2)]
    db_parts = [sum_to_shape_bits(grad[i], (N,), F32)[0] for i in range(2)]
    assert per_batch(dw_parts) != int(expected_dw[0, 0]) & 0xFFFFFFFF
    assert per_batch(db_parts) != int(expected_db[0]) & 0xFFFFFFFF


def test_linear_without_bias_and_one_dimensional_input():
    g = generator(24)
    w = leaf(random_values((4, 5), BF16, g))
    x = leaf(random_values((5,), BF16, g))
    out = carbon.linear(x, w)
    assert out.shape == (4,)
    grad = random_values((4,), BF16, g)
    out.backward(grad)
    assert_bits_equal(out, mm_bits(x.detach()[None], w.detach().t())[0])
    assert_bits_equal(x.grad, mm_bits(grad[None], w.detach())[0], "dx")
    assert_bits_equal(w.grad, mm_bits(grad[:, None], x.detach()[None]), "dW")


ZERO_SIZED = {  # op taking (bias of shape (2,), a, b), a's shape, b's shape
    "addmm M=0": (lambda bias, a, b: carbon.addmm(bias, a, b), (0, 3), (3, 2)),
    "linear 0 tokens": (lambda bias, x, w: carbon.linear(x, w, bias), (0, 3), (2, 3)),
    "baddbmm B=0": (lambda bias, a, b: carbon.baddbmm(bias, a, b), (0, 4, 3), (0, 3, 2)),
}


@pytest.mark.parametrize("name", list(ZERO_SIZED))
def test_gradient_of_an_empty_batch_is_positive_zero(name):
    """No rows: the weight and bias gradients are sums of no terms, so +0."""
    call, a_shape, b_shape = ZERO_SIZED[name]
    bias, a, b = leaf(torch.ones(2)), leaf(torch.zeros(a_shape)), leaf(torch.ones(b_shape))
    out = call(bias, a, b)
    assert out.numel() == 0
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert bool((as_bits(b.grad) == 0).all()) and as_bits(bias.grad).tolist() == [0, 0]


def test_gradient_with_k_zero():
    a, b, bias = leaf(torch.zeros(2, 0)), leaf(torch.ones(0, 3)), leaf(torch.ones(3))
    carbon.addmm(bias, a, b).sum().backward()
    assert a.grad.shape == (2, 0) and b.grad.shape == (0, 3)
    assert bias.grad.tolist() == [2.0, 2.0, 2.0]


# ---------------------------------------------------------------- opcheck and torch.compile

OPCHECK_CASES = [
    ("mm", lambda g, dt, odt: (random_values((3, 4), dt, g), random_values((4, 5), dt, g), odt)),
    ("addmm", lambda g, dt, odt: (random_values((5,), dt, g), random_values((3, 4), dt, g), random_values((4, 5), F32, g), odt)),
    ("bmm", lambda g, dt, odt: (random_values((2, 3, 4), dt, g), random_values((2, 4, 5), dt, g), odt)),
    ("baddbmm", lambda g, dt, odt: (random_values((3, 1), F32, g), random_values((2, 3, 4), dt, g), random_values((2, 4, 5), dt, g), odt)),
]


@pytest.mark.parametrize("name,make", OPCHECK_CASES, ids=[c[0] for c in OPCHECK_CASES])
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, BF16)])
def test_opcheck(name, make, dtype, out_dtype):
    op = getattr(torch.ops.carbon, name).default
    args = make(generator(25), dtype, out_dtype)
    with_grad = tuple(leaf(t) if isinstance(t, torch.Tensor) else t for t in args)
    for case in (args, with_grad):
        torch.library.opcheck(op, case)  # schema, autograd registration, fake tensor, AOT dispatch


def test_torch_compile_fullgraph_matches_eager():
    def f(x, b, w, bias):
        return carbon.linear(carbon.mm(x, b, out_dtype=F32), w, bias)

    g = generator(26)
    x, b = random_values((4, 6), BF16, g), random_values((6, 8), BF16, g)
    w, bias = random_values((5, 8), F32, g), random_values((5,), F32, g)
    eager = f(x, b, w, bias)
    compiled = torch.compile(f, fullgraph=True)(x, b, w, bias)
    assert torch.equal(as_bits(compiled), as_bits(eager))
    expected_inner = mm_bits(x, b, out_dtype=F32).view(F32)
    assert_bits_equal(eager, mm_bits(expected_inner, w.t(), bias), "eager vs oracle")

    # backward through the compiled graph gives the eager gradients
    leaves_e = [leaf(t) for t in (x, b, w, bias)]
    leaves_c = [leaf(t) for t in (x, b, w, bias)]
    f(*leaves_e).sum().backward()
    torch.compile(f, fullgraph=True)(*leaves_c).sum().backward()
    for e, c in zip(leaves_e, leaves_c):
        assert torch.equal(as_bits(e.grad), as_bits(c.grad))
