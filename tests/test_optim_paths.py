"""The CPU optimizer steps give the same bits on every x86 path: the AVX-512 loops (adam_avx512.h,
sgd_avx512.h), the AVX2 loops (adam_avx2.h, sgd_avx2.h) and the portable blocks of optim.cpp, each
selected in a fresh process by the CARBON_CPU_* switches (csrc/cpu_features.h). The script steps
Adam / AdamW (every mode: plain, L2, decoupled, maximize, AMSGrad, c2s == 1) and SGD (no momentum,
momentum, nesterov, first step, dampening, L2, maximize) on float32, bfloat16 and float16 tensors of
lengths that are not multiples of 4 or 8, with ±0, subnormals, inf and NaN in the parameters,
gradients and states, and steps whose 16-bit results land on or next to midpoints of the format's grid
(where rounding through float32 would round twice)."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import math, sys, torch, carbon
torch.manual_seed(0)
adam, sgd = torch.ops.carbon.adam_step_, torch.ops.carbon.sgd_step_
SIZES = (1, 3, 5, 7, 8, 13, 31, 1000, 4099)
SPECIAL = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 3e38, -1e-30, 6e-8, -1e-5, 2.0 ** -14])

def values(n, dtype, scale, nonneg=False):
    x = torch.randn(n, dtype=torch.float64) * scale * torch.exp2(torch.randint(-8, 9, (n,)).double())
    k = torch.randint(0, n, (max(1, n // 8),))
    x[k] = SPECIAL[torch.randint(0, len(SPECIAL), (k.numel(),))].double()
    return (x.abs() if nonneg else x).to(dtype)

results = []
dtypes = (torch.float32, torch.bfloat16, torch.float16)
for dtype in dtypes:
    for amsgrad in (False, True):
        for decoupled, wd in ((False, 0.0), (False, 0.1), (True, 0.1)):
            for maximize in (False, True):
                for c2s in (math.sqrt(1 - 0.999 ** 3), 1.0):
                    p = [values(n, dtype, 0.02) for n in SIZES]
                    g = [values(n, dtype, 0.01) for n in SIZES]
                    m = [values(n, torch.float32, 1e-3) for n in SIZES]
                    v = [values(n, torch.float32, 1e-5, nonneg=True) for n in SIZES]
                    w = [values(n, torch.float32, 1e-5, nonneg=True) for n in SIZES] if amsgrad else []
                    adam(p, g, m, v, w, 1e-3, 0.9, 0.999, 1e-8, wd, 1 - 0.9 ** 3, c2s, decoupled, maximize)
                    results += p + m + v + w
# 16-bit results at and next to midpoints: decay = 1 + 2^-8 (bfloat16) or 1 + 2^-11 (float16) puts
# p * decay on a midpoint for many p; tiny gradients move p' off it by far less than a float32 ulp.
for dtype, shift, epss in ((torch.bfloat16, 8, (1e-8, 0.0)), (torch.float16, 11, (1e4, 1e8))):
    for eps in epss:
        p = [(torch.randn(n) * torch.exp2(torch.randint(-20, 4, (n,)).float())).to(dtype) for n in SIZES]
        g = [(torch.randn(n) * 1e-30).to(dtype) if dtype == torch.bfloat16 else
             (torch.randn(n) * 1e-7).to(dtype) for n in SIZES]
        m = [torch.zeros(n) for n in SIZES]
        v = [torch.zeros(n) for n in SIZES]
        adam(p, g, m, v, [], 2.0 ** -shift, 0.9, 0.999, eps, -1.0, 1 - 0.9, math.sqrt(1 - 0.999), True, False)
        results += p + m + v
for dtype in dtypes:
    for momentum, nesterov in ((0.0, False), (0.9, False), (0.9, True)):
        for first_step in ((True, False) if momentum else (False,)):
            for dampening in (0.0, 0.1):
                for wd in (0.0, 0.1):
                    for maximize in (False, True):
                        p = [values(n, dtype, 0.02) for n in SIZES]
                        g = [values(n, dtype, 0.01) for n in SIZES]
                        b = [values(n, torch.float32, 0.01) for n in SIZES] if momentum else []
                        sgd(p, g, b, 1e-2, momentum, dampening, wd, nesterov, maximize, first_step)
                        results += p + b
torch.save(results, sys.argv[1])
'''


def test_avx2_and_portable_optimizer_steps_give_the_same_bits(tmp_path):
    # AVX-512 switched off in both runs: the AVX2 loops against the portable blocks.
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX2",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_fastest_and_avx2_optimizer_steps_give_the_same_bits(tmp_path):
    # The CPU's fastest loops against those without AVX-512 (AVX2, or portable on a CPU without it).
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
