"""On a CUDA GPU carbon's indexed accumulations give the same bits as on the
CPU (both are the correctly rounded result), run after run, with heavy
duplication of the indices. Skipped without a GPU."""

import math

import pytest
import torch

import carbon
from data import BF16, DTYPES, F16, F32, exact_tensor, generator, random_values
from oracle import as_bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def same_bits(gpu, cpu, context=""):
    assert gpu.device.type == "cuda", context
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, context
    assert torch.equal(as_bits(gpu.cpu()), as_bits(cpu)), f"{context}: GPU bits differ from CPU bits"


def heavy(n, size, g):
    hot = torch.randint(0, size, (n,), generator=g) % 3
    return torch.where(torch.rand(n, generator=g) < 0.7, hot, torch.randint(0, size, (n,), generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1])
def test_index_add_gpu_equals_cpu_run_to_run(dtype, dim):
    g = generator(1 + dim)
    self = random_values((64, 96) if dim == 0 else (96, 64), dtype, g)
    n = 5000
    source = random_values((n, 96) if dim == 0 else (96, n), dtype, g, spread=40 if dtype != F16 else 6)
    index = heavy(n, 64, g)
    cpu = carbon.index_add(self, dim, index, source)
    first = carbon.index_add(self.cuda(), dim, index.cuda(), source.cuda())
    same_bits(first, cpu, f"index_add {dtype} dim {dim}")
    for _ in range(5):
        again = carbon.index_add(self.cuda(), dim, index.cuda(), source.cuda())
        assert torch.equal(as_bits(again.cpu()), as_bits(first.cpu())), "run-to-run difference"


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_gpu_equals_cpu(dtype):
    g = generator(7)
    vocab, dim = 1000, 130
    tok = heavy(4096, vocab, g)
    grad = random_values((4096, dim), dtype, g, spread=40 if dtype != F16 else 6)
    for pad in (-1, 2):
        cpu = torch.ops.carbon.embedding_backward(grad, tok, vocab, pad)
        gpu = torch.ops.carbon.embedding_backward(grad.cuda(), tok.cuda(), vocab, pad)
        same_bits(gpu, cpu, f"embedding_backward {dtype} pad {pad}")


def test_adversarial_and_specials_gpu_equals_cpu():
    big, h = 2.0**100, 2.0**-24
    self = exact_tensor([[1.0], [-0.0], [math.nan], [1.0], [-0.0]], F32)
    src = exact_tensor([[big], [h], [-big], [2.0**-140], [-0.0], [math.inf], [-math.inf], [1.0], [-1.0]], F32)
    index = torch.tensor([0, 0, 0, 0, 1, 3, 3, 4, 4])
    same_bits(carbon.index_add(self.cuda(), 0, index.cuda(), src.cuda()), carbon.index_add(self, 0, index, src))


def test_scatter_add_gpu_equals_cpu_and_out_of_range_ignored():
    g = generator(3)
    self = random_values((50, 8), BF16, g)
    src = random_values((300, 8), BF16, g)
    index = heavy(300 * 8, 50, g).reshape(300, 8)
    same_bits(carbon.scatter_add(self.cuda(), 0, index.cuda(), src.cuda()), carbon.scatter_add(self, 0, index, src))
    bad = index.clone()
    bad[0, 0] = 50
    bad[1, 1] = -1
    keep = torch.ones_like(index, dtype=torch.bool)
    keep[0, 0] = keep[1, 1] = False
    # dropping those two contributions on the CPU: point them at an extra padding row
    padded = torch.cat([self, torch.zeros(1, 8, dtype=BF16)])
    cpu = carbon.scatter_add(padded, 0, torch.where(keep, index, 50), src)[:50]
    gpu = carbon.scatter_add(self.cuda(), 0, bad.cuda(), src.cuda())
    same_bits(gpu, cpu.contiguous(), "out-of-range indices ignored")


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_forms_gpu_equal_cpu(dtype):
    """carbon.index_add_ / scatter_add_ / index_put_ on the GPU write the CPU's bits into self."""
    g = generator(31)
    base = random_values((40, 24), dtype, g)
    index = heavy(900, 40, g)
    source = random_values((900, 24), dtype, g)
    scatter_index = torch.randint(0, 40, (300, 24), generator=g)
    src = random_values((300, 24), dtype, g)
    calls = {
        "index_add_": lambda t, dev: carbon.index_add_(t, 0, index.to(dev), source.to(dev)),
        "index_put_": lambda t, dev: carbon.index_put_(t, (index.to(dev),), source.to(dev), accumulate=True),
        "scatter_add_": lambda t, dev: carbon.scatter_add_(t, 0, scatter_index.to(dev), src.to(dev)),
    }
    for name, call in calls.items():
        cpu, gpu = base.clone(), base.cuda()
        assert call(cpu, "cpu") is cpu and call(gpu, "cuda") is gpu, name
        same_bits(gpu, cpu, name)


