"""var / std / var_mean / std_mean (torch's, under carbon.enable) and the op
behind them, torch.ops.carbon.var_mean_rows, against an exact Fraction oracle:
per row of n values (docs/contract.md §7, "var_mean_rows")

    mean = RN32(sum x / n),   var = RN32(sum (x - mean)^2 / max(0, n - c)),

the centred sum exact around the rounded mean; std = RN32(sqrt(var))."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import carbon
from tests.oracle import as_bits, bits_to_float, round_bits, row_quotient_bits

NAN_BITS = 0x7FC00000


def oracle(row, correction):
    """(var bits, mean bits) of one row of float values."""
    n = len(row)
    if n == 0 or any(math.isnan(v) for v in row):
        return NAN_BITS, NAN_BITS
    infs = {v for v in row if math.isinf(v)}
    if infs:
        return NAN_BITS, (NAN_BITS if len(infs) == 2 else round_bits(infs.pop(), torch.float32))
    exact = [Fraction(v) for v in row]
    mean_bits = row_quotient_bits(row, n, torch.float32)  # the contract's mean, zero signs included
    mu = Fraction(bits_to_float(mean_bits, torch.float32))
    s = sum((v - mu) ** 2 for v in exact)
    divisor = max(0, n - correction)
    if divisor == 0:
        return (NAN_BITS if s == 0 else round_bits(math.inf, torch.float32)), mean_bits
    return round_bits(s / divisor, torch.float32), mean_bits


def rows_of(seed, rows, n, dtype=torch.float32, offset=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, n, generator=g, dtype=torch.float64) * scale + offset).to(dtype)


def check_op(x, correction):
    var, mean = torch.ops.carbon.var_mean_rows(x, correction)
    assert var.dtype == mean.dtype == torch.float32
    for r, row in enumerate(x.double().tolist()):
        want_var, want_mean = oracle(row, correction)
        got_var, got_mean = as_bits(var)[r].item() & 0xFFFFFFFF, as_bits(mean)[r].item() & 0xFFFFFFFF
        assert (got_var, got_mean) == (want_var, want_mean), (r, row[:4], correction)


@pytest.mark.parametrize("n", [1, 2, 7, 33, 1000])
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_rows_match_the_exact_oracle(n, correction):
    check_op(rows_of(n, 6, n, scale=3.0), correction)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs(dtype):
    check_op(rows_of(1, 5, 40, dtype=dtype), 1)


def test_cancellation_takes_the_exact_tier():
    # a large common offset: the centred squares are tiny next to x^2, and
    # exact ties of the mean are likely
    x = torch.cat([rows_of(2, 4, 64, offset=1e6, scale=1e-2), rows_of(3, 4, 64, offset=-3e4, scale=2.0 ** -12),
                   torch.tensor([[1.0, 1.0 + 2.0 ** -23] * 32, [2.0 ** 100, -(2.0 ** 100)] * 32])])
    for c in (0, 1):
        check_op(x, c)
    # var exactly a float32 midpoint: (a^2 + a^2) / 2 = a^2 = 1 + 2^-11 + 2^-24 (ties to even)
    a = 1 + 2.0 ** -12
    check_op(torch.tensor([[a, -a], [-a, a]]), 0)


def test_special_rows():
    nan, inf = math.nan, math.inf
    x = torch.tensor([[1.0, nan, 2.0], [1.0, inf, 2.0], [-inf, 1.0, inf], [-inf, 0.0, -inf], [3e38, 3e38, -3e38],
                      [0.0, -0.0, 0.0], [-0.0, -0.0, -0.0], [1e-45, 0.0, -1e-45]])
    check_op(x, 1)
    check_op(torch.tensor([[5.0], [0.0]]), 1)  # n = 1, correction 1: 0/0 = NaN
    check_op(torch.tensor([[5.0, 7.0]]), 3)  # n < correction: positive sum over 0 = inf
    var, mean = torch.ops.carbon.var_mean_rows(torch.empty(3, 0), 1)
    assert torch.isnan(var).all() and torch.isnan(mean).all()


def test_batch_and_thread_invariance(restore_num_threads):
    x = rows_of(9, 64, 777, offset=5.0)
    torch.set_num_threads(1)
    one = torch.ops.carbon.var_mean_rows(x, 1)
    torch.set_num_threads(2)
    two = torch.ops.carbon.var_mean_rows(x, 1)
    alone = torch.ops.carbon.var_mean_rows(x[17:18], 1)
    for a, b in zip(one, two):
        assert torch.equal(as_bits(a), as_bits(b))
    assert torch.equal(as_bits(one[0][17:18]), as_bits(alone[0]))


def test_torch_var_and_std_under_enable():
    x = rows_of(4, 15, 16, offset=1.0).reshape(3, 5, 16)
    with carbon.enabled():
        results = {
            "var_all": torch.var(x),
            "var_dim": x.var(-1),
            "var_dims_keep": torch.var(x, dim=(0, 2), keepdim=True, unbiased=False),
            "std_dim0": x.std(0),
            "var_mean": torch.var_mean(x, dim=1, correction=2),
            "std_mean": torch.std_mean(x, dim=-1),
        }
    flat = x.reshape(-1).tolist()
    v, m = oracle(flat, 1)
    assert as_bits(results["var_all"]).item() & 0xFFFFFFFF == v and results["var_all"].shape == ()
    for idx in [(0, 0), (2, 4), (1, 3)]:
        row = x[idx].tolist()
        assert as_bits(results["var_dim"][idx]).item() & 0xFFFFFFFF == oracle(row, 1)[0]
        vb, mb = oracle(row, 1)
        sd, mean = results["std_mean"]
        assert as_bits(mean[idx]).item() & 0xFFFFFFFF == mb
        std_bits = round_bits(math.sqrt(bits_to_float(vb, torch.float32)), torch.float32)
        assert as_bits(sd[idx]).item() & 0xFFFFFFFF == std_bits
    assert results["var_dims_keep"].shape == (1, 5, 1)
    col = x[:, 2, :].reshape(-1).tolist()
    assert as_bits(results["var_dims_keep"][0, 2, 0]).item() & 0xFFFFFFFF == oracle(col, 0)[0]
    vm_var, vm_mean = results["var_mean"]
    row = x[1, :, 7].tolist()
    assert (as_bits(vm_var[1, 7]).item() & 0xFFFFFFFF, as_bits(vm_mean[1, 7]).item() & 0xFFFFFFFF) == oracle(row, 2)
    row = x[:, 3, 9].tolist()
    vb = oracle(row, 1)[0]
    assert as_bits(results["std_dim0"][3, 9]).item() & 0xFFFFFFFF == round_bits(
        math.sqrt(bits_to_float(vb, torch.float32)), torch.float32)


def test_advantage_normalisation_gradients_are_thread_invariant(restore_num_threads):
    """PPO / GRPO style (r - mean) / (std + eps), forward and backward."""
    r = rows_of(5, 8, 64, offset=0.5).requires_grad_(True)
    grads = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        r.grad = None
        with carbon.enabled():
            adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-8)
            (adv * adv.detach().flip(-1)).sum().backward()
        grads.append(as_bits(r.grad))
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_var_and_std_under_enable_round_the_float32_statistics(dtype):
    """bfloat16 / float16: the float32 results above, rounded once more to the input's dtype."""
    x = rows_of(9, 6, 40, dtype=dtype, offset=0.5)
    with carbon.enabled():
        var, (std, mean) = x.var(-1), torch.std_mean(x, dim=-1)
    assert var.dtype == std.dtype == mean.dtype == dtype
    bits = 0xFFFF
    for r, row in enumerate(x.double().tolist()):
        vb, mb = oracle(row, 1)
        var32, mean32 = bits_to_float(vb, torch.float32), bits_to_float(mb, torch.float32)
        std32 = bits_to_float(round_bits(math.sqrt(var32), torch.float32), torch.float32)
        assert as_bits(var)[r].item() & bits == round_bits(var32, dtype), r
        assert as_bits(mean)[r].item() & bits == round_bits(mean32, dtype), r
        assert as_bits(std)[r].item() & bits == round_bits(std32, dtype), r


