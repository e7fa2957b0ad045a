"""The indexed accumulations' CPU loops give the same bits: embedding backward, index_add and
scatter_add computed in fresh processes on the AVX2 loops and on the portable ones
(CARBON_CPU_NO_AVX2, with AVX-512 switched off in both), and on the fastest loops against the
AVX2-or-portable ones (CARBON_CPU_NO_AVX512). The inputs reach every tier: segments certified
exact (short, similar magnitudes), float32 tiers of 16-bit formats (segments of <= 32 terms) and
fp64 ones (longer), the interval decision and the exact accumulator (cancellation, ties, zero
sums, subnormal and overflowing results, inf and NaN), widths that are not multiples of 4, 8 or
16 and widths over one block of 256 columns. On a CPU without the faster loops both runs take the
same loops, and the comparison checks only that they are deterministic."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import sys, torch, carbon
g = torch.Generator().manual_seed(0)
TINY = {torch.float32: 1e-42, torch.bfloat16: 1e-40, torch.float16: 1e-7}
BIG = {torch.float32: 1e38, torch.bfloat16: 1e38, torch.float16: 3e4}

def values(n, width, dtype, seed):
    """Rows of terms: random magnitudes, a few integers (exact ties), zeros of both signs,
    subnormals, rows that cancel others, large values that overflow, inf and NaN."""
    gg = torch.Generator().manual_seed(seed)
    x = torch.randn((n, width), generator=gg) * torch.logspace(-2, 2, width)
    kind = torch.randint(0, 10, (n, width), generator=gg)
    x = torch.where(kind == 0, torch.randint(-4, 5, (n, width), generator=gg).float() * 0.5, x)
    x = torch.where(kind == 1, torch.full_like(x, 0.0) * torch.sign(torch.randn(n, width, generator=gg)), x)
    x = torch.where(kind == 2, torch.full_like(x, TINY[dtype]) * torch.randint(-3, 4, (n, width), generator=gg), x)
    x = x.to(dtype)
    if n >= 4:
        x[1::4] = -x[0::4][: x[1::4].shape[0]]          # cancellation (sums of exactly 0 where they share a row)
    if width > 5 and n > 6:
        x[2, 3] = BIG[dtype]; x[5, 3] = BIG[dtype]      # overflow when both land on one row
        x[3, 5] = float("inf"); x[6, 5] = float("-inf")
        x[4, width - 1] = float("nan")
    x[:, 0] = -0.0                                      # a column of -0
    return x

results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for width in (1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257, 300):
        for n, rows in ((40, 6), (300, 5), (64, 200)):   # many duplicates, long segments, mostly single terms
            seed = width * 1000 + n
            idx = torch.randint(0, rows, (n,), generator=g)
            idx[: min(n, 3)] = 0                         # one row gets the cancelling pairs' first terms
            src = values(n, width, dtype, seed)
            results.append(torch.ops.carbon.embedding_backward(src, idx, rows + 1, -1))
            self_ = values(rows + 1, width, dtype, seed + 1)
            results.append(carbon.index_add(self_, 0, idx, src))
            if width <= 17:
                sidx = torch.randint(0, 4, (n, width), generator=g)
                results.append(carbon.scatter_add(values(4, width, dtype, seed + 2), 0, sidx, src))
                results.append(carbon.scatter_add(values(width, 4, dtype, seed + 3), 1, sidx.t().contiguous(), src.t()))
torch.save(results, sys.argv[1])
'''


def test_avx2_and_portable_scatter_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX2",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_fastest_and_slower_scatter_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
