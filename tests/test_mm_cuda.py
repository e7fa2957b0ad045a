"""On a CUDA GPU Carbon returns the same bits as on the CPU (both are the
correctly rounded result): random and adversarial data, every dtype, large K,
gradients, CUDA graphs, no host synchronization, batch invariance.
Skipped without a GPU."""

import random

import pytest
import torch

import carbon
from data import BF16, DTYPE_COMBOS, DTYPES, F16, F32, exact_tensor, generator, random_values, tie_rows
from oracle import as_bits, assert_bits_equal, bmm_bits, mm_bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

INF, NAN = float("inf"), float("nan")


def cuda(*tensors):
    return [t.cuda() for t in tensors]


def same_bits(gpu, cpu, context=""):
    assert gpu.device.type == "cuda", context
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, context
    got, want = as_bits(gpu), as_bits(cpu)
    # flattened: a 0-dim mismatch gives nonzero() of shape (1, 0), numel 0
    if not torch.equal(got.reshape(-1), want.reshape(-1)):
        bad = (got.reshape(-1) != want.reshape(-1)).nonzero()[:, 0]
        first = int(bad[0])
        raise AssertionError(
            f"{context}: {bad.numel()} outputs differ between GPU and CPU, first at flat index {first}: "
            f"GPU {gpu.cpu().reshape(-1)[first].item()!r} vs CPU {cpu.reshape(-1)[first].item()!r}")


def tie_matrices(a_dtype, out_dtype, M, K, N, seed, pairs=1, nudge=0.0):
    """a (M, K) whose rows sum to ties of out_dtype, b (K, N) of exact powers of
    two per column (which keep ties ties)."""
    rng = random.Random(seed)
    a = exact_tensor(tie_rows(a_dtype, out_dtype, M, K, nudge, rng, pairs=pairs), a_dtype)
    b = exact_tensor([[2.0 ** rng.randint(-2, 2) for _ in range(N)]] * K, rng.choice(DTYPES))
    return a, b


# ---------------------------------------------------------------- forward: GPU == CPU


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (17, 33, 9), (8, 0, 5), (0, 4, 3), (33, 257, 65)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", DTYPE_COMBOS)
def test_random_gpu_equals_cpu(shape, a_dtype, b_dtype, out_dtype):
    M, K, N = shape
    g = generator(101)
    a, b = random_values((M, K), a_dtype, g), random_values((K, N), b_dtype, g)
    ga, gb = cuda(a, b)
    same_bits(carbon.mm(ga, gb, out_dtype=out_dtype), carbon.mm(a, b, out_dtype=out_dtype), f"mm {shape}")


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (BF16, None), (F16, None), (F32, F16)])
def test_large_k_gpu_equals_cpu_and_oracle(dtype, out_dtype):
    g = generator(102)
    spread = 6 if F16 in (dtype, out_dtype) else 30
    a, b = random_values((256, 4096), dtype, g, spread=spread), random_values((4096, 256), dtype, g, spread=spread)
    a[::7, 2048:] = -a[::7, :2048]  # some rows whose halves cancel against b's ...
    b[2048:, ::5] = b[:2048, ::5]  # ... matching columns: exact cancellation at large K
    ga, gb = cuda(a, b)
    out = carbon.mm(ga, gb, out_dtype=out_dtype)
    same_bits(out, carbon.mm(a, b, out_dtype=out_dtype), "256x4096x256")
    rows, cols = [0, 7, 100], [0, 5, 201]
    assert_bits_equal(out.cpu()[rows][:, cols], mm_bits(a[rows], b[:, cols], out_dtype=out_dtype), "oracle subset")


@pytest.mark.parametrize("a_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("nudge", [0.0, 2.0**-60, -(2.0**-60), 2.0**-30, -(2.0**-30)],
                         ids=["tie", "just-above", "just-below", "near-above", "near-below"])
