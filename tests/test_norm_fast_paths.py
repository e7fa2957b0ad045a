"""layer_norm / rms_norm rows that exercise the CPU kernels' fast paths and
their fallbacks (csrc/norm/norm_cpu.cpp), against tests/norm_reference.py:

* the variance decided from the first pass's moments (mean near 0), left to
  the centred pass (a large mean against the spread) or to the exact tier
  (ties), with the tie placed in different lanes / the tail of long rows;
* means and mean squares on a float32 tie whose float64 sums are exact
  (rounded from that one sum) or not (the exact accumulator over the row);
* the AVX-512 loops fuse an addition into a multiply-add where the product
  is exact (x - mu, x-hat w + b, dx's g - A - x-hat B): signed zeros must
  come out as from the separate operations;
* the hardware roundings are IEEE only in the default floating-point state,
  which every op sets for itself (csrc/exact/fp_env.h): with flush-to-zero
  set by the caller (torch.set_flush_denormal), outputs that are float32 /
  float16 subnormals must still be the correctly rounded ones.
"""

from __future__ import annotations

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)

from data import DTYPES, F16, F32, generator
from norm_reference import layer_norm_backward_ref, layer_norm_ref, rms_norm_ref
from norm_util import (check_layer_norm, check_layer_norm_grads, check_rms_norm, check_rms_norm_grads, norm_data,
                       params, tie_square)
from oracle import assert_bits_equal


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", (8, 9, 23, 768, 1000))
def test_variance_routes(dtype, n):
    # Rows centred near 0 (decided from the moments), shifted rows (centred
    # pass), with every affine form.
    for seed, offset in ((1, False), (2, True)):
        x = norm_data(4, n, dtype, seed=seed + n, offset=offset)
        for affine in ("none", "both"):
            w, b = params((n,), dtype, affine, seed=seed)
            check_layer_norm(x, (n,), w, b, context=f"{dtype} n={n} offset={offset} {affine}")


@pytest.mark.parametrize("position", (0, 5, 8, 1021, 1022))
def test_variance_tie_in_long_rows(position):
    # x = c +- a among 1022 copies of c: var = 2 a^2 / 1024 = a^2 / 512 lies
    # exactly halfway between two float32 values (a^2 = 1 + 2^-11 + 2^-24);
    # no float64 tier may decide it, wherever the pair sits (lanes, tail).
    a = tie_square()
    rows = []
    for c in (0.0, 3.0, -1000.0):
        row = [c] * 1024
        row[position] = c - a
        row[(position + 517) % 1024] = c + a
        rows.append(row)
    x = torch.tensor(rows, dtype=torch.float64).to(F32)
    check_layer_norm(x, (1024,), eps=0.0, context=f"tie at {position}")


def _tie_rows(n: int, position: int) -> torch.Tensor:
    """Rows of n = 1024 values whose mean or mean square lies exactly halfway
    between two float32 values, each sum exact in float64 (few-bit values):
    ones and one 2^-15 (mean 1 - 2^-10 + 2^-25), ones and two 2^-8 (mean
    square 1 - 2^-9 + 2^-25), their negations, and the first row with a
    second value moved far below (2^-80): just off the tie, and its float64
    sum no longer exact."""
    mean_tie = [1.0] * n
    mean_tie[position] = 2.0**-15
    square_tie = [1.0] * n
    square_tie[position] = square_tie[(position + 333) % n] = 2.0**-8
    far = list(mean_tie)
    far[(position + 1) % n] = 2.0**-80
    rows = [mean_tie, square_tie, [-v for v in mean_tie], [-v for v in square_tie], far]
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("position", (0, 7, 1023))
def test_ties_of_exact_float64_sums(dtype, position):
    # No error bound decides a tie; when the float64 sum is exact the kernels
    # round that one sum, otherwise the exact accumulator sums the row. Also
    # random small integers (exact sums, frequent ties) and gradients whose
    # mean of dy is such a tie (no weight: g = dy).
    n = 1024
    x = _tie_rows(n, position)
    if dtype == F16:  # 2^-80 is below float16's range: 2^-24 (an exact sum again, off the tie)
        x[4][(position + 1) % n] = 2.0**-24
    g = generator(40 + position)
    ints = torch.randint(-8, 9, (4, n), generator=g).double()
    x = torch.cat([x, ints]).to(dtype)
    dy = torch.cat([_tie_rows(n, (position + 5) % n), torch.randint(-8, 9, (4, n), generator=g).double()]).to(dtype)
    if dtype == F16:
        dy[4][(position + 6) % n] = 2.0**-24
    context = f"{dtype} tie at {position}"
    check_layer_norm(x, (n,), eps=0.0, context=context)
    check_rms_norm(x, (n,), context=context)
    w, b = params((n,), dtype, "both", seed=position)
    check_layer_norm(x, (n,), w, b, context=context + " affine")
    check_layer_norm_grads(x, (n,), None, None, dy=dy, context=context)
    check_layer_norm_grads(x, (n,), w, b, dy=dy, context=context + " affine")
    check_rms_norm_grads(x, (n,), w, dy=dy, context=context + " rms")


