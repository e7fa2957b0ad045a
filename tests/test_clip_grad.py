"""carbon.nn.utils.clip_grad_norm_ (contract §12) against exact fractions:
the total 2-norm is RN32(sqrt(RN32(exact sum of g^2))), the inf-norm max|g|,
and every gradient becomes RN(g * min(RN32(max_norm / (total + 1e-6)), 1))."""

from __future__ import annotations

import math

import pytest
import torch

import carbon
from oracle import as_bits, bits_to_float
from optim_reference import clip_coefficient, l2_norm_value, scaled_values, sum_squares_bits
from optim_util import wide_values

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def params_with_grads(grads):
    ps = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=g.dtype))
        p.grad = g.clone()
        ps.append(p)
    return ps


def check_clip(grads, max_norm):
    ps = params_with_grads(grads)
    total = carbon.nn.utils.clip_grad_norm_(ps, max_norm)
    expected = l2_norm_value(grads)
    assert total.dtype == torch.float32 and total.dim() == 0
    assert float(total) == expected or (math.isnan(expected) and math.isnan(float(total)))
    coef = clip_coefficient(expected, max_norm)
    for p, g in zip(ps, grads):
        assert torch.equal(as_bits(p.grad), as_bits(scaled_values(g, coef)))
    return total


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_norm", [1.0, 1e30])
@pytest.mark.parametrize("scale", [1.0, 2.0**-70])  # 1: the sum of squares overflows float32 (total inf)
def test_l2_norm_and_scaling(dtype, max_norm, scale):
    grads = [wide_values((17, 9), dtype, 11), wide_values((3000,), dtype, 12), wide_values((3,), dtype, 13)]
    if dtype == torch.float16:
        scale = scale if scale == 1.0 else 2.0**-8
    grads = [g * scale for g in grads]
    check_clip(grads, max_norm)


def test_mixed_dtypes():
    check_clip([wide_values((50,), torch.float32, 1), wide_values((70,), torch.bfloat16, 2)], 0.5)


def test_sum_of_squares_needs_the_exact_tier():
    # 1 + 2^-24 is a float32 midpoint: fp64 sums cannot decide it; ties to even -> 1
    g = torch.tensor([1.0, 2.0**-12])
    assert int(as_bits(torch.ops.carbon.sum_squares([g])).item()) == sum_squares_bits([g]) == 0x3F800000
    # a term of 2^-60 breaks the tie upwards
    g2 = [torch.tensor([1.0]), torch.tensor([2.0**-12]), torch.tensor([2.0**-30])]
    got = torch.ops.carbon.sum_squares(g2)
    assert float(got) == bits_to_float(sum_squares_bits(g2), torch.float32) == 1.0 + 2.0**-23
    check_clip(g2, 0.25)


def test_inf_norm():
    grads = [torch.tensor([1.0, -7.5, 2.0]), torch.tensor([3.0, -0.5]).bfloat16()]
    ps = params_with_grads(grads)
    total = carbon.nn.utils.clip_grad_norm_(ps, 1.0, norm_type=math.inf)
    assert float(total) == 7.5 and total.dtype == torch.float32
    coef = clip_coefficient(7.5, 1.0)
    for p, g in zip(ps, grads):
        assert torch.equal(as_bits(p.grad), as_bits(scaled_values(g, coef)))


def test_no_clipping_keeps_bits():
    grads = [wide_values((100,), torch.float32, 5) * 2.0**-110]  # total < 1
    ps = params_with_grads(grads)
    carbon.nn.utils.clip_grad_norm_(ps, 1.0)
    assert torch.equal(as_bits(ps[0].grad), as_bits(grads[0]))


def test_close_to_torch():
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(300, generator=g), torch.randn(20, 30, generator=g)]
    ours, theirs = params_with_grads(grads), params_with_grads(grads)
    a = carbon.nn.utils.clip_grad_norm_(ours, 1.0)
    b = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.grad, q.grad, rtol=4e-7, atol=0)


def test_inf_norm_of_nan_gradients_is_the_canonical_nan():
    """Any NaN among the gradients (sign, payload, signaling) gives the total
    0x7FC00000 (contract §1) and canonical NaN gradients."""
    for bits in (0x7FC00123, 0xFFC00000, 0x7F800001, 0xFFFFFFFF):
        g = torch.tensor([1.0, 2.0, 3.0])
        g.view(torch.int32)[1] = bits - (1 << 32) if bits >= (1 << 31) else bits
        ps = params_with_grads([g, torch.tensor([0.5])])
        total = carbon.nn.utils.clip_grad_norm_(ps, 1.0, math.inf)
        assert total.view(torch.int32).item() & 0xFFFFFFFF == 0x7FC00000, hex(bits)
        assert [v & 0xFFFFFFFF for v in ps[0].grad.view(torch.int32).tolist()] == [0x7FC00000] * 3, hex(bits)


def test_nonfinite():
    grads = [torch.tensor([1.0, math.inf])]
    with pytest.raises(RuntimeError, match="non-finite"):
        carbon.nn.utils.clip_grad_norm_(params_with_grads(grads), 1.0, error_if_nonfinite=True)
    ps = params_with_grads(grads)
    total = carbon.nn.utils.clip_grad_norm_(ps, 1.0)
    assert math.isinf(float(total))
    assert float(ps[0].grad[0]) == 0.0 and math.isnan(float(ps[0].grad[1]))  # inf * 0, as in torch
    with pytest.raises(RuntimeError, match="non-finite"):
        carbon.nn.utils.clip_grad_norm_(params_with_grads([torch.tensor([math.nan])]), 1.0, error_if_nonfinite=True)


def test_empty_and_errors():
    total = carbon.nn.utils.clip_grad_norm_([], 1.0)
    assert float(total) == 0.0 and total.dim() == 0
    assert float(carbon.nn.utils.clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0)) == 0.0  # no grads
    assert float(carbon.nn.utils.clip_grad_norm_(params_with_grads([torch.zeros(0)]), 1.0)) == 0.0
    with pytest.raises(NotImplementedError, match="norm_type=1.0 is not supported"):
        carbon.nn.utils.clip_grad_norm_(params_with_grads([torch.ones(2)]), 1.0, norm_type=1)
    with pytest.raises(TypeError, match="supported dtypes"):
        torch.ops.carbon.sum_squares([torch.ones(2, dtype=torch.float64)])


def test_single_tensor_argument_and_threads(restore_num_threads):
    x = wide_values((100000,), torch.float32, 9)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        p = torch.nn.Parameter(torch.zeros(x.shape))
        p.grad = x.clone()
        results.append((int(as_bits(carbon.nn.utils.clip_grad_norm_(p, 1.0))), as_bits(p.grad).clone()))
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_ordinary_values_take_the_fast_path_and_match_fractions(dtype):
    # only normal-range values: every block of the CPU scaling loop is decided on its vectorized path
    from data import generator, random_values

    spread = 3 if dtype == torch.float16 else 12
    grads = [random_values((1500,), dtype, generator(40 + i), spread=spread) for i in range(2)]
    check_clip(grads, 1.0)
