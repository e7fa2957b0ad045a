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
# Rows for the AVX2 EXP's in-register test (csrc/softmax/softmax_exp_avx2.h): arguments near a float32
# midpoint (its light test fails them, so their block is redone), results in the subnormal range
# (d in (-110, -87): the range test), runs of masked entries (groups of eight -inf stored as zeros),
# finite d <= -110, and rows whose least d is >= -87 (the loop without the range test); widths with and
# without a tail of n mod 8 values, in float32 and 16-bit formats (the AVX2 roundings into bfloat16 /
# float16). The backward of log_softmax also takes a y of the caller's (not a log_softmax output):
# NaN, +-inf and d > 88 reach its EXP.
# float32 arguments in [-87, 0] that exp_f32_approx_decided leaves undecided (tests/test_elementwise_exp_f32.py)
undecided = torch.tensor([0xB2FFFC01, 0xBF294118, 0xC03359CB, 0xC1A526CE, 0xC258D1C9], dtype=torch.int64)
undecided = torch.where(undecided >= 1 << 31, undecided - (1 << 32), undecided).to(torch.int32).view(torch.float32)
for dtype, n in [(torch.float32, n) for n in (5, 13, 256, 1003)] + [(torch.bfloat16, 261), (torch.float16, 261)]:
    x = torch.randn(6, n) * 3 - 20
    x[:, 0] = 0.0  # the maximum, so d = x
    k = min(n, 6)
    x[0, 1:k] = undecided[: k - 1]
    x[1, 1:k] = torch.tensor([-90.0, -100.0, -108.0, -109.9, -86.9])[: k - 1]
    x[2, n // 2:] = float("-inf")
    x[3, 1:k] = torch.tensor([-110.0, -120.0, -1e10, -3e38, float("-inf")])[: k - 1]
    x[4, 1:] = torch.rand(n - 1) * 86 - 86  # every d in [-87, 0]
    x = x.to(dtype)  # (16-bit types: outputs and gradients in that format, subnormal ones included)
    for fn in (carbon.softmax, carbon.log_softmax):
        y = x.clone().requires_grad_()
        out = fn(y, -1)
        out.backward(torch.randn(out.shape).to(dtype))
        results += [out.detach(), y.grad]
    target = torch.arange(6) % n
    for smoothing in (0.0, 0.1):
        y = x.clone().requires_grad_()
        carbon.cross_entropy(y, target, "sum", -100, smoothing).backward()
        results.append(y.grad)
    if dtype != torch.float32:
        continue
    ycustom = torch.randn(6, n) * 40
    ycustom[0, :k] = torch.tensor([float("nan"), float("inf"), 88.5, 89.0, 100.0, -95.0])[:k]
    ycustom[1, : n // 2] = float("-inf")
    ycustom[2, 1:k] = undecided[: k - 1].float()
    results.append(torch.ops.carbon.log_softmax_backward(torch.randn(6, n), ycustom, -1, torch.float32))
torch.save(results, sys.argv[1])
'''


def test_portable_and_avx512_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_SOFTMAX_PORTABLE",))


def test_avx2_and_portable_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_SOFTMAX_PORTABLE",), fixed=("CARBON_CPU_NO_AVX512",))


@needs_avx512
def test_avx512_and_avx2_softmax_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))