@pytest.mark.parametrize("dtype", DTYPES)
def test_signed_zeros_of_fused_additions(dtype):
    # Constant rows (x - mu = +0, x-hat = +0) and rows of +-0; weights of
    # both signs and zeros (x-hat w = +-0), biases +0 and -0 (y = +-0 + +-0);
    # dy = +-0 and weights that make g = +-0, so g - A and x-hat B are zeros
    # of either sign. n = 40: five 8-lane blocks, no tail.
    n = 40
    w = torch.tensor([(-1.0) ** k * (0.0 if k % 5 == 0 else 1.5) for k in range(n)], dtype=torch.float64)
    b = torch.tensor([0.0 if k % 2 else -0.0 for k in range(n)], dtype=torch.float64)
    rows = [[0.75] * n, [-0.0] * n, [0.0] * n, [0.0 if k % 3 else -0.0 for k in range(n)], [2.0] * (n // 2) + [2.5] * (n // 2)]
    x = torch.tensor(rows, dtype=torch.float64).to(dtype)
    dy = torch.tensor([[(-0.0 if (r + k // 2) % 2 else 0.0) if r < 3 else float(k % 3 - 1) for k in range(n)]
                       for r in range(len(rows))], dtype=torch.float64).to(dtype)
    w, b = w.to(dtype), b.to(dtype)
    for eps in (0.0, 1e-5):
        context = f"{dtype} eps={eps}"
        check_layer_norm(x, (n,), w, b, eps=eps, context=context)
        check_layer_norm(x, (n,), w, None, eps=eps, context=context + " weight")
        check_layer_norm_grads(x, (n,), w, b, eps=eps, dy=dy, context=context)
        check_layer_norm_grads(x, (n,), None, None, eps=eps, dy=dy, context=context + " no affine")
        check_rms_norm_grads(x, (n,), w, dy=dy, context=context + " rms")


def test_flush_to_zero_state_keeps_subnormal_outputs():
    # Normal weights near the smallest normal number push y (|x-hat| < 1)
    # into the subnormal range of float32 / float16: in flush-to-zero mode a
    # hardware rounding would give 0; the ops switch their threads to the
    # default state and still return RN of the exact value. The inputs are built
    # before the mode is set (torch's own conversions flush in it), and the
    # reference runs after it is cleared (numpy's casts would flush too).
    cases = []
    for dtype, tiny in ((F32, 2.0**-126), (F16, 2.0**-14)):
        g = generator(5)
        n = 40
        x = torch.randn((6, n), generator=g, dtype=torch.float64).to(dtype)
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
        w = (sign * (1 + torch.rand(n, generator=g, dtype=torch.float64)) * tiny).to(dtype)
        b = torch.zeros(n, dtype=dtype)
        dy = torch.randn((6, n), generator=g, dtype=torch.float64).to(dtype)
        cases.append((dtype, x, w, b, dy))
    if not torch.set_flush_denormal(True):
        pytest.skip("flush-to-zero not supported on this CPU")
    try:
        results = []
        for dtype, x, w, b, dy in cases:
            ln = torch.ops.carbon.layer_norm(x, [x.shape[1]], w, b, 1e-5)
            rms = torch.ops.carbon.rms_norm(x, [x.shape[1]], w, None)
            xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
            carbon.layer_norm(xr, (x.shape[1],), wr, br).backward(dy)
            results.append((ln, rms, (xr.grad, wr.grad, br.grad)))
    finally:
        torch.set_flush_denormal(False)
    for (dtype, x, w, b, dy), (ln, rms, grads) in zip(cases, results):
        n = x.shape[1]
        assert ((ln[0] != 0) & (ln[0].abs() < torch.finfo(dtype).tiny)).sum() > 100  # subnormal outputs
        ey, em, er = layer_norm_ref(x, (n,), w, b, 1e-5)
        for got, want, what, dt in ((ln[0], ey, "y", dtype), (ln[1], em, "mean", F32), (ln[2], er, "rstd", F32)):
            assert_bits_equal(got, want, f"ftz {dtype} layer_norm {what}", dtype=dt)
        ry, rr = rms_norm_ref(x, (n,), w, None)
        assert_bits_equal(rms[0], ry, f"ftz {dtype} rms_norm y", dtype=dtype)
        assert_bits_equal(rms[1], rr, f"ftz {dtype} rms_norm rstd", dtype=F32)
        edx, edw, edb = layer_norm_backward_ref(dy, x, (n,), w, True, 1e-5)
        for got, want, what in zip(grads, (edx, edw, edb), ("dx", "dweight", "dbias")):
            assert_bits_equal(got, want, f"ftz {dtype} {what}", dtype=dtype)
