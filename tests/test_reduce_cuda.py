"""carbon.sum / carbon.mean / carbon.round_to on a CUDA GPU return the same
bits as on the CPU (both the correctly rounded result): random and
adversarial data, every dtype pair, long rows (1M elements) and full
reductions that span many blocks, ties, special values, gradients, CUDA
graphs, no host synchronization, batch invariance. Skipped without a GPU."""

import math
import random

import pytest
import torch

import carbon
from cuda_graphs import capture
from data import (
    BF16, DTYPE_PAIRS, DTYPES, F16, F32, dim_spellings, exact_tensor, finite_bit_patterns, generator,
    midpoint_mean_rows, random_values, reduction_values, tie_rows,
)
from oracle import (
    as_bits, assert_bits_equal, bits_tensor, mean_bits, round_bits, round_to_bits, row_quotient_bits, sum_bits,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
INF, NAN = math.inf, math.nan
ORACLE = {"sum": sum_bits, "mean": mean_bits}


def op_of(name):
    return getattr(carbon, name)


def same_bits(gpu, cpu, context=""):
    assert gpu.device.type == DEV, f"{context}: result on {gpu.device}"
    assert gpu.dtype == cpu.dtype and tuple(gpu.shape) == tuple(cpu.shape), (
        f"{context}: {gpu.dtype} {tuple(gpu.shape)} vs {cpu.dtype} {tuple(cpu.shape)}")
    # Flattened: on a 0-dim tensor nonzero() has shape (1, 0) when the bits
    # differ, so its numel() is 0 and a 0-dim mismatch would pass unseen.
    got, want = as_bits(gpu).reshape(-1), as_bits(cpu).reshape(-1)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{context}: {bad.numel()} of {got.numel()} outputs differ between GPU and CPU, first at flat index "
        f"{bad[:5].tolist()}: GPU {gpu.detach().cpu().reshape(-1)[bad[0]].item()!r} vs "
        f"CPU {cpu.detach().reshape(-1)[bad[0]].item()!r}")


def both(op, x, dim=None, keepdim=False, dtype=None, context=""):
    """op on the GPU and on the CPU: same bits. Returns the GPU result."""
    f = op_of(op)
    out = f(x.to(DEV), dim, keepdim, dtype=dtype)
    same_bits(out, f(x, dim, keepdim, dtype=dtype), f"{op} {tuple(x.shape)} dim={dim} keepdim={keepdim} {context}")
    return out


# ---------------------------------------------------------------- random data

SHAPES = [(7,), (0,), (1,), (33, 65), (3, 0), (4, 1, 6), (5, 17, 9), (2, 0, 3), (3, 2, 1, 40), ()]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_random_gpu_equals_cpu(op, shape, in_dtype, out_dtype):
    g = generator(201)
    x = reduction_values(shape, in_dtype, g, dim=-1 if shape else None, spread=3 if F16 in (in_dtype, out_dtype) else 20)
    dims = dim_spellings(len(shape)) if len(shape) <= 3 else [None, 0, -1, (1, 3), [0, 2, 3]]
    for dim in dims if shape else [None, 0, -1]:
        for keepdim in (False, True):
            both(op, x, dim, keepdim, out_dtype)


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (BF16, None), (F16, None), (F32, BF16),
                                                (F32, F16)])
