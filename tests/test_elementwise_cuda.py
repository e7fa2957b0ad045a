"""On a CUDA GPU Carbon's elementwise math returns the same bits as on the
CPU (one shared implementation of every function): all float16 and bfloat16
bit patterns, float32 specials, thresholds and random bit patterns over all
exponents, gradients, non-contiguous inputs, no host synchronization.
Skipped without a GPU."""

import pytest
import torch

import carbon
from cuda_graphs import capture
from elementwise_ref import FORWARD
from oracle import as_bits
from test_elementwise import special_bits_f32
from test_elementwise_roots import ROOTS, _neighbours

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def call(name, x):
    return carbon.gelu(x, approximate="tanh") if name == "gelu_tanh" else getattr(carbon, name)(x)


def same_bits(gpu, cpu, context):
    assert gpu.device.type == "cuda" and gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, context
    got, want = as_bits(gpu), as_bits(cpu)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"{context}: {bad.shape[0]} outputs differ between GPU and CPU, first at {bad[:5].tolist()}: "
        f"GPU {gpu.cpu().flatten()[bad[0, 0]].item()!r} vs CPU {cpu.flatten()[bad[0, 0]].item()!r}")


def inputs(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)  # every pattern
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=g, dtype=torch.int64).to(torch.int32)
    spec = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in special_bits_f32()], dtype=torch.int32)
    near_roots = torch.tensor([v for r in ROOTS.values() for v in _neighbours(r, 64)], dtype=torch.float32)
    return torch.cat([spec.view(torch.float32), near_roots, rand.view(torch.float32)])  # (the derivatives' series)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", FORWARD)
def test_forward_same_bits_as_cpu(name, dtype):
    x = inputs(dtype)
    same_bits(call(name, x.cuda()), call(name, x), f"{name} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", FORWARD)
def test_backward_same_bits_as_cpu(name, dtype):
    x = inputs(dtype)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    fn = "gelu_tanh" if name == "gelu_tanh" else name
    cpu = torch.ops.carbon.elementwise_backward(g, x, fn)
    gpu = torch.ops.carbon.elementwise_backward(g.cuda(), x.cuda(), fn)
    same_bits(gpu, cpu, f"d{name} {dtype}")
    # through autograd as well
    xc = x[:4096].cuda().requires_grad_(True)
    (grad,) = torch.autograd.grad(call(name, xc), xc, g[:4096].cuda())
    same_bits(grad, cpu[:4096], f"autograd d{name} {dtype}")


def test_non_contiguous_and_no_sync():
    x = torch.randn(300, 200, device="cuda")
    for name in FORWARD:
        same_bits(call(name, x.t()), call(name, x.t().cpu()), name)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for name in FORWARD:
            call(name, x)
            torch.ops.carbon.elementwise_backward(x, x, name)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pow_ops_gpu_equals_cpu(dtype):
    g = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(4096, generator=g, dtype=torch.float64).exp() ** 8,
                   torch.tensor([0.0, -0.0, 1.0, -1.0, -2.0, float("inf"), float("-inf"), float("nan")],
                                dtype=torch.float64)]).to(dtype)
    for p in (1.5, -0.5, 3.0, -100.25, float("inf")):
        same_bits(torch.ops.carbon.pow_tensor_scalar(x.cuda(), p), torch.ops.carbon.pow_tensor_scalar(x, p), f"x^{p}")
    for base in (10000.0, 0.5, 2.0):
        same_bits(torch.ops.carbon.pow_scalar_tensor(base, x.cuda()), torch.ops.carbon.pow_scalar_tensor(base, x),
                  f"{base}^y")


def _elementwise_family_ops(x, g):
    """One call of each CUDA kernel of csrc/elementwise/: a forward, a
    backward, and both pow ops."""
    ops = torch.ops.carbon
    return [ops.gelu(x, "tanh"), ops.elementwise_backward(g, x, "silu"),
            ops.pow_tensor_scalar(x, 1.5), ops.pow_scalar_tensor(0.5, x)]


def test_cuda_graph_capture_and_replay():
    gen = torch.Generator().manual_seed(12)
    inputs = [torch.randn(1000, 33, generator=gen) * 4, torch.randn(1000, 33, generator=gen)]
    static = [t.cuda() for t in inputs]
    graph, captured = capture(lambda: _elementwise_family_ops(*static))
    for replay in range(2):
        new = [torch.randn(1000, 33, generator=gen) * 4, torch.randn(1000, 33, generator=gen)]
        for s_, v in zip(static, new):
            s_.copy_(v.cuda())
        graph.replay()
        torch.cuda.synchronize()
        for k, (got, want) in enumerate(zip(captured, _elementwise_family_ops(*new))):
            same_bits(got, want, f"graph replay {replay}: result {k}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_a_device_that_is_not_current():
    """Inputs on cuda:1 while cuda:0 is current: the kernels run on cuda:1
    (CUDAGuard) and return the CPU's bits; a grad on another device is refused."""
    gen = torch.Generator().manual_seed(13)
    x, g = torch.randn(4099, generator=gen).to(torch.bfloat16), torch.randn(4099, generator=gen).to(torch.bfloat16)
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        for got, want in zip(_elementwise_family_ops(x.to(dev), g.to(dev)), _elementwise_family_ops(x, g)):
            assert got.device == dev
            same_bits(got, want, "on cuda:1")
        with pytest.raises(ValueError, match="one device"):
            torch.ops.carbon.elementwise_backward(g.to("cuda:0"), x.to(dev), "exp")
        with pytest.raises(ValueError, match="one device"):
            torch.ops.carbon.elementwise_backward(g, x.to(dev), "exp")
