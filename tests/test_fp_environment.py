"""The caller's floating-point environment changes no bit (docs/contract.md §1).

torch.set_flush_denormal(True) sets the calling thread's MXCSR to flush
subnormal results to zero and to read subnormal operands as zero. Carbon's
CPU ops run in the default IEEE state whatever the caller set
(csrc/exact/fp_env.h), so with subnormal inputs and outputs they return the
same bits as the exact oracles and as the same call in the default state, and
they leave the caller's state as it was.

Inputs are made from bit patterns and oracles are evaluated before the mode
is set: in flush mode torch's and Python's own conversions flush too.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import carbon

from data import generator
from norm_reference import layer_norm_ref
from oracle import as_bits, assert_bits_equal, mm_bits, sum_bits

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _flush_supported() -> bool:
    ok = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    return ok


pytestmark = pytest.mark.skipif(not _flush_supported(), reason="this CPU cannot flush denormals")


@contextlib.contextmanager
def flushing():
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def subnormals(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random signed subnormals of `dtype`, from bit patterns (no conversion)."""
    mantissa_bits = {F32: 23, BF16: 7, F16: 10}[dtype]
    total = {F32: 32, BF16: 16, F16: 16}[dtype]
    g = generator(seed)
    m = torch.randint(1, 1 << mantissa_bits, shape, generator=g, dtype=torch.int64)
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int64) << (total - 1)
    bits = m | sign
    if total == 16:
        bits = torch.where(bits >= 1 << 15, bits - (1 << 16), bits)
        return bits.to(torch.int16).view(dtype)
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)
    return bits.to(torch.int32).view(dtype)


def flush_is_on() -> bool:
    """Whether this thread now reads a subnormal operand as zero (torch's own
    multiply of the smallest float32 subnormal by 1)."""
    tiny = torch.tensor([1], dtype=torch.int32).view(F32)
    return bool((tiny * 1.0).view(torch.int32).item() == 0)


def test_flush_mode_is_real_and_survives_carbon_ops():
    # Without this the other tests would prove nothing: in flush mode torch's
    # own arithmetic must lose the subnormal, before and after carbon's ops.
    x = subnormals((8, 64), F32, seed=1)
    assert not flush_is_on()
    with flushing():
        assert flush_is_on()
        carbon.sum(x, dim=1)
        carbon.tanh(x)
        assert flush_is_on()
    assert not flush_is_on()


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("dtype", (F32, BF16, F16))
def test_sums_of_subnormals(dtype, threads, restore_num_threads):
    torch.set_num_threads(threads)
    x = subnormals((64, 1031), dtype, seed=2)
    x[::7, ::5] = torch.tensor(1.5, dtype=dtype)  # normal values among them
    want_rows, want_cols = sum_bits(x, 1), sum_bits(x, 0)
    want_all = sum_bits(x, None)
    with flushing():
        rows, cols, total = carbon.sum(x, dim=1), carbon.sum(x, dim=0), carbon.sum(x)
        mean = carbon.mean(x, dim=1)
    assert_bits_equal(rows, want_rows, f"{dtype} rows")
    assert_bits_equal(cols, want_cols, f"{dtype} columns")
    assert_bits_equal(total, want_all, f"{dtype} all")
    assert_bits_equal(mean, as_bits(carbon.mean(x, dim=1)), f"{dtype} mean, flush vs default")
    assert (as_bits(rows) != 0).all()  # the subnormals count


@pytest.mark.parametrize("threads", (1, 2))
def test_matmul_with_subnormal_operands(threads, restore_num_threads):
    torch.set_num_threads(threads)
    a = subnormals((33, 70), F32, seed=3)
    b = (torch.randn((70, 17), generator=generator(4), dtype=torch.float64) * 2.0**100).to(F32)
    want = mm_bits(a, b)
    with flushing():
        got = carbon.mm(a, b)
    assert_bits_equal(got, want, "mm subnormal @ large")
    assert (as_bits(got) != 0).any()


@pytest.mark.parametrize("dtype", (F32, F16))
def test_layer_norm_of_subnormal_rows(dtype):
    x = subnormals((6, 300), dtype, seed=5)
    w = torch.randn(300, generator=generator(6), dtype=torch.float64).to(dtype)
    b = torch.randn(300, generator=generator(7), dtype=torch.float64).to(dtype)
    # the variance underflows next to eps: x-hat is about x / sqrt(eps), which
    # reads every subnormal input
    want = layer_norm_ref(x, (300,), w, b, 1e-5)
    with flushing():
        got = torch.ops.carbon.layer_norm(x, [300], w, b, 1e-5)
    for g, e, what in zip(got, want, ("y", "mean", "rstd")):
        assert_bits_equal(g, e, f"{dtype} layer_norm {what}")


def test_elementwise_of_subnormals():
    x = subnormals((4096,), F32, seed=8)
    want_tanh = as_bits(x)  # tanh(x) = x - x^3/3 + ...: RN is x itself
    default = {name: as_bits(getattr(carbon, name)(x)) for name in ("exp", "sigmoid", "silu", "erf", "gelu")}
    with flushing():
        got_tanh = carbon.tanh(x)
        got = {name: getattr(carbon, name)(x) for name in default}
    assert_bits_equal(got_tanh, want_tanh, "tanh of subnormals")
    for name, bits in default.items():
        assert_bits_equal(got[name], bits, f"{name}, flush vs default state")
    assert (as_bits(got["silu"]) != 0).all()  # x/2 and more: subnormal, not flushed


def test_softmax_and_optimizer_step():
    x = subnormals((8, 257), F32, seed=9)
    g = subnormals((1000,), F32, seed=10)

    def run():
        s = carbon.softmax(x, 1)
        p = torch.nn.Parameter(torch.linspace(-1, 1, 1000))
        opt = carbon.optim.AdamW([p], lr=1e-3)
        for _ in range(3):
            p.grad = g.clone()
            opt.step()
        st = opt.state[p]
        return [s, p.detach(), st["exp_avg"], st["exp_avg_sq"]]

    default = [as_bits(t) for t in run()]
    with flushing():
        got = run()
    for t, bits, what in zip(got, default, ("softmax", "param", "exp_avg", "exp_avg_sq")):
        assert_bits_equal(t, bits, f"{what}, flush vs default state")
    assert (as_bits(got[2]) != 0).all()  # exp_avg = 0.1 g...: subnormal, kept