def test_long_rows_and_full_reductions(op, in_dtype, out_dtype):
    """1M-element rows and full reductions (many blocks per output), with
    cancelling halves so that the exact tiers run; the oracle on a subset."""
    g = generator(202)
    spread = 3 if F16 in (in_dtype, out_dtype) else 30
    flat = reduction_values((1 << 20,), in_dtype, g, dim=0, spread=spread)
    x = reduction_values((4, 1 << 18), in_dtype, g, dim=1, spread=spread)
    x[1, 1 << 17:] = -x[1, : 1 << 17]
    x[1, 5] += 1.0 if in_dtype != F16 else 0.5
    out_flat = both(op, flat, None, False, out_dtype, "1M full reduction")
    both(op, flat, 0, True, out_dtype, "1M dim 0 keepdim")
    out_rows = both(op, x, 1, False, out_dtype, "4 rows of 256k")
    both(op, x, None, False, out_dtype, "all of (4, 256k)")
    both(op, x.t(), 0, False, out_dtype, "columns of the transpose")
    both(op, x.reshape(4, 512, 512), (0, 2), False, out_dtype, "dims (0, 2)")
    both(op, x, 0, False, out_dtype, "short columns, many outputs")
    assert_bits_equal(out_flat.cpu(), ORACLE[op](flat, None, False, out_dtype), "1M vs oracle")
    assert_bits_equal(out_rows.cpu()[:2], ORACLE[op](x[:2], 1, False, out_dtype), "rows vs oracle")


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("n", [31, 32, 33, 255, 256, 257, 1023, 1025, 4097, 65537])
def test_row_lengths_around_block_and_warp_sizes(op, n):
    g = generator(203 + n)
    x = reduction_values((6, n), F32, g, dim=1, spread=30)
    x[2, n // 2 : 2 * (n // 2)] = -x[2, : n // 2]
    out = both(op, x, 1, False, None, f"n={n}")
    both(op, x, 1, False, BF16, f"n={n} -> bf16")
    both(op, x.t().contiguous(), 0, False, None, f"n={n} columns")
    assert_bits_equal(out.cpu(), ORACLE[op](x, 1), f"n={n} vs oracle")


# ---------------------------------------------------------------- ties, midpoints, specials

NUDGES = {"tie": 0.0, "just-above": 2.0**-60, "just-below": -(2.0**-60), "near-above": 2.0**-30, "near-below": -(2.0**-30)}


@pytest.mark.parametrize("nudge", NUDGES.values(), ids=NUDGES.keys())
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_sum_ties_gpu_equals_cpu_and_oracle(in_dtype, out_dtype, nudge):
    rng = random.Random(f"gpu{in_dtype}{out_dtype}{nudge}")
    x = exact_tensor(tie_rows(in_dtype, out_dtype, 96, 24, nudge, rng, pairs=4), in_dtype)
    out = both("sum", x, 1, False, out_dtype, "ties")
    both("sum", x.t(), 0, False, out_dtype, "ties, transposed")
    assert_bits_equal(out.cpu(), sum_bits(x, 1, dtype=out_dtype), "oracle")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("nudge", [0.0, 2.0**-60, -(2.0**-60)], ids=["tie", "just-above", "just-below"])
def test_sum_ties_hidden_in_long_rows(out_dtype, nudge):
    """A tie (or a near-tie) planted in rows of 100k elements with ~50k
    cancelling pairs, shuffled: the partial sums of every block are large
    and only cancel when merged."""
    rng = random.Random(f"gpulong{out_dtype}{nudge}")
    g = generator(213)
    planted = exact_tensor(tie_rows(F32, out_dtype, 4, 16, nudge, rng, pairs=2), F32)
    v = random_values((4, 49_992), F32, g, spread=30 if out_dtype != F16 else 3)
    x = torch.cat([planted, v, -v], dim=1)
    x = x.gather(1, torch.rand(x.shape, generator=g).argsort(dim=1))
    out = both("sum", x, 1, False, out_dtype, "long rows")
    both("sum", x.t(), 0, False, out_dtype, "long columns")
    assert_bits_equal(out.cpu(), sum_bits(planted, 1, dtype=out_dtype), "oracle (the pairs cancel)")


@pytest.mark.parametrize("in_dtype,out_dtype,eps_rel_exp", [(F32, F32, -80), (BF16, BF16, -80), (F32, BF16, -30),
                                                            (F16, F16, -25), (BF16, F32, -80)])
@pytest.mark.parametrize("toward", ["odd", "even", "tie"])
@pytest.mark.parametrize("n", [7, 100, 3001])
def test_mean_near_midpoints_gpu_equals_cpu_and_oracle(in_dtype, out_dtype, eps_rel_exp, toward, n):
    rng = random.Random(f"gpumid{in_dtype}{out_dtype}{toward}{n}")
    rows, values = midpoint_mean_rows(in_dtype, out_dtype, 32, n, eps_rel_exp, rng, toward,
                                      pairs=1 if n < 100 else 40, max_tries=5000)
    assert len(rows) >= 8
    x = exact_tensor(rows, in_dtype)
    want = bits_tensor([round_bits(v, out_dtype) for v in values], out_dtype)
    out = both("mean", x, 1, False, out_dtype, "midpoints")
    both("mean", x.t(), 0, False, out_dtype, "midpoints, transposed")
    assert_bits_equal(out.cpu(), want, "construction")


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_special_values_and_signed_zeros_gpu_equals_cpu(op):
    vals = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 2.0**-149, -(2.0**-149), 2.0**100, -(2.0**100), 3e38, -3e38]
    rng = random.Random(204)
    x = torch.tensor([[rng.choice(vals) for _ in range(5)] for _ in range(300)], dtype=F32)
    zeros = torch.tensor([[rng.choice([0.0, -0.0]) for _ in range(3)] for _ in range(64)], dtype=F32)
    nan_payloads = torch.tensor([0x7FC12345, -1, 0x7F800001, 0x3F800000], dtype=torch.int32).view(F32)
    for out_dtype in DTYPES:
        both(op, x, 1, False, out_dtype, "specials")
        both(op, x, 0, False, out_dtype, "specials, columns")
        both(op, zeros, 1, False, out_dtype, "signed zeros")
        both(op, nan_payloads, None, False, out_dtype, "NaN payloads")
        both(op, torch.zeros(5, 0), 1, False, out_dtype, "empty rows")
        assert_bits_equal(op_of(op)(x.to(DEV), 1, dtype=out_dtype).cpu(), ORACLE[op](x, 1, False, out_dtype), "oracle")
    empty = op_of(op)(torch.zeros(3, 0, device=DEV), 1)
    assert_bits_equal(empty.cpu(), bits_tensor([0x7FC00000 if op == "mean" else 0] * 3, F32), "empty -> +0 / NaN")


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype,scale", [(F32, F32, -140), (BF16, BF16, -128), (F16, F16, -20),
                                                      (F32, F16, -20), (F32, F32, 124), (F16, F16, 13), (BF16, BF16, 124)])