def test_errors_and_opcheck():
    with pytest.raises(ValueError, match="carbon.var_mean_rows: x must be 2-D"):
        torch.ops.carbon.var_mean_rows(torch.ones(4), 1)
    with pytest.raises(ValueError, match="correction must be >= 0"):
        torch.ops.carbon.var_mean_rows(torch.ones(2, 4), -1)
    with pytest.raises(TypeError, match="carbon.var_mean_rows: x has dtype"):
        torch.ops.carbon.var_mean_rows(torch.ones(2, 4, dtype=torch.float64), 1)
    # a row of 2^29 + 1 elements (a stride-0 view: refused before it is read)
    with pytest.raises(ValueError, match="at most 2\\^29 elements per row"):
        torch.ops.carbon.var_mean_rows(torch.zeros(1, 1).expand(1, 2**29 + 1), 1)
    torch.library.opcheck(torch.ops.carbon.var_mean_rows, (torch.randn(3, 5), 1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_equals_cpu():
    x = torch.cat([rows_of(6, 50, 3000, offset=1e4), rows_of(7, 50, 3000, scale=1e-30),
                   torch.tensor([[math.nan] + [1.0] * 2999, [math.inf] + [1.0] * 2999])])
    for c in (0, 1):
        for a, b in zip(torch.ops.carbon.var_mean_rows(x.cuda(), c), torch.ops.carbon.var_mean_rows(x, c)):
            assert torch.equal(as_bits(a.cpu()), as_bits(b))
