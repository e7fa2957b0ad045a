"""The softmax family's CPU implementations give the same bits: the AVX-512 kernels (table-driven
exp, fused row sums, hardware roundings checked per row), the AVX2 exp (exp_f32_approx written out
four lanes at a time) and the portable compiled loops, each pair in two fresh processes
(CARBON_SOFTMAX_PORTABLE selects the portable kernels, CARBON_CPU_NO_AVX512 the AVX2 ones). A pair
whose faster path the CPU lacks runs the same loops twice and checks only that they are
deterministic."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import sys, torch, carbon
torch.manual_seed(0)
def cases():
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((7, 1), (5, 17), (3, 256), (4, 1000), (2, 50257)):
            x = (torch.randn(*shape) * torch.logspace(-3, 2, shape[1])).to(dtype)
            if shape[1] >= 17:  # subnormal and zero exponentials, overflow-free wide ranges, +-0
                x[-1, 3:9] = torch.tensor([-120.0, -100.0, -90.0, 0.0, -0.0, -87.5]).to(dtype)
            x[0, : max(1, shape[1] // 3)] = float("-inf")
            if shape[1] > 2:
                x[1, 1] = float("nan")
                x[-1, 0] = 1e30 if dtype == torch.float32 else 1e4
            out.append(x)
    return out
results = []
for x in cases():
    for fn in (carbon.softmax, carbon.log_softmax):
        y = x.clone().requires_grad_()
        out = fn(y, -1)
        g = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
        out.backward(g)
        results += [out.detach(), y.grad]
    target = torch.arange(x.shape[0]) % x.shape[1]
    for smoothing in (0.0, 0.1):
        y = x.clone().requires_grad_()
        loss = carbon.cross_entropy(y, target, "mean", -100, smoothing)
        loss.backward()
        results += [loss.detach(), y.grad]
torch.save(results, sys.argv[1])
'''


def test_portable_and_avx512_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_SOFTMAX_PORTABLE",))


def test_avx2_and_portable_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_SOFTMAX_PORTABLE",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_avx512_and_avx2_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
