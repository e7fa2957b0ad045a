"""Selections among equal values under carbon.enable (docs/enable.md): sort, argsort, msort and topk are stable
(equal elements keep their index order, −0 and +0 are equal, NaN sorts above +∞); median, nanmedian and
kthvalue return the first element along the dimension that equals the selected value, with its own bits;
cummax and cummin the last element so far that equals the running value.

torch leaves these choices to each device's algorithm. The expected results here come from Python's own
stable sort and order statistics written in this file, at 1 and 2 threads, on data full of ties."""

from __future__ import annotations

import math

import pytest
import torch

import carbon
from tests.oracle import as_bits

THREADS = [1, 2]


pytestmark = pytest.mark.usefixtures("restore_num_threads", "carbon_disabled_after")


def _tied(rows, n, seed, dtype=torch.float32):
    """Values from {−3 … 3} with both zeros and some NaNs: almost every value repeats."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (rows, n), generator=g).to(torch.float32)
    x = torch.where(torch.rand(rows, n, generator=g) < 0.5, x, -x)  # −0 beside +0
    x[torch.rand(rows, n, generator=g) < 0.05] = math.nan
    return x.to(dtype)


def _key(v: float):
    return (math.isnan(v), 0.0 if math.isnan(v) else v)  # NaN above everything; −0 == +0


def _stable_order(row: list, descending: bool) -> list:
    return sorted(range(len(row)), key=lambda i: _key(row[i]), reverse=descending)  # Python's sort is stable


def _bits_row(t: torch.Tensor) -> list:
    return as_bits(t).tolist()


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_keep_equal_elements_in_index_order(threads, dtype, descending):
    torch.set_num_threads(threads)
    x = _tied(3, 5000, seed=1, dtype=dtype)
    with carbon.enabled():
        values, indices = torch.sort(x, dim=1, descending=descending)
        order = torch.argsort(x, dim=1, descending=descending)
        columns = torch.sort(x.t(), dim=0, descending=descending)
    for r in range(3):
        row = x[r].float().tolist()
        want = _stable_order(row, descending)
        assert indices[r].tolist() == want
        assert order[r].tolist() == want
        assert _bits_row(values[r]) == [as_bits(x[r])[i].item() for i in want]
        assert columns.indices[:, r].tolist() == want


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_is_the_head_of_the_stable_sort(threads, largest):
    torch.set_num_threads(threads)
    x = _tied(4, 3000, seed=2)
    with carbon.enabled():
        values, indices = torch.topk(x, 40, dim=1, largest=largest)
        unsorted = torch.topk(x, 40, dim=1, largest=largest, sorted=False)
    for r in range(4):
        want = _stable_order(x[r].tolist(), largest)[:40]
        assert indices[r].tolist() == want
        assert unsorted.indices[r].tolist() == want
        assert _bits_row(values[r]) == [as_bits(x[r])[i].item() for i in want]


def _first_equal(row: list, value: float) -> int:
    return next(i for i, v in enumerate(row) if v == value or (math.isnan(v) and math.isnan(value)))


def _lower_median(row: list, skip_nan: bool) -> float:
    kept = [v for v in row if not math.isnan(v)] if skip_nan else row
    if not kept:
        return math.nan
    if not skip_nan and any(math.isnan(v) for v in kept):
        return math.nan
    return sorted(kept)[(len(kept) - 1) // 2]


@pytest.mark.parametrize("threads", THREADS)
def test_median_nanmedian_and_kthvalue_return_the_first_equal_element(threads):
    torch.set_num_threads(threads)
    x = _tied(6, 999, seed=3)
    x[0] = torch.where(torch.isnan(x[0]), 1.0, x[0])  # a row without NaN: median is a number
    x[1, :] = math.nan  # nanmedian of an all-NaN row: NaN, the first index
    x[2] = torch.where(torch.isnan(x[2]), 0.0, x[2]) * 0  # only ±0: which zero comes back matters
    with carbon.enabled():
        median = x.median(dim=1)
        nanmedian = x.nanmedian(dim=1, keepdim=True)
        kth = x.kthvalue(500, dim=1)
        whole = x[2].median()
    bits = as_bits(x)
    for r in range(6):
        row = x[r].tolist()
        for name, result, value in (
                ("median", median, _lower_median(row, skip_nan=False)),
                ("nanmedian", nanmedian, _lower_median(row, skip_nan=True)),
                ("kthvalue", kth, sorted(row, key=_key)[499])):
            i = _first_equal(row, value)
            assert result.indices[r].item() == i, (name, r)
            assert as_bits(result.values[r]).reshape(-1).tolist() == [bits[r, i].item()], (name, r)
    assert as_bits(whole).item() == bits[2, _first_equal(x[2].tolist(), 0.0)].item()


def test_out_variants_and_gradients():
    x = _tied(2, 50, seed=4)
    x = torch.where(torch.isnan(x), 2.0, x)
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.int64)
    with carbon.enabled():
        torch.sort(x, 1, out=(values, indices))
        med_v, med_i = torch.empty(0), torch.empty(0, dtype=torch.int64)
        torch.median(x, 1, out=(med_v, med_i))
        leaf = x.clone().requires_grad_()
        leaf.topk(5, dim=1).values.sum().backward()
    for r in range(2):
        want = _stable_order(x[r].tolist(), False)
        assert indices[r].tolist() == want
        assert med_i[r].item() == _first_equal(x[r].tolist(), _lower_median(x[r].tolist(), False))
        top = set(_stable_order(x[r].tolist(), True)[:5])
        assert leaf.grad[r].tolist() == [1.0 if i in top else 0.0 for i in range(50)]


def test_errors_are_torchs():
    x = _tied(2, 5, seed=5)
    with carbon.enabled():
        with pytest.raises(RuntimeError, match="selected index k out of range|k"):
            x.topk(9)
        with pytest.raises(IndexError):
            x.sort(dim=3)
        with pytest.raises((IndexError, RuntimeError)):
            x.kthvalue(9, dim=1)


def _running(row: list, larger: bool) -> tuple:
    """The indices of cummax / cummin by torch's CPU loop: take x when it is NaN or, while the running value is not NaN,
    when it is >= (cummin: <=) the running value."""
    indices, best, at = [], None, -1
    for i, v in enumerate(row):
        if best is None or math.isnan(v) or (not math.isnan(best) and (v >= best if larger else v <= best)):
            best, at = v, i
        indices.append(at)
    return indices


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_and_cummin_take_the_last_equal_element(threads, op):
    torch.set_num_threads(threads)
    x = _tied(3, 2000, seed=6)
    x[0] = torch.where(torch.isnan(x[0]), 0.0, x[0])  # a row where ±0 and repeats decide, no NaN
    with carbon.enabled():
        got = getattr(torch, op)(x, dim=1)
        columns = getattr(torch, op)(x.t(), dim=0)
    bits = as_bits(x)
    for r in range(3):
        want = _running(x[r].tolist(), op == "cummax")
        assert got.indices[r].tolist() == want
        assert columns.indices[:, r].tolist() == want
        assert _bits_row(got.values[r]) == [bits[r, i].item() for i in want]


def _mode_of(row: list) -> int:
    """The index found by counting: the most frequent value (each NaN counts once, NaN ≠ NaN), the smallest of
    ties (NaN largest), and the last index holding it."""
    counts = {}
    for i, v in enumerate(row):
        key = ("nan", i) if math.isnan(v) else v  # −0.0 == 0.0: one key
        counts[key] = counts.get(key, 0) + 1
    top = max(counts.values())
    best = min((k for k, c in counts.items() if c == top), key=lambda k: (isinstance(k, tuple), 0.0 if isinstance(k, tuple) else k))
    return max(i for i, v in enumerate(row) if (math.isnan(v) if isinstance(best, tuple) else v == best))


@pytest.mark.parametrize("threads", THREADS)
def test_mode_is_the_smallest_most_frequent_value_at_its_last_index(threads):
    torch.set_num_threads(threads)
    x = _tied(6, 400, seed=7)
    x[1] = torch.where(torch.isnan(x[1]), 0.0, x[1])
    x[2, :] = math.nan
    x[2, 5] = x[2, 9] = 1.0  # many NaNs, each counting once: 1.0 (twice) is the mode
    x[3, :] = math.nan  # all NaN: the mode is NaN, at the last index
    with carbon.enabled():
        got = torch.mode(x, dim=1)
        kept = torch.mode(x.t(), dim=0, keepdim=True)
    bits = as_bits(x)
    for r in range(6):
        i = _mode_of(x[r].tolist())
        assert got.indices[r].item() == i and kept.indices[0, r].item() == i, r
        assert as_bits(got.values[r]).item() == bits[r, i].item(), r


def test_outputs_are_contiguous_and_bad_dims_are_torchs_errors():
    x = _tied(4, 10, seed=8)
    with carbon.enabled():
        top = torch.topk(x, 3)
        assert top.values.is_contiguous() and top.indices.is_contiguous()
        assert top.values.view(-1).shape == (12,)
        for call in (lambda: x.median(dim=2), lambda: x.kthvalue(1, dim=-3), lambda: x.mode(dim=5),
                     lambda: x.cummax(dim=2), lambda: torch.topk(x, 2, dim=3),
                     lambda: x.scatter(2, torch.zeros(4, 3, dtype=torch.int64), x[:, :3])):
            with pytest.raises(IndexError):
                call()
