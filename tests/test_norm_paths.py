"""layer_norm / rms_norm give the same bits on every CPU path: the AVX2 loops (csrc/norm/norm_cpu.cpp,
two registers of four doubles per eight chains, NaN lanes by compares, round-to-odd built from the
nearest-even conversion) against the portable ones (CARBON_CPU_NO_AVX2, with AVX-512 switched off
in both runs), and the fastest loops against the next ones (CARBON_CPU_NO_AVX512). Forward and
backward (dx, dweight, dbias, with and without weight and bias) on rows that reach the lanes, the
tails (n not a multiple of 8, n < 8), the fallbacks (NaN, inf, overflow, signed zeros, subnormal
inputs and outputs, a large mean against a small spread, ties) and the 16-bit formats. On a CPU
without the faster loops both runs take the same ones and the test checks determinism only."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import sys, torch, carbon
torch.manual_seed(0)
F32 = torch.float32

def rows(n, dtype):
    r = 9
    x = torch.randn(r, n) * torch.logspace(-2, 1, n)
    x[1] += 1000.0                                   # large mean, small spread: the centred pass
    x[2] = 3.0                                       # constant row: var = +0
    x[2, n // 2] = 3.0 + 2.0 ** -20
    x[3] = x[3] * 1e-41 if dtype == F32 else x[3] * 1e-6   # subnormal inputs (float32 / float16)
    x[4, n // 3] = float("nan")
    x[5, (2 * n) // 3] = float("inf")
    x[6] = torch.where(torch.arange(n) % 2 == 0, torch.zeros(n), -torch.zeros(n))
    x[6, 0] = 1.0                                    # mostly signed zeros
    if dtype == F32:
        x[7] *= 1e37                                 # sums of squares overflow: r = 0
    x[8, : n // 2] = 1.0
    x[8, n // 2:] = -1.0                             # exact sums, ties
    return x.to(dtype)

results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for n in (1, 3, 5, 7, 8, 9, 16, 31, 33, 47, 100, 771):
        x = rows(n, dtype)
        g = torch.Generator().manual_seed(n)
        w = (1 + 0.5 * torch.randn(n, generator=g)).to(dtype)
        w[0] = -0.0
        if n > 2:
            w[2] = 1e-30 if dtype == F32 else 0.0    # x-hat w (+) b underflows / subnormal outputs
        if n > 4 and dtype == torch.bfloat16:
            w[3] = 2.0e38     # x-hat w near and past bfloat16's largest value (RN's overflow to inf)
            w[4] = 3.0e-38    # outputs about 2^-126: bfloat16 normals and subnormals (the general path)
        b = (0.1 * torch.randn(n, generator=g)).to(dtype)
        if n > 1:
            b[1] = -0.0
        if n > 4 and dtype == torch.bfloat16:
            b[4] = 0.0
        dy = torch.randn(x.shape, generator=g).to(dtype)
        dy[0, 0] = -0.0
        dy[1] *= 1e-38 if dtype == F32 else 1e-4     # small gradients: subnormal g and dx
        for weight, bias in ((None, None), (w, None), (w, b), (None, b)):
            y, mean, rstd = torch.ops.carbon.layer_norm(x, (n,), weight, bias, 1e-5)
            results += [y, mean, rstd]
            dx, dw, db = torch.ops.carbon.norm_backward(dy, x, (n,), mean, rstd, weight, [True, True, True])
            results += [dx, dw, db]
            dx, _, _ = torch.ops.carbon.norm_backward(dy, x, (n,), mean, rstd, weight, [True, False, False])
            results.append(dx)
            if bias is None:
                y, rstd = torch.ops.carbon.rms_norm(x, (n,), weight, None)
                results += [y, rstd]
                dx, dw, _ = torch.ops.carbon.norm_backward(dy, x, (n,), None, rstd, weight, [True, True, False])
                results += [dx, dw]
        # eps = 0: r = +inf on the constant row (NaN outputs)
        results += list(torch.ops.carbon.layer_norm(x, (n,), w, b, 0.0))
# A larger batch through the fused backward's blocks (more than one block of rows).
x = torch.randn(200, 264) * 3 + 0.5
w, b = 1 + 0.1 * torch.randn(264), 0.1 * torch.randn(264)
dy = torch.randn(200, 264)
for dtype in (torch.float32, torch.bfloat16):
    xs, ws, bs, dys = (t.to(dtype) for t in (x, w, b, dy))
    y, mean, rstd = torch.ops.carbon.layer_norm(xs, (264,), ws, bs, 1e-5)
    results += [y, *torch.ops.carbon.norm_backward(dys, xs, (264,), mean, rstd, ws, [True, True, True])]
    results += list(torch.ops.carbon.norm_backward(dys, xs, (264,), mean, rstd, ws, [False, True, True])[1:])
torch.save([t.float() if t.dtype == torch.float64 else t for t in results if t.numel() > 0], sys.argv[1])
'''


def test_avx2_and_portable_norm_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX2",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_fastest_and_next_norm_loops_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