def test_all_outputs_ties_gpu_equals_cpu(a_dtype, out_dtype, nudge):
    """Every output undecided by the fast tier: whole warps take the exact path."""
    a, b = tie_matrices(a_dtype, out_dtype, 96, 16, 40, seed=f"{a_dtype}{out_dtype}{nudge}", nudge=nudge)
    ga, gb = cuda(a, b)
    out = carbon.mm(ga, gb, out_dtype=out_dtype)
    same_bits(out, carbon.mm(a, b, out_dtype=out_dtype), "ties")
    assert_bits_equal(out.cpu()[:8], mm_bits(a[:8], b, out_dtype=out_dtype), "oracle subset")


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_ties_hidden_in_large_k_with_cancellation(out_dtype):
    """K = 4096: a tie spread over a row with ~2000 cancelling pairs, so the
    warp's lanes each see large partial sums that only cancel when merged."""
    a, b = tie_matrices(F32, out_dtype, 32, 4096, 24, seed=f"bigk{out_dtype}", pairs=2040)
    ga, gb = cuda(a, b)
    out = carbon.mm(ga, gb, out_dtype=out_dtype)
    same_bits(out, carbon.mm(a, b, out_dtype=out_dtype), "large-K ties")
    assert_bits_equal(out.cpu()[:2, :3], mm_bits(a[:2], b[:, :3], out_dtype=out_dtype), "oracle subset")


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_integer_tie_matrices_gpu_equals_cpu(out_dtype):
    g = generator(103)
    bits = {F32: 12, BF16: 4, F16: 6}[out_dtype]
    a = torch.randint(-(2**bits), 2**bits, (200, 6), generator=g).float()
    b = torch.randint(-(2**bits), 2**bits, (6, 150), generator=g).float()
    ga, gb = cuda(a, b)
    same_bits(carbon.mm(ga, gb, out_dtype=out_dtype), carbon.mm(a, b, out_dtype=out_dtype), "integer ties")


def test_special_values_and_signed_zeros_gpu_equals_cpu():
    vals = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 2.0**-149, -(2.0**-149), 2.0**100, -(2.0**100), 3e38, -3e38]
    rng = random.Random(104)
    a = torch.tensor([[rng.choice(vals) for _ in range(5)] for _ in range(70)], dtype=F32)
    b = torch.tensor([[rng.choice(vals) for _ in range(70)] for _ in range(5)], dtype=F32)
    bias = torch.tensor([rng.choice(vals) for _ in range(70)], dtype=F32)
    zeros_a = torch.tensor([[rng.choice([0.0, -0.0]) for _ in range(3)] for _ in range(64)])
    zeros_b = torch.tensor([[rng.choice([0.0, -0.0, 1.0, -1.0]) for _ in range(64)] for _ in range(3)])
    for out_dtype in DTYPES:
        ga, gb, gbias = cuda(a, b, bias)
        same_bits(carbon.mm(ga, gb, out_dtype=out_dtype), carbon.mm(a, b, out_dtype=out_dtype), "specials")
        same_bits(carbon.addmm(gbias, ga, gb, out_dtype=out_dtype), carbon.addmm(bias, a, b, out_dtype=out_dtype), "specials+bias")
        gza, gzb = cuda(zeros_a, zeros_b)
        same_bits(carbon.mm(gza, gzb, out_dtype=out_dtype), carbon.mm(zeros_a, zeros_b, out_dtype=out_dtype), "signed zeros")
        for neg_zero_bias in (torch.tensor(-0.0), torch.tensor(0.0)):
            same_bits(carbon.addmm(neg_zero_bias.cuda(), gza, gzb, out_dtype=out_dtype),
                      carbon.addmm(neg_zero_bias, zeros_a, zeros_b, out_dtype=out_dtype), "signed zeros + bias")
    assert_bits_equal(carbon.addmm(gbias, ga, gb).cpu()[:10], mm_bits(a[:10], b, bias), "oracle subset")


@pytest.mark.parametrize("in_dtype,out_dtype,scale_exp", [(F32, F32, -70), (BF16, BF16, -64), (F16, F16, -10), (F32, F16, -10)])
def test_subnormal_and_overflowing_results_gpu_equals_cpu(in_dtype, out_dtype, scale_exp):
    g = generator(105)
    tiny_a = random_values((40, 24), in_dtype, g, spread=3, scale_exp=scale_exp)
    tiny_b = random_values((24, 40), in_dtype, g, spread=3, scale_exp=scale_exp)
    big_exp = {F32: 63, BF16: 63, F16: 7}[in_dtype]
    big_a = random_values((40, 24), in_dtype, g, spread=1, scale_exp=big_exp)
    big_b = random_values((24, 40), in_dtype, g, spread=1, scale_exp=big_exp)
    for a, b in ((tiny_a, tiny_b), (big_a, big_b)):
        ga, gb = cuda(a, b)
        out = carbon.mm(ga, gb, out_dtype=out_dtype)
        same_bits(out, carbon.mm(a, b, out_dtype=out_dtype), f"scale 2^{scale_exp}")
        assert_bits_equal(out.cpu()[:3], mm_bits(a[:3], b, out_dtype=out_dtype), "oracle subset")