def test_subnormal_and_overflowing_results(op, in_dtype, out_dtype, scale):
    g = generator(205)
    x = random_values((64, 40), in_dtype, g, spread=2, scale_exp=scale).abs()
    x[::2, :10] = -x[::2, :10]
    out = both(op, x, 1, False, out_dtype, f"scale 2^{scale}")
    assert_bits_equal(out.cpu()[:4], ORACLE[op](x[:4], 1, False, out_dtype), "oracle")


# ---------------------------------------------------------------- layouts, batch invariance

@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype", DTYPES)
def test_layouts_and_batch_invariance_on_the_gpu(op, in_dtype):
    g = generator(206)
    base = reduction_values((64, 30, 129), in_dtype, g, dim=(0, 2), spread=3 if in_dtype == F16 else 20).to(DEV)
    f = op_of(op)
    for name, v in {"transposed": base.transpose(0, 2), "sliced": base[::2, 1::3],
                    "expanded": base[:, :1].expand(64, 7, 129), "permuted": base.permute(2, 0, 1)}.items():
        for dim in [None, 0, 2, (0, 2), [1, -1]]:
            same_bits(f(v, dim), f(v.contiguous(), dim).cpu(), f"{name} dim {dim} vs contiguous")
            same_bits(f(v, dim), f(v.cpu(), dim), f"{name} dim {dim} vs CPU")
    rows = base.reshape(64, -1)
    full = f(rows, 1).cpu()
    for size in (1, 3, 64):
        for start in range(0, 64, max(size, 16)):
            same_bits(f(rows[start : start + size], 1), full[start : start + size], f"rows {start}:{start + size}")
    cols = f(rows.t(), 0).cpu()
    same_bits(f(rows.t().contiguous(), 0), cols, "columns, contiguous vs strided")
    same_bits(f(rows.t()[:, 5:6], 0), cols[5:6], "one column alone")


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None), (BF16, BF16), (F32, F16)])
def test_gradients_gpu_equal_cpu(op, in_dtype, out_dtype):
    g = generator(207)
    x = random_values((6, 7, 33), in_dtype, g)
    for dim, keepdim in [(None, False), (1, False), ((0, 2), True), ([-1], False)]:
        results = []
        for device in (DEV, "cpu"):
            leaf = x.to(device).requires_grad_(True)
            y = op_of(op)(leaf, dim, keepdim, dtype=out_dtype)
            grad = random_values(y.shape, y.dtype, generator(208), spread=40 if F16 not in (in_dtype, out_dtype) else 6)
            y.backward(grad.to(device))
            results.append((y, leaf.grad))
        (gy, gdx), (cy, cdx) = results
        same_bits(gy, cy, f"{op} forward dim {dim}")
        same_bits(gdx, cdx, f"{op} grad dim {dim}")


