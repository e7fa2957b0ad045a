"""carbon's random numbers (docs/contract.md §10) against the independent
reference of tests/philox_reference.py: Philox known-answer vectors, golden
draws, the distributions' definitions, statistics, invariance to thread count
and shape, dropout forward/backward, initializers, generator state, errors,
opcheck and torch.compile."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest
import torch

import carbon
import carbon.nn.init as cinit
import philox_reference as ref
from oracle import as_bits, fmt_of, round_bits

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SEEDS = (0, 1, 123456789, 2**63 + 12345, 2**64 - 1)


def bits(t: torch.Tensor) -> list:
    mask = (1 << fmt_of(t.dtype).total_bits) - 1
    return [b & mask for b in as_bits(t).reshape(-1).tolist()]


def gen(seed: int, offset: int = 0) -> carbon.Generator:
    g = carbon.Generator(seed=seed)
    g.offset = offset
    return g


# ---------------------------------------------------------------- Philox itself


@pytest.mark.parametrize("counter,key,expected", ref.KAT)
def test_reference_philox_known_answers(counter, key, expected):
    assert ref.philox4x32_10(counter, key) == expected


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("offset", (0, 5, 2**32 + 7))
def test_uniform_float32_is_reference_words(seed, offset):
    n = 37
    got = carbon.rand(n, generator=gen(seed, offset), dtype=torch.float32)
    want = [round_bits(ref.uniform01(w), torch.float32) for w in ref.words(seed, offset, n)]
    assert bits(got) == want


def test_golden_first_draws():
    # Philox4x32-10 with counter (0, 0, 0, 0) and key (0, 0) is Random123's first
    # known answer, 6627e8d5 e169c58d bc57ac4c 9b00dbd8: so seed 0 at offset 0
    # starts with the uniforms (w >> 8) 2^-24 of these words.
    got = carbon.rand(4, generator=gen(0, 0)).tolist()
    assert got == [(w >> 8) / 2**24 for w in (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)]


# ---------------------------------------------------------------- distributions


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-0.3, 0.7), (-1e-3, 2.5e4)])
def test_uniform_definition(dtype, low, high):
    seed, offset, n = 99, 3, 50
    got = carbon.random.uniform((5, 10), low, high, generator=gen(seed, offset), dtype=dtype)
    assert got.shape == (5, 10) and got.dtype == dtype
    want = [round_bits(low + (high - low) * float(ref.uniform01(w)), dtype) for w in ref.words(seed, offset, n)]
    assert bits(got) == want


def _fraction(z: mpmath.mpf) -> Fraction:
    sign, man, exp, _ = z._mpf_  # z = (-1)^sign man 2^exp
    value = Fraction(int(man) * 2**exp) if exp >= 0 else Fraction(int(man), 2**-exp)
    return -value if sign else value


def _midpoint_distance(z: mpmath.mpf, dtype: torch.dtype) -> float:
    """Distance (in ulps of dtype) of z to the nearest rounding midpoint."""
    f = fmt_of(dtype)
    e = max(math.frexp(float(z))[1] - f.precision, f.quantum_exp)
    scaled = abs(z) / mpmath.mpf(2) ** e  # value in ulps
    return float(abs(scaled - mpmath.floor(scaled) - mpmath.mpf(0.5)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_against_high_precision_box_muller(dtype):
    seed, offset, n = 2024, 11, 301
    got = carbon.randn(n, generator=gen(seed, offset), dtype=dtype)
    got_bits = bits(got)
    for i in range(n):
        z = ref.box_muller(*ref.normal_uniforms(seed, offset, i))
        want = round_bits(_fraction(z), dtype)
        if got_bits[i] != want:
            # carbon's binary64 evaluation is within 2^-46 (relative) of z; it can only
            # round differently when z is that close to a midpoint.
            assert _midpoint_distance(z, dtype) < 2**-18, (i, float(z), got[i].item())


def test_normal_mean_std_definition():
    seed, offset, n = 5, 0, 40
    mean, std = 0.25, 3.5
    got = carbon.random.normal((n,), mean, std, generator=gen(seed, offset), dtype=torch.float32)
    for i in range(n):
        v = mean + std * ref.box_muller(*ref.normal_uniforms(seed, offset, i))
        want = torch.tensor(float(v), dtype=torch.float32).item()
        assert abs(got[i].item() - want) <= math.ulp(want) * 2**29, i  # at most one float32 ulp


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_bernoulli_scalar_definition(p):
    seed, offset, n = 17, 4, 64
    x = torch.empty(8, 8)
    got = carbon.bernoulli(x, p, generator=gen(seed, offset))
    want = [1.0 if ref.uniform01(w) < Fraction(p) else 0.0 for w in ref.words(seed, offset, n)]
    assert got.reshape(-1).tolist() == want


def test_bernoulli_tensor_probabilities():
    seed, offset, n = 3, 9, 48
    probs = torch.linspace(0, 1, n, dtype=torch.bfloat16)
    got = carbon.bernoulli(probs, generator=gen(seed, offset))
    assert got.dtype == torch.bfloat16
    want = [1.0 if ref.uniform01(w) < Fraction(p) else 0.0 for w, p in zip(ref.words(seed, offset, n), probs.tolist())]
    assert got.tolist() == want


def test_trunc_normal_definition():
    seed, offset, n = 8, 2, 40
    mean, std, a, b = 0.0, 1.0, -0.5, 1.5
    got = carbon.random.trunc_normal((n,), mean, std, a, b, generator=gen(seed, offset), dtype=torch.float32)
    assert torch.all((got >= a) & (got <= b))
    for i in range(n):
        for j in range(64):
            v = mean + std * ref.box_muller(*ref.trunc_normal_uniforms(seed, offset, i, j))
            if min(abs(v - a), abs(v - b)) < 1e-9:
                break  # too close to a bound to decide here
            if a <= v <= b:
                assert abs(got[i].item() - float(v)) <= math.ulp(float(v)) * 2**29, (i, j)
                break


def test_trunc_normal_falls_back_to_clamping():
    # [6, 7] has probability 1e-9: every attempt fails, the last one is clamped.
    got = carbon.random.trunc_normal((1000,), 0.0, 1.0, 6.0, 7.0, generator=gen(1))
    assert torch.all(got == 6.0)


# ---------------------------------------------------------------- statistics


def _ks(sample: torch.Tensor, cdf) -> float:
    x, _ = torch.sort(sample.double().reshape(-1))
    n = x.numel()
    f = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


def test_uniform_statistics():
    n = 200_000
    u = carbon.rand(n, generator=gen(42)).double()
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 5 * math.sqrt(1 / 180 / n)
    assert _ks(u, lambda x: x) < 1.95 / math.sqrt(n)  # alpha = 0.001
    assert u.min().item() >= 0.0 and u.max().item() < 1.0


def test_normal_statistics():
    n = 200_000
    z = carbon.randn(n, generator=gen(43)).double()
    assert abs(z.mean().item()) < 5 / math.sqrt(n)
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z**3).mean().item()) < 5 * math.sqrt(15 / n)
    assert abs((z**4).mean().item() - 3) < 5 * math.sqrt(96 / n)
    assert _ks(z, lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2)))) < 1.95 / math.sqrt(n)


def test_consecutive_offsets_uncorrelated():
    n = 100_000
    g = gen(44)
    a, b = carbon.rand(n, generator=g).double(), carbon.rand(n, generator=g).double()
    assert g.offset == 2
    r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    assert abs(r) < 5 / math.sqrt(n)
    # neighbouring elements within one draw, too
    assert abs(torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1].item()) < 5 / math.sqrt(n)


# ---------------------------------------------------------------- invariance


@pytest.mark.parametrize("draw", ["rand", "randn", "trunc"])
def test_prefix_and_shape_independence(draw):
    fns = {
        "rand": lambda size, g: carbon.rand(size, generator=g),
        "randn": lambda size, g: carbon.randn(size, generator=g),
        "trunc": lambda size, g: carbon.random.trunc_normal(size, generator=g),
    }
    fn = fns[draw]
    small = fn((7, 3), gen(10, 1))  # 21 elements: an odd count, blocks cut in the middle
    big = fn((42,), gen(10, 1))
    assert torch.equal(small.reshape(-1), big[:21])


@pytest.mark.parametrize("draw", ["rand", "randn", "dropout"])
def test_thread_count_independence(draw, restore_num_threads):
    n = 300_001
    x = torch.randn(n)

    def run():
        if draw == "dropout":
            return carbon.dropout(x, 0.4, generator=gen(77, 5))
        return getattr(carbon, draw)(n, generator=gen(77, 5))

    torch.set_num_threads(1)
    one = run()
    torch.set_num_threads(2)
    two = run()
    assert torch.equal(as_bits(one), as_bits(two))


# ---------------------------------------------------------------- dropout


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_dropout_forward_backward(dtype, p):
    seed, offset = 1234, 6
    x = torch.randn(6, 7).to(dtype)
    x[0, 0] = -0.0
    x.requires_grad_(True)
    g = gen(seed, offset)
    y = carbon.dropout(x, p, generator=g)
    assert g.offset == offset + 1
    assert bits(y) == ref.dropout_bits(x.detach(), p, seed, offset)
    grad = torch.randn(6, 7).to(dtype)
    (dx,) = torch.autograd.grad(y, x, grad)
    assert bits(dx) == ref.dropout_bits(grad, p, seed, offset)


def test_dropout_layout_and_eval():
    x = torch.randn(8, 12)
    xt = x.t().contiguous().t()  # same values, column-major
    assert torch.equal(carbon.dropout(xt, 0.3, generator=gen(5)), carbon.dropout(x, 0.3, generator=gen(5)))
    assert carbon.dropout(x, 0.3, training=False) is x
    m = carbon.nn.Dropout(0.3, generator=gen(5))
    assert isinstance(m, torch.nn.Dropout)
    assert torch.equal(m(x), carbon.dropout(x, 0.3, generator=gen(5)))
    m.eval()
    assert m(x) is x


def test_inplace_dropout_with_p_zero_leaves_its_input_unwritten():
    # torch's dropout_ returns its input untouched at p = 0 (timm's
    # attention: softmax, then nn.Dropout(0.0, inplace=True)); a write would
    # bump the version of a tensor autograd saved and break the backward.
    x = torch.randn(3, 5, requires_grad=True)
    probs = torch.softmax(x, dim=-1)
    g = gen(9, 4)
    assert carbon.dropout(probs, 0.0, inplace=True, generator=g) is probs
    assert probs._version == 0 and g.offset == 5  # the draw is still taken
    (probs * torch.arange(5.0)).sum().backward()  # would raise after a write
    nan = torch.tensor([float("nan")]).view(torch.int32).bitwise_or(7).view(torch.float32)  # a payload
    assert carbon.dropout(nan, 0.0, inplace=True, generator=g).view(torch.int32).item() == nan.view(torch.int32).item()
    empty = torch.empty(0)
    assert carbon.dropout(empty, 0.5, inplace=True, generator=g) is empty and empty._version == 0
    with carbon.enabled(seed=0):
        y = torch.softmax(x, dim=-1)
        z = torch.nn.Dropout(0.0, inplace=True)(y)
        assert z is y and y._version == 0
        z.sum().backward()


def test_dropout_keeps_about_1_minus_p():
    x = torch.ones(100_000)
    y = carbon.dropout(x, 0.25, generator=gen(3))
    kept = (y != 0).double().mean().item()
    assert abs(kept - 0.75) < 5 * math.sqrt(0.25 * 0.75 / x.numel())
    assert torch.all((y == 0) | (y == carbon.round_to(torch.tensor([1 / 0.75], dtype=torch.float64).float(), torch.float32)))


# ---------------------------------------------------------------- CPU chunks and fast paths
# The CPU kernels (csrc/random/random_cpu.cpp) work on chunks of 256 Philox
# blocks (1024 uniform / 512 normal values) with a branch-free rounding that
# covers zero, normal and overflowing results and redo a chunk with the
# definition otherwise. These draws cross chunk boundaries, end in ragged
# tails and take both paths; the reference is element by element.

CHUNK_SIZES = (1023, 1024, 1025, 2 * 1024 + 7)


@pytest.mark.parametrize("n", CHUNK_SIZES)
@pytest.mark.parametrize("dtype,low,high", [
    (torch.float32, 0.0, 1.0),
    (torch.bfloat16, -3.0, 5.0),
    (torch.float32, -1e-40, 1e-40),   # subnormal results: the general rounding
    (torch.float16, -1e5, 1e5),       # overflow to +-inf
    (torch.float16, 0.0, 0.0),        # all zeros
])
def test_uniform_chunks_against_reference(n, dtype, low, high):
    seed, offset = 2**64 - 1, 2**32 + 3
    got = carbon.random.uniform((n,), low, high, generator=gen(seed, offset), dtype=dtype)
    want = [round_bits(low + (high - low) * float(ref.uniform01(w)), dtype) for w in ref.words(seed, offset, n)]
    assert bits(got) == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_chunks_against_reference(dtype):
    seed, offset, n = 2**63 + 1, 2**40, 512 + 9  # one chunk and a ragged one
    got_bits = bits(carbon.randn(n, generator=gen(seed, offset), dtype=dtype))
    for i in list(range(500, n)) + list(range(0, 12)):
        z = ref.box_muller(*ref.normal_uniforms(seed, offset, i))
        if got_bits[i] != round_bits(_fraction(z), dtype):
            assert _midpoint_distance(z, dtype) < 2**-18, i


def test_normal_tiny_std_takes_the_general_rounding():
    # mean + std z with std = 1e-42: float32 subnormals (and zeros), exactly
    # RN(double(std * z)) where the binary64 z is within 2^-46 of Box-Muller.
    seed, offset, n = 8, 1, 600
    std = 1e-42
    got = carbon.random.normal((n,), 0.0, std, generator=gen(seed, offset), dtype=torch.float32)
    ulp = 2.0**-149
    for i in range(0, n, 7):
        z = float(ref.box_muller(*ref.normal_uniforms(seed, offset, i)))
        assert abs(got[i].item() - std * z) <= ulp / 2 * (1 + 2**-20), i
    assert (got.abs() < 2.0**-126).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_bernoulli_special_probabilities(dtype):
    seed, offset, n = 2**64 - 1, 2**33 + 1, 1030
    specials = [0.0, -0.0, 1.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e-40, 6e-8, float("nan"), float("inf"), -1.0, 2.0]
    probs = torch.rand(n, generator=torch.Generator().manual_seed(0)).to(dtype)
    probs[::3] = torch.tensor(specials * n)[: len(probs[::3])].to(dtype)
    got = carbon.bernoulli(probs, generator=gen(seed, offset))
    want = []
    for w, pb in zip(ref.words(seed, offset, n), probs.tolist()):
        want.append(1.0 if not math.isnan(pb) and (math.isinf(pb) or ref.uniform01(w) < Fraction(pb)) else 0.0)
    assert got.tolist() == want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.9999])
def test_dropout_special_inputs(dtype, p):
    seed, offset, n = 0, 2**62, 2 * 1024 + 3
    x = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 100
    x[: n // 3] = 0.0  # ReLU-like zeros
    specials = [-0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -6e-8, 3e38, 65504.0, 1e-45]
    x[n // 3 :: 5] = torch.tensor(specials * n)[: len(x[n // 3 :: 5])]
    x = x.to(dtype)
    assert bits(carbon.dropout(x, p, generator=gen(seed, offset))) == ref.dropout_bits(x, p, seed, offset)


# ---------------------------------------------------------------- generator state


def test_state_save_restore():
    g = carbon.Generator(seed=2**64 - 5)
    carbon.rand(10, generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.shape == (16,)
    a = carbon.randn(100, generator=g)
    g.set_state(state)
    b = carbon.randn(100, generator=g)
    assert torch.equal(a, b)
    assert g.initial_seed() == 2**64 - 5 and g.offset == 2


def test_default_generator_and_manual_seed():
    carbon.manual_seed(7)
    a = carbon.rand(5)
    assert carbon.default_generator.offset == 1
    carbon.manual_seed(7)
    assert torch.equal(carbon.rand(5), a)
    assert torch.equal(carbon.rand(5, generator=gen(7, 1)), carbon.rand(5, generator=gen(7, 1)))
    assert not torch.equal(carbon.rand(5, generator=gen(7, 0)), carbon.rand(5, generator=gen(7, 1)))


# ---------------------------------------------------------------- initializers


def test_init_functions():
    w = torch.empty(64, 32)
    g = gen(9)
    cinit.xavier_uniform_(w, gain=2.0, generator=g)
    bound = 2.0 * math.sqrt(6 / 96)
    assert torch.equal(w, carbon.random.uniform(w.shape, -bound, bound, generator=gen(9)))
    assert w.abs().max().item() <= bound
    cinit.kaiming_normal_(w, mode="fan_out", nonlinearity="relu", generator=g)
    assert abs(w.std().item() / (math.sqrt(2) / math.sqrt(64)) - 1) < 0.05
    assert torch.equal(w, carbon.random.normal(w.shape, 0, math.sqrt(2) / 8, generator=gen(9, 1)))
    cinit.kaiming_uniform_(w, a=math.sqrt(5), generator=g)  # nn.Linear's default
    bound = math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(32)
    assert w.abs().max().item() <= bound and w.abs().max().item() > 0.9 * bound
    cinit.xavier_normal_(w, generator=g)
    assert abs(w.std().item() / math.sqrt(2 / 96) - 1) < 0.05
    cinit.trunc_normal_(w, std=0.02, a=-0.04, b=0.04, generator=g)
    assert w.abs().max().item() <= 0.04
    cinit.uniform_(w, -1, 1, generator=g)
    cinit.normal_(w, 1, 2, generator=g)
    assert g.offset == 7
    cinit.constant_(w, 0.5)
    assert torch.all(w == 0.5)
    cinit.zeros_(w)
    assert torch.all(w == 0)
    cinit.ones_(w)
    assert torch.all(w == 1)
    p = torch.nn.Parameter(torch.empty(3, 4, 5, dtype=torch.bfloat16))
    cinit.kaiming_uniform_(p, generator=g)
    assert p.requires_grad and p.dtype == torch.bfloat16


# ---------------------------------------------------------------- errors


def test_errors():
    with pytest.raises(ValueError, match="carbon.dropout"):
        carbon.dropout(torch.ones(3), 1.5)
    with pytest.raises(ValueError, match="carbon.dropout"):
        torch.ops.carbon.dropout(torch.ones(3), -0.1, 0, 0)
    with pytest.raises(TypeError, match="carbon.dropout"):
        carbon.dropout(torch.ones(3, dtype=torch.float64), 0.5)
    with pytest.raises(TypeError, match="carbon.uniform"):
        carbon.rand(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="seed"):
        carbon.Generator(seed=-1)
    with pytest.raises(ValueError, match="seed"):
        carbon.manual_seed(2**64)
    with pytest.raises(ValueError, match="offset"):
        torch.ops.carbon.uniform([3], 0, -1, 0.0, 1.0, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="carbon.normal"):
        carbon.random.normal((3,), 0.0, -1.0)
    with pytest.raises(ValueError, match="carbon.bernoulli"):
        carbon.bernoulli(torch.ones(3), 2.0)
    with pytest.raises(ValueError):
        carbon.Generator().set_state(torch.zeros(3, dtype=torch.uint8))


# ---------------------------------------------------------------- torch integration


def test_opcheck():
    # each op has two overloads: (seed, offset) as ints, and .state (a tensor)
    x = torch.randn(5, 6, requires_grad=True)
    cpu = torch.device("cpu")
    ops = torch.ops.carbon
    torch.library.opcheck(ops.dropout.default, (x, 0.3, 12, 3))
    torch.library.opcheck(ops.bernoulli.default, (torch.rand(4, 5), 12, 3, None))
    torch.library.opcheck(ops.uniform.default, ([4, 5], 12, 3, -1.0, 1.0, torch.float32, cpu))
    torch.library.opcheck(ops.normal.default, ([4, 5], 12, 3, 0.0, 1.0, torch.bfloat16, cpu))
    state = torch.tensor([12, 3])
    torch.library.opcheck(ops.dropout.state, (x, 0.3, state))
    torch.library.opcheck(ops.bernoulli.state, (torch.rand(4, 5), state, 0.25))
    torch.library.opcheck(ops.uniform.state, ([4, 5], state, -1.0, 1.0, torch.float32, cpu))
    torch.library.opcheck(ops.normal.state, ([4, 5], state, 0.0, 1.0, torch.bfloat16, cpu))
    torch.library.opcheck(ops.trunc_normal.state, ([4, 5], state, 0.0, 1.0, -0.5, 1.0, torch.float16, cpu))


def test_compile_dropout():
    torch._dynamo.reset()
    x = torch.randn(16, 8, requires_grad=True)

    def f(x):
        return torch.ops.carbon.dropout(x * 2, 0.25, 7, 3).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    (gx,) = torch.autograd.grad(got, x)
    want = f(x)
    (wx,) = torch.autograd.grad(want, x)
    assert torch.equal(got, want) and torch.equal(gx, wx)


def test_attention_dropout():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g).requires_grad_() for _ in range(3))
    carbon.manual_seed(11)
    out = carbon.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    assert carbon.default_generator.offset == 1
    scores = carbon.bmm(q, k.transpose(1, 2), out_dtype=torch.float32)
    probs = carbon.softmax(torch.ops.carbon.attention_logits(scores, 0.5, None, False), -1)
    want = carbon.bmm(carbon.dropout(probs, 0.3, generator=gen(11, 0)), v, out_dtype=torch.float32)
    assert torch.equal(out, want)
    (dq,) = torch.autograd.grad(out.sum(), q)
    (wq,) = torch.autograd.grad(want.sum(), q)
    assert torch.equal(dq, wq)
