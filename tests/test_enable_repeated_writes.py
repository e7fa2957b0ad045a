"""Copies to repeated indices under carbon.enable: the last write wins (docs/enable.md).

torch leaves the winner unspecified when an index repeats in ``scatter`` (src) or in ``index_put`` /
``x[idx] = v`` without accumulation: CUDA writes in any order, and torch's CPU index_put writes in parallel
chunks (with 2 threads its winners vary from run to run). Under carbon.enable the write that comes last in
the index order wins. Each test builds the expected tensor with a plain Python loop that performs the writes
one by one in that order, and checks at 1 and 2 threads."""

from __future__ import annotations

import itertools

import pytest
import torch

import carbon

THREADS = [1, 2]


pytestmark = pytest.mark.usefixtures("restore_num_threads", "carbon_disabled_after")


def _ints(*shape, high, seed):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _values(*shape, seed, dtype=torch.float32):
    v = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return v.to(dtype) if dtype.is_floating_point else (v * 100).to(dtype)


def _scatter_in_order(x, dim, index, src):
    """torch.scatter by its definition, the writes in row-major order of index (along dim: increasing)."""
    out = x.clone()
    for p in itertools.product(*(range(s) for s in index.shape)):
        dest = list(p)
        dest[dim] = int(index[p])
        out[tuple(dest)] = src[p]
    return out


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_scatter_lets_the_last_write_along_dim_win(threads, dtype, dim):
    torch.set_num_threads(threads)
    x = _values(4, 5, 6, seed=1, dtype=dtype)
    d = dim % 3
    shape = [3, 4, 5]
    shape[d] = 9  # more writes than destinations: many repeats
    index = _ints(*shape, high=x.shape[d], seed=2 + d)
    src = _values(10, 10, 10, seed=3, dtype=dtype)  # larger than index: only its leading block is read
    want = _scatter_in_order(x, d, index, src)
    with carbon.enabled():
        got = x.scatter(dim, index, src)
        inplace = x.clone().scatter_(dim, index, src)
        out = torch.empty_like(x)
        torch.scatter(x, dim, index, src, out=out)
    for name, t in (("scatter", got), ("scatter_", inplace), ("out=", out)):
        assert torch.equal(t, want), name


def test_scatter_of_one_value_and_without_repeats_is_torchs():
    x = _values(5, 4, seed=4)
    index, one_row = _ints(7, 4, high=5, seed=5), _values(1, 4, seed=6)  # (drawn before: enable routes randn)
    with carbon.enabled():
        filled = x.scatter(0, index, 2.5)
        single = x.scatter(0, index[:1], one_row)
    assert torch.equal(filled, x.scatter(0, index, 2.5))
    assert torch.equal(single, x.scatter(0, index[:1], one_row))


def test_scatter_with_reduce_is_still_refused():
    x, index = _values(5, 4, seed=7), _ints(3, 4, high=5, seed=8)
    with carbon.enabled(), pytest.raises(carbon.NotExactError, match="scatter with reduce="):
        x.scatter(0, index, _values(3, 4, seed=9), reduce="add")


def test_scatter_errors_are_torchs():
    x, src, wide = _values(5, 4, seed=10), _values(2, 4, seed=11), _values(3, 4, seed=13, dtype=torch.float64)
    index = _ints(3, 4, high=5, seed=12)
    with carbon.enabled():
        with pytest.raises(RuntimeError, match="out of bounds"):
            x.scatter(0, torch.tensor([[0, 1, 7, 2], [1, 1, 1, 1]]), src)
        with pytest.raises(RuntimeError, match="dtype"):
            x.scatter(0, index, wide)


# ---- index_put without accumulation --------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", THREADS)
def test_index_put_many_repeats_last_write_wins(threads):
    """400k writes into 1000 rows: torch's own CPU kernel gives other winners with 2 threads."""
    torch.set_num_threads(threads)
    index = _ints(400_000, high=1000, seed=14)
    values = torch.arange(400_000, dtype=torch.float32)
    want = torch.full((1000,), -1.0)
    last = {}
    for pos, dest in enumerate(index.tolist()):
        last[dest] = pos
    for dest, pos in last.items():
        want[dest] = float(pos)
    with carbon.enabled():
        got = torch.full((1000,), -1.0)
        got[index] = values
        functional = torch.index_put(torch.full((1000,), -1.0), (index,), values)
    assert torch.equal(got, want)
    assert torch.equal(functional, want)