def test_no_host_sync():
    g = generator(4)
    self, src = random_values((16, 32), F32, g).cuda(), random_values((100, 32), F32, g).cuda()
    index = heavy(100, 16, g).cuda()
    carbon.index_add(self, 0, index, src)  # warm up
    torch.cuda.set_sync_debug_mode("error")
    try:
        carbon.index_add(self, 0, index, src)
        torch.ops.carbon.embedding_backward(src, index, 16, -1)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_int32_and_multi_dim_inputs(dtype):
    """Non-contiguous self / source / index (the ops make them contiguous),
    int32 indices, a middle dim with inner columns: the CPU's bits."""
    g = generator(9)
    spread = 40 if dtype != F16 else 6
    self = random_values((96, 20), dtype, g).t()  # (20, 96), strided
    source = random_values((96, 300), dtype, g, spread=spread).t()  # (300, 96), strided
    index = heavy(600, 20, g).to(torch.int32)[::2]  # 300 int32 indices, stride 2
    same_bits(carbon.index_add(self.cuda(), 0, index.cuda(), source.cuda()), carbon.index_add(self, 0, index, source),
              f"strided index_add {dtype}")
    self3 = random_values((3, 10, 7), dtype, g)
    source3 = random_values((3, 7, 40), dtype, g, spread=spread).transpose(1, 2)  # (3, 40, 7), strided
    index3 = heavy(40, 10, g)
    same_bits(carbon.index_add(self3.cuda(), 1, index3.cuda(), source3.cuda()), carbon.index_add(self3, 1, index3, source3),
              f"index_add dim 1 of 3 {dtype}")
    src = random_values((8, 50), dtype, g, spread=spread).t()  # (50, 8), strided
    sidx = heavy(40 * 6, 12, g).reshape(40, 6).to(torch.int32)
    sself = random_values((12, 8), dtype, g)
    same_bits(carbon.scatter_add(sself.cuda(), 0, sidx.cuda(), src.cuda()), carbon.scatter_add(sself, 0, sidx, src),
              f"scatter_add with a smaller index {dtype}")
    tok = heavy(100, 30, g).reshape(4, 25).to(torch.int32)
    grad = random_values((4, 25, 16), dtype, g, spread=spread)
    same_bits(torch.ops.carbon.embedding_backward(grad.cuda(), tok.cuda(), 30, 3),
              torch.ops.carbon.embedding_backward(grad, tok, 30, 3), f"embedding_backward 2-D int32 tokens {dtype}")


def test_empty_inputs():
    """Empty index (each destination RN(self), NaNs canonical), empty self,
    zero tokens: nothing is launched with a grid of 0 blocks."""
    g = generator(10)
    self = exact_tensor([[1.0, math.nan], [-0.0, 2.0]], F32)
    none = torch.empty(0, dtype=torch.long)
    same_bits(carbon.index_add(self.cuda(), 0, none.cuda(), torch.empty(0, 2).cuda()),
              carbon.index_add(self, 0, none, torch.empty(0, 2)), "index_add, empty index")
    same_bits(carbon.index_add(torch.empty(0, 5).cuda(), 0, none.cuda(), torch.empty(0, 5).cuda()),
              carbon.index_add(torch.empty(0, 5), 0, none, torch.empty(0, 5)), "index_add, empty self")
    same_bits(carbon.scatter_add(self.cuda(), 1, torch.empty(2, 0, dtype=torch.long).cuda(), self.cuda()),
              carbon.scatter_add(self, 1, torch.empty(2, 0, dtype=torch.long), self), "scatter_add, empty index")
    grad = random_values((0, 16), BF16, g)
    for pad in (-1, 2):
        same_bits(torch.ops.carbon.embedding_backward(grad.cuda(), none.cuda(), 7, pad),
                  torch.ops.carbon.embedding_backward(grad, none, 7, pad), f"embedding_backward, no tokens, pad {pad}")
    same_bits(torch.ops.carbon.embedding_backward(grad.cuda(), none.cuda(), 0, -1),
              torch.ops.carbon.embedding_backward(grad, none, 0, -1), "embedding_backward, no rows")


def test_embedding_forward_gpu_equals_cpu():
    """The gather, with NaN rows rewritten to the one NaN on both devices."""
    weight = exact_tensor([[1.0, -0.0], [math.nan, 3.0], [math.inf, 2.0**-140]], F32)
    tok = torch.tensor([[2, 0], [1, 1]])
    same_bits(torch.ops.carbon.embedding(weight.cuda(), tok.cuda(), -1), torch.ops.carbon.embedding(weight, tok, -1))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_a_non_current_device():
    """The kernel runs on the tensors' device (a device guard), not the current one."""
    g = generator(11)
    self, src = random_values((16, 32), F32, g), random_values((100, 32), F32, g)
    index = heavy(100, 16, g)
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        out = carbon.index_add(self.to(dev), 0, index.to(dev), src.to(dev))
        back = torch.ops.carbon.embedding_backward(src.to(dev), index.to(dev), 16, -1)
    assert out.device == dev and back.device == dev
    same_bits(out, carbon.index_add(self, 0, index, src), "index_add on cuda:1")
    same_bits(back, torch.ops.carbon.embedding_backward(src, index, 16, -1), "embedding_backward on cuda:1")


def test_mixed_devices_are_refused():
    self, src = torch.zeros(4, 3, device="cuda"), torch.ones(5, 3, device="cuda")
    index = torch.tensor([0, 1, 1, 3, 2])
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        carbon.index_add(self, 0, index, src)
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        carbon.index_add(self, 0, index.cuda(), src.cpu())
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        torch.ops.carbon.embedding_backward(src, index, 4, -1)
