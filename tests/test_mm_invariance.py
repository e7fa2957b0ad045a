"""A correctly rounded result depends only on the input values, so Carbon's
bits cannot change with batch size, thread count or memory layout. These
tests compare the implementation with itself under different
configurations, and check a subset of each against the oracle."""

import pytest
import torch

import carbon
from data import BF16, DTYPES, F16, F32, generator, random_values
from oracle import as_bits, assert_bits_equal, bmm_bits, linear_bits, mm_bits


def wide_matrix(shape, dtype, seed):
    """Random values over a wide exponent range, with some rows built to cancel
    (x, -x pairs plus small terms), so that every tier of the kernels runs."""
    g = generator(seed)
    spread = 6 if dtype == F16 else 40
    x = random_values(shape, dtype, g, spread=spread)
    if x.dim() == 2 and x.shape[1] >= 4:
        half = x.shape[1] // 2
        x[::5, half : 2 * half] = -x[::5, :half]  # rows whose large terms cancel exactly
    return x


def same_bits(x, y, context=""):
    assert x.dtype == y.dtype and x.shape == y.shape, context
    assert torch.equal(as_bits(x), as_bits(y)), f"{context}: bits differ at {(as_bits(x) != as_bits(y)).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (BF16, None), (F16, None)])
def test_row_equals_the_same_row_computed_alone_or_in_other_batches(dtype, out_dtype):
    A = wide_matrix((64, 512), dtype, seed=1)
    B = wide_matrix((512, 24), dtype, seed=2)
    full = carbon.mm(A, B, out_dtype=out_dtype)
    for rows in (1, 3, 8, 64):
        for start in range(0, 64, rows):
            part = carbon.mm(A[start : start + rows], B, out_dtype=out_dtype)
            same_bits(part, full[start : start + rows], f"rows {start}:{start + rows} of batch size {rows}")
    # and the shared result is the correctly rounded one (a subset: 2 rows)
    assert_bits_equal(full[::40], mm_bits(A[::40], B, out_dtype=out_dtype), "rows 0 and 40")


def test_addmm_row_invariance_with_broadcast_bias():
    A, B = wide_matrix((32, 128), F32, 3), wide_matrix((128, 16), F32, 4)
    bias = random_values((16,), F32, generator(5))
    full = carbon.addmm(bias, A, B)
    for i in range(32):
        same_bits(carbon.addmm(bias, A[i : i + 1], B), full[i : i + 1], f"row {i}")


@pytest.mark.parametrize("out_dtype", [None, BF16])
def test_thread_count_does_not_matter(restore_num_threads, out_dtype):
    # M * N large enough for at::parallel_for to split the rows over threads
    A, B = wide_matrix((512, 64), F32, 6), wide_matrix((64, 64), F32, 7)
    bias = random_values((512, 1), BF16, generator(8))
    torch.set_num_threads(1)
    one = carbon.addmm(bias, A, B, out_dtype=out_dtype)
    torch.set_num_threads(2)
    two = carbon.addmm(bias, A, B, out_dtype=out_dtype)
    same_bits(one, two, "1 vs 2 threads")
    assert_bits_equal(two[::97], mm_bits(A[::97], B, bias[::97], out_dtype), "rows ::97")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_batches_split_over_threads(restore_num_threads, threads):
    """Many batches of a few hundred KB each (attention's heads) run as one task per chunk of batches on
    the CPU (csrc/matmul/matmul.cpp): batches and rows against the oracle, with a bias and a
    lower-triangular (causal) operand whose zeros the blocked path skips, at 1, 2 and 3 threads, and the
    same bits as the batches multiplied one at a time."""
    torch.set_num_threads(threads)
    g = generator(21)
    B, T = 41, 128
    a = random_values((B, T, T), F32, g, spread=8)
    b = random_values((B, T, T), BF16, g, spread=8)
    bias = random_values((B, 1, T), F32, g)
    causal = torch.tril(random_values((B, T, T), F32, g))
    out, out_bias = carbon.bmm(a, b), carbon.baddbmm(bias, a, b, out_dtype=BF16)
    out_causal = carbon.bmm(causal, b.float())
    batches, rows = [0, 17, B - 1], [0, 5, T - 1]
    for i in batches:
        sub = a[i, rows]
        assert_bits_equal(out[i, rows], mm_bits(sub, b[i]), f"bmm batch {i}")
        assert_bits_equal(out_bias[i, rows], mm_bits(sub, b[i], bias[i], BF16), f"baddbmm batch {i}")
        assert_bits_equal(out_causal[i, rows], mm_bits(causal[i, rows], b[i].float()), f"causal batch {i}")
    for i in range(B):
        same_bits(out[i], carbon.mm(a[i], b[i]), f"bmm batch {i} alone")