def _put_in_order(x, writes):
    """writes: (destination index tuple, value) pairs in index order, applied one by one."""
    out = x.clone()
    for dest, value in writes:
        out[dest] = value
    return out


@pytest.mark.parametrize("threads", THREADS)
def test_index_put_rows_with_repeats_and_negative_indices(threads):
    torch.set_num_threads(threads)
    x = _values(6, 3, seed=15)
    i = torch.tensor([1, 2, 1, -5, 5, -1, 0])  # -5 is row 1 again, -1 row 5
    v = _values(7, 3, seed=16)
    want = _put_in_order(x, [((int(r) % 6,), v[b]) for b, r in enumerate(i)])
    row = _values(3, seed=17)  # one row broadcast to every write: repeats write the same values
    with carbon.enabled():
        got = x.clone()
        got[i] = v
        broadcast = x.clone()
        broadcast[i] = row
    assert torch.equal(got, want)
    assert torch.equal(broadcast, _put_in_order(x, [((int(r) % 6,), row) for r in i]))


@pytest.mark.parametrize("threads", THREADS)
def test_index_put_adjacent_broadcast_indices(threads):
    """x[:, i, j] = v with i (4, 1) and j (1, 5) broadcast to (4, 5): the index dimensions stay in place."""
    torch.set_num_threads(threads)
    x = _values(3, 4, 5, seed=18)
    i, j = _ints(4, 1, high=2, seed=19), _ints(1, 5, high=3, seed=20)
    v = _values(3, 4, 5, seed=21)
    writes = [((slice(None), int(i[a, 0]), int(j[0, b])), v[:, a, b]) for a in range(4) for b in range(5)]
    with carbon.enabled():
        got = x.clone()
        got[:, i, j] = v
    assert torch.equal(got, _put_in_order(x, writes))


@pytest.mark.parametrize("threads", THREADS)
def test_index_put_non_adjacent_indices_put_the_index_dimensions_first(threads):
    """x[i, :, j] = v: indexed dimensions 0 and 2 are apart, so v is laid out as (index shape, 3)."""
    torch.set_num_threads(threads)
    x = _values(4, 3, 5, seed=22)
    i, j = _ints(6, high=2, seed=23), _ints(6, high=2, seed=24)
    v = _values(6, 3, seed=25, dtype=torch.bfloat16)
    xb = x.to(torch.bfloat16)
    writes = [((int(i[b]), slice(None), int(j[b])), v[b]) for b in range(6)]
    with carbon.enabled():
        got = xb.clone()
        got[i, :, j] = v
    assert torch.equal(got, _put_in_order(xb, writes))


@pytest.mark.parametrize("threads", THREADS)
def test_index_put_boolean_mask_with_an_integer_index(threads):
    """A mask on dimension 0 beside integer indices on dimension 1: the mask's rows pair with the indices."""
    torch.set_num_threads(threads)
    x = _values(5, 4, seed=26)
    mask = torch.tensor([True, False, True, True, False])
    j = torch.tensor([2, 2, 0])
    v = _values(3, seed=27)
    rows, row_values = [0, 2, 3], _values(3, 4, seed=28)
    with carbon.enabled():
        got = x.clone()
        got[mask, j] = v
        masked = x.clone()
        masked[mask] = row_values
    assert torch.equal(got, _put_in_order(x, [((r, int(c)), v[b]) for b, (r, c) in enumerate(zip(rows, j))]))
    want = x.clone()
    want[[0, 2, 3]] = row_values
    assert torch.equal(masked, want)


def test_index_put_errors_are_torchs():
    x, three, two = _values(5, 4, seed=29), _values(3, 4, seed=30), _values(2, 4, seed=31)
    with carbon.enabled():
        with pytest.raises(IndexError, match="out of bounds"):
            x[torch.tensor([0, 9, 0])] = three
        with pytest.raises(RuntimeError, match="shape mismatch"):
            x[torch.tensor([0, 1, 0])] = two
        with pytest.raises(RuntimeError, match="dtype"):
            x.index_put_((torch.tensor([0, 1, 0]),), three.double())