@pytest.mark.parametrize("bias_shape", [None, (6,), (4, 6), (3, 1, 6), (1, 4, 1), ()], ids=str)
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, BF16)])
def test_bmm_and_addmm_gpu_equals_cpu(bias_shape, dtype, out_dtype):
    g = generator(106)
    a, b = random_values((3, 4, 300), dtype, g), random_values((3, 300, 6), dtype, g)
    a[1, :, 150:] = -a[1, :, :150]
    b[1, 150:] = b[1, :150]  # batch 1 cancels exactly
    ga, gb = cuda(a, b)
    if bias_shape is None:
        same_bits(carbon.bmm(ga, gb, out_dtype=out_dtype), carbon.bmm(a, b, out_dtype=out_dtype), "bmm")
        same_bits(carbon.mm(ga[0], gb[0], out_dtype=out_dtype), carbon.mm(a[0], b[0], out_dtype=out_dtype), "mm")
        return
    bias = random_values(bias_shape, dtype, g)
    gbias = bias.cuda()
    out = carbon.baddbmm(gbias, ga, gb, out_dtype=out_dtype)
    same_bits(out, carbon.baddbmm(bias, a, b, out_dtype=out_dtype), "baddbmm")
    assert_bits_equal(out.cpu()[1:2], bmm_bits(a[1:2], b[1:2], torch.broadcast_to(bias, (3, 4, 6))[1:2], out_dtype))
    if len(bias_shape) <= 2:
        same_bits(carbon.addmm(gbias, ga[2], gb[2], out_dtype=out_dtype),
                  carbon.addmm(bias, a[2], b[2], out_dtype=out_dtype), "addmm")


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None)])
def test_gradients_gpu_equal_cpu(dtype, out_dtype):
    g = generator(107)
    x = random_values((2, 5, 64), dtype, g)
    w = random_values((24, 64), dtype, g)
    bias = random_values((24,), dtype, g)
    a, b = random_values((3, 7, 33), dtype, g), random_values((3, 33, 9), dtype, g)
    bb = random_values((7, 9), F32, g)

    def run(device):
        leaves = [t.to(device).requires_grad_(True) for t in (x, w, bias, a, b, bb)]
        lx, lw, lbias, la, lb, lbb = leaves
        y = carbon.linear(lx, lw, lbias, out_dtype=out_dtype)
        z = carbon.baddbmm(lbb, la, lb, out_dtype=out_dtype)
        gy = random_values(y.shape, y.dtype, generator(108)).to(device)
        gz = random_values(z.shape, z.dtype, generator(109)).to(device)
        torch.autograd.backward([y, z], [gy, gz])
        return [y, z] + [t.grad for t in leaves]

    names = ["y", "z", "dx", "dw", "dbias", "da", "db", "dbb"]
    for name, on_gpu, on_cpu in zip(names, run("cuda"), run("cpu")):
        same_bits(on_gpu, on_cpu, name)


# ---------------------------------------------------------------- CUDA graphs, host syncs, devices