# ---------------------------------------------------------------- round_to

@pytest.mark.parametrize("src", [BF16, F16])
@pytest.mark.parametrize("dst", DTYPES)
def test_round_to_every_16_bit_pattern(src, dst):
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(src)
    out = carbon.round_to(x.to(DEV), dst)
    same_bits(out, carbon.round_to(x, dst), f"{src} -> {dst}")
    assert_bits_equal(out.cpu(), round_to_bits(x, dst), "oracle")


@pytest.mark.parametrize("dst", DTYPES)
def test_round_to_float32_patterns(dst):
    rng = random.Random(209)
    vals = finite_bit_patterns(20_000, rng, 0, 255)  # exponent field 255: infinities and NaNs too
    x = torch.tensor(vals, dtype=F32)
    mids = torch.arange(0, 1 << 24, 97, dtype=torch.int32)  # low 24 bits sweep, every exponent below
    sweep = torch.cat([(mids | (e << 23)) for e in range(0, 256, 5)] + [(mids | (e << 23)) | (1 << 31) for e in (0, 100, 254)])
    assert sweep.dtype == torch.int32
    for name, t in (("random", x), ("sweep", sweep.view(F32)), ("2-D strided", x.reshape(100, 200).t())):
        out = carbon.round_to(t.to(DEV), dst)
        same_bits(out, carbon.round_to(t, dst), f"{name} -> {dst}")
    assert_bits_equal(carbon.round_to(x.to(DEV), dst).cpu(), round_to_bits(x, dst), "oracle")


# ---------------------------------------------------------------- CUDA graphs, host syncs

def test_cuda_graph_capture_and_replay():
    g = generator(210)
    rng = random.Random(211)
    x0 = exact_tensor(tie_rows(F32, F32, 64, 48, 0.0, rng), F32)
    static_x = x0.to(DEV)
    graph, (s_rows, m_cols, r16, s_all) = capture(
        lambda: (carbon.sum(static_x, 1), carbon.mean(static_x, 0, dtype=BF16), carbon.round_to(static_x, F16),
                 carbon.sum(static_x)), warmups=2)
    for new_x in (x0, random_values((64, 48), F32, g), exact_tensor(tie_rows(F32, F32, 64, 48, 2.0**-60, rng), F32)):
        static_x.copy_(new_x.to(DEV))
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(s_rows.cpu(), as_bits(carbon.sum(new_x, 1)), "graph: sum rows")
        assert_bits_equal(m_cols.cpu(), as_bits(carbon.mean(new_x, 0, dtype=BF16)), "graph: mean columns")
        assert_bits_equal(r16.cpu(), as_bits(carbon.round_to(new_x, F16)), "graph: round_to")
        assert_bits_equal(s_all.cpu(), as_bits(carbon.sum(new_x)), "graph: full sum")
        assert_bits_equal(s_rows.cpu(), sum_bits(new_x, 1), "graph vs oracle")


def test_no_host_synchronization():
    g = generator(212)
    x = reduction_values((64, 4096), BF16, g, dim=1).to(DEV)
    big = reduction_values((1 << 20,), F32, g, dim=0).to(DEV)
    leaf = x.detach().clone().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [
            carbon.sum(x, 1), carbon.sum(x, 0, dtype=F32), carbon.mean(x, (0, 1)), carbon.mean(x, 1, dtype=F16),
            carbon.sum(big), carbon.mean(big), carbon.round_to(big, BF16), carbon.round_to(x, F32),
            carbon.sum(torch.empty(3, 0, device=DEV), 1), carbon.mean(torch.empty(3, 0, device=DEV), 1),
        ]
        y = carbon.mean(leaf, 1, dtype=F32)
        y.backward(torch.ones_like(y))
        z = carbon.sum(leaf, (0, 1))
        z.backward(torch.ones_like(z))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    same_bits(outs[0], carbon.sum(x.cpu(), 1), "sum after sync-free run")
    same_bits(outs[5], carbon.mean(big.cpu()), "mean after sync-free run")