@pytest.mark.parametrize("dtype", DTYPES)
def test_memory_layout_does_not_matter(dtype):
    x = wide_matrix((40, 30), dtype, 9)  # contiguous
    y = wide_matrix((30, 50), dtype, 10)
    reference = carbon.mm(x, y)
    layouts = {
        "a transposed view": (x.t().contiguous().t(), y),
        "b transposed view": (x, y.t().contiguous().t()),
        "both transposed views": (x.t().contiguous().t(), y.t().contiguous().t()),
        "permuted storage": (x.t().contiguous().permute(1, 0), y.t().contiguous().permute(1, 0)),
    }
    for name, (a, b) in layouts.items():
        assert not (a.is_contiguous() and b.is_contiguous()), name
        same_bits(carbon.mm(a, b), reference, name)
    # the transpose of a contiguous tensor as an operand
    same_bits(carbon.mm(y.t(), x.t()), carbon.mm(y.t().contiguous(), x.t().contiguous()), "x.t()")
    # slices with steps
    a, b = x[::2], y[:, 1::3]
    same_bits(carbon.mm(a, b), carbon.mm(a.contiguous(), b.contiguous()), "sliced")
    same_bits(carbon.mm(a, b), reference[::2, 1::3], "sliced vs full")
    # a broadcast (stride 0) operand and a non-contiguous bias
    row = x[:1].expand(5, -1)
    same_bits(carbon.mm(row, y), carbon.mm(row.contiguous(), y), "expanded")
    bias = wide_matrix((50, 40), dtype, 11).t()
    same_bits(carbon.addmm(bias, x, y), carbon.addmm(bias.contiguous(), x, y), "transposed bias")
    assert_bits_equal(reference[::13], mm_bits(x[::13], y), "oracle subset")


def test_bmm_element_equals_mm_of_the_slice():
    a, b = wide_matrix((5, 12, 40), F32, 12), wide_matrix((5, 40, 7), F32, 13)
    a[:, :, 20:] = -a[:, :, :20]  # cancelling halves in every row
    a[:, :, 0] += 1.0
    bias = random_values((5, 1, 7), F32, generator(14))
    out = carbon.bmm(a, b)
    out_bias = carbon.baddbmm(bias, a, b, out_dtype=BF16)
    for i in range(5):
        same_bits(out[i], carbon.mm(a[i], b[i]), f"bmm batch {i}")
        same_bits(out_bias[i], carbon.addmm(bias[i], a[i], b[i], out_dtype=BF16), f"baddbmm batch {i}")
    # permuted batch layout
    a_perm = a.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    same_bits(carbon.bmm(a_perm, b), out, "batch-strided a")
    assert_bits_equal(out[:2], bmm_bits(a[:2], b[:2]), "oracle, batches 0-1")


def test_linear_on_nd_input_equals_linear_on_flattened_input():
    g = generator(15)
    x = random_values((2, 3, 5, 16), BF16, g)
    w, bias = random_values((6, 16), BF16, g), random_values((6,), F32, g)
    out = carbon.linear(x, w, bias)
    flat = carbon.linear(x.reshape(-1, 16), w, bias)
    assert out.shape == (2, 3, 5, 6)
    same_bits(out.reshape(-1, 6), flat, "N-D vs flattened")
    same_bits(out[1, 2], carbon.linear(x[1, 2], w, bias), "one slice alone")
    assert_bits_equal(out, linear_bits(x, w, bias), "oracle")