def test_cuda_graph_capture_and_replay():
    a0, b = tie_matrices(F32, F32, 64, 16, 32, seed="graph")
    g = generator(110)
    static_a, static_b = cuda(a0, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            carbon.mm(static_a, static_b)
            carbon.mm(static_a, static_b, out_dtype=BF16)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = carbon.mm(static_a, static_b)
        static_out16 = carbon.mm(static_a, static_b, out_dtype=BF16)
    for new_a in (a0, random_values((64, 16), F32, g), tie_matrices(F32, F32, 64, 16, 32, seed="graph2")[0]):
        static_a.copy_(new_a.cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(static_out.cpu(), as_bits(carbon.mm(new_a, b)), "graph replay, float32")
        assert_bits_equal(static_out16.cpu(), as_bits(carbon.mm(new_a, b, out_dtype=BF16)), "graph replay, bfloat16")
        assert_bits_equal(static_out.cpu()[:4], mm_bits(new_a[:4], b), "graph replay vs oracle")


def _sync_test_inputs():
    g = generator(111)
    a, b = tie_matrices(F32, BF16, 64, 16, 32, seed="sync")
    tensors = dict(
        a=a, b=b, bias=random_values((32,), F32, g),
        x=random_values((2, 3, 16), BF16, g), w=random_values((8, 16), BF16, g),
        a3=random_values((2, 5, 16), F16, g), b3=random_values((2, 16, 4), F16, g),
    )
    return {k: v.cuda() for k, v in tensors.items()}


def test_no_host_synchronization_in_forward():
    t = _sync_test_inputs()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [
            carbon.mm(t["a"], t["b"]),
            carbon.mm(t["a"], t["b"], out_dtype=BF16),
            carbon.addmm(t["bias"], t["a"], t["b"]),
            carbon.bmm(t["a3"], t["b3"]),
            carbon.baddbmm(t["bias"][:4], t["a3"], t["b3"], out_dtype=F32),
            carbon.linear(t["x"], t["w"]),
        ]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    same_bits(outs[0], carbon.mm(t["a"].cpu(), t["b"].cpu()), "mm")


def test_no_host_synchronization_in_backward():
    t = _sync_test_inputs()
    x, w = t["x"].requires_grad_(True), t["w"].requires_grad_(True)
    bias = torch.zeros(8, device="cuda", dtype=F32, requires_grad=True)
    y = carbon.linear(x, w, bias)
    grad = torch.ones_like(y)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y.backward(grad)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    cx, cw, cbias = (t.detach().cpu().requires_grad_(True) for t in (x, w, bias))
    carbon.linear(cx, cw, cbias).backward(grad.cpu())
    for name, gpu_grad, cpu_grad in (("dx", x.grad, cx.grad), ("dw", w.grad, cw.grad), ("dbias", bias.grad, cbias.grad)):
        same_bits(gpu_grad, cpu_grad, name)


def test_tensors_on_different_devices_raise_value_error():
    cpu, gpu = torch.ones(2, 3), torch.ones(3, 2, device="cuda")
    with pytest.raises(ValueError, match="carbon.mm"):
        carbon.mm(gpu.t().contiguous(), cpu.t().contiguous())
    with pytest.raises(ValueError, match="carbon.mm"):
        carbon.mm(cpu, gpu)
    with pytest.raises(ValueError, match="carbon.addmm"):
        carbon.addmm(torch.ones(2), torch.ones(2, 3, device="cuda"), gpu)
    with pytest.raises(ValueError, match="carbon.bmm"):
        carbon.bmm(cpu[None], gpu[None])


def test_outputs_stay_on_the_inputs_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    a, b = torch.ones(3, 4, device="cuda:1"), torch.ones(4, 5, device="cuda:1")
    out = carbon.mm(a, b)
    assert out.device == a.device
    same_bits(out, carbon.mm(a.cpu(), b.cpu()), "cuda:1")


# ---------------------------------------------------------------- batch invariance on the GPU


@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, None)])
def test_batch_invariance_on_the_gpu(dtype, out_dtype):
    g = generator(112)
    spread = 6 if dtype == F16 else 40
    A = random_values((256, 512), dtype, g, spread=spread)
    B = random_values((512, 48), dtype, g, spread=spread)
    A[::3, 256:] = -A[::3, :256]
    B[256:, ::2] = B[:256, ::2]  # exact cancellation in a third of the rows / half the columns
    gA, gB = cuda(A, B)
    full = carbon.mm(gA, gB, out_dtype=out_dtype)
    for rows in (1, 7, 32, 100, 256):
        for start in range(0, 256, rows if rows > 1 else 37):
            part = carbon.mm(gA[start : start + rows], gB, out_dtype=out_dtype)
            same_bits(part, full[start : start + rows].cpu(), f"rows {start}:{start + rows}")
    same_bits(full, carbon.mm(A, B, out_dtype=out_dtype), "GPU vs CPU")
    # bmm batch element == mm of the slice, and layouts
    a3, b3 = gA[:240].reshape(5, 48, 512), gB[None].expand(5, -1, -1)
    out3 = carbon.bmm(a3, b3, out_dtype=out_dtype)
    for i in range(5):
        same_bits(out3[i], full[48 * i : 48 * (i + 1)].cpu(), f"bmm batch {i}")
    same_bits(carbon.mm(gA.t().contiguous().t(), gB, out_dtype=out_dtype), full.cpu(), "transposed layout")