# ---------------------------------------------------------------- cumsum_rows

def cumsum(x, out_dtype=None):
    return torch.ops.carbon.cumsum_rows(x, out_dtype)


def cumsum_oracle_bits(x, out_dtype=None):
    """RN(x[r, 0] + ... + x[r, i]) of every prefix, from tests/oracle.py."""
    dtype = out_dtype or x.dtype
    rows = x.double().tolist()
    return bits_tensor([[row_quotient_bits(row[: i + 1], 1, dtype) for i in range(len(row))] for row in rows], dtype)


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_cumsum_rows_gpu_equals_cpu(in_dtype, out_dtype):
    """One GPU thread per row (csrc/reduce/cumsum_cuda.cu): random rows, many
    rows (several per thread over the grid), long rows, empty shapes."""
    g = generator(220)
    for shape in ((1, 1), (3, 7), (5000, 3), (300, 65), (2, 5000), (1, 1 << 16), (0, 4), (4, 0)):
        x = random_values(shape, in_dtype, g)
        out = cumsum(x.to(DEV), out_dtype)
        same_bits(out, cumsum(x, out_dtype), f"cumsum {shape} {in_dtype}->{out_dtype}")
    x = random_values((3, 40), in_dtype, g)
    assert_bits_equal(cumsum(x.to(DEV), out_dtype).cpu(), cumsum_oracle_bits(x, out_dtype), "cumsum vs oracle")


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (F32, BF16), (BF16, None), (F16, F32)])
def test_cumsum_rows_ties_specials_and_layouts(in_dtype, out_dtype):
    """Prefixes on ties and cancellations (the exact accumulator's path),
    NaN / inf / signed zeros, and non-contiguous inputs."""
    rng = random.Random(221)
    ties = exact_tensor(tie_rows(in_dtype, out_dtype or in_dtype, 32, 48, 0.0, rng), in_dtype)
    big = 2.0**100 if in_dtype == F32 else 2.0**12
    special = torch.tensor([  # every value exact in each dtype
        [big, 1.0, -big, 3.0, -1.0, 0.5],
        [-0.0, -0.0, 0.0, -0.0, 1.0, -1.0],
        [1.0, NAN, 2.0, 3.0, -INF, 1.0],
        [INF, 1.0, -INF, 2.0, 0.0, 0.0],
        [-INF, -INF, 1.0, 2.0, -0.0, 0.0],
    ], dtype=torch.float64).to(in_dtype)
    for name, x in (("ties", ties), ("specials", special)):
        out = cumsum(x.to(DEV), out_dtype)
        same_bits(out, cumsum(x, out_dtype), f"cumsum {name} {in_dtype}->{out_dtype}")
        assert_bits_equal(out.cpu(), cumsum_oracle_bits(x, out_dtype), f"cumsum {name} vs oracle")
    wide = random_values((48, 70), in_dtype, generator(222))
    for name, view in (("transposed", lambda t: t.t()), ("strided", lambda t: t[:, ::3]), ("offset", lambda t: t[5:, 7:])):
        out = cumsum(view(wide.to(DEV)), out_dtype)
        same_bits(out, cumsum(view(wide), out_dtype), f"cumsum {name} {in_dtype}->{out_dtype}")


def test_cumsum_rows_no_sync_and_cuda_graph():
    rng = random.Random(223)
    x0 = exact_tensor(tie_rows(F32, F32, 64, 48, 0.0, rng), F32)
    static_x = x0.to(DEV)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = cumsum(static_x, BF16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    same_bits(eager, cumsum(x0, BF16), "cumsum after a sync-free run")
    graph, out = capture(lambda: cumsum(static_x))
    for new_x in (x0, random_values((64, 48), F32, generator(224)),
                  exact_tensor(tie_rows(F32, F32, 64, 48, 2.0**-60, rng), F32)):
        static_x.copy_(new_x.to(DEV))
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(out.cpu(), as_bits(cumsum(new_x)), "graph: cumsum_rows")
