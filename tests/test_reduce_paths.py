"""carbon.sum / carbon.mean's CPU row and column loops give the same bits on every path: AVX-512 (chains in
the lanes of 512-bit registers), AVX2 (two registers of four chains) and the portable compiled
loop, each pair in two fresh processes (CARBON_NORM_SCALAR selects the portable loops,
CARBON_CPU_NO_AVX512 the AVX2 ones). A pair whose faster path the CPU lacks runs the same loops
twice and checks only that they are deterministic."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import sys, torch, carbon
torch.manual_seed(0)
results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for shape in ((3, 1), (5, 7), (4, 8), (6, 9), (3, 1000), (2, 40000)):
        x = (torch.randn(*shape) * torch.logspace(-4, 3, shape[1])).to(dtype)
        if shape[1] > 8:
            x[0, 2] = float("inf")
            x[1, 3] = -0.0
            x[-1] = x[-1] - x[-1].flip(0)  # cancellation: near-zero sums
        for fn in (carbon.sum, carbon.mean):
            results.append(fn(x, 1))
            results.append(fn(x, 1, dtype=torch.float32))
            results.append(fn(x, 0))  # columns
    for shape in ((1500, 37), (2100, 300)):  # column blocks of 16 and their tails, two row chunks
        x = (torch.randn(*shape) * torch.logspace(-4, 3, shape[1])).to(dtype)
        x[5, 3], x[7, 20] = float("inf"), -0.0
        x[:, -1] = x[:, -1] - x[:, -1].flip(0)
        results += [carbon.sum(x, 0), carbon.mean(x, 0)]
torch.save(results, sys.argv[1])
'''


def test_avx2_and_portable_sum_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_NORM_SCALAR",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_avx512_and_avx2_sum_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
