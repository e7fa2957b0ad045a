"""carbon.enable on a GPU gives the CPU's bits: an ordinary torch.nn GPT built
and trained under carbon.enabled(seed) on CUDA ends with the same weights as
on the CPU, and torch's random ops give the same tensors. Skipped without a
GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import as_bits
from tests.test_enable import TinyGPT, _train

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpt_training_on_cuda_equals_the_cpu(restore_num_threads):
    cpu, cpu_loss = _train(2, device="cpu")
    gpu, gpu_loss = _train(2, device="cuda")
    assert as_bits(cpu_loss).item() == as_bits(gpu_loss).item()
    for name in cpu:
        assert torch.equal(cpu[name], gpu[name]), name


def test_random_ops_on_cuda_equal_the_cpu():
    def draw(device):
        with carbon.enabled(seed=3):
            return [torch.randn(5, 7, device=device), torch.rand(9, device=device),
                    torch.empty(4, 4, device=device).normal_(1.0, 2.0), torch.randint(0, 50, (11,), device=device),
                    torch.randperm(13, device=device), torch.bernoulli(torch.full((6,), 0.4, device=device))]
    for c, g in zip(draw("cpu"), draw("cuda")):
        assert torch.equal(c, g.cpu())


def test_division_by_a_scalar_on_cuda_is_the_quotient():
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 100
    with carbon.enabled():
        cpu, gpu = x / 3.0, x.cuda() / 3.0
        cpu_ce = F.cross_entropy(x.view(100, 100), torch.arange(100))
        gpu_ce = F.cross_entropy(x.view(100, 100).cuda(), torch.arange(100).cuda())
    assert torch.equal(as_bits(cpu), as_bits(gpu))
    assert torch.equal(as_bits(cpu_ce), as_bits(gpu_ce))


def test_tiny_gpt_logits_on_cuda_equal_the_cpu():
    with carbon.enabled(seed=0):
        model = TinyGPT().eval()
    idx = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(1))
    with carbon.enabled(), torch.no_grad():
        cpu = model(idx)
        gpu = model.cuda()(idx.cuda())
    assert torch.equal(as_bits(cpu), as_bits(gpu))


def test_convolution_and_its_gradients_on_cuda_equal_the_cpu():
    gen = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(4, 6, 13, 11, generator=gen), torch.randn(8, 3, 3, 2, generator=gen), torch.randn(8, generator=gen)
    g = torch.randn(4, 8, 7, 11, generator=gen)

    def run(device):
        leaves = [t.to(device).requires_grad_() for t in (x, w, b)]
        with carbon.enabled():
            y = F.conv2d(*leaves, stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
            y.backward(g.to(device))
        return [y.detach().cpu()] + [t.grad.cpu() for t in leaves]
    for c, d in zip(run("cpu"), run("cuda")):
        assert torch.equal(as_bits(c), as_bits(d))


def test_small_resnet_training_on_cuda_equals_the_cpu(restore_num_threads):
    """Convolutions, batch and group norm, max and adaptive pooling (tests/test_enable_cnn.py)."""
    from tests.test_enable_cnn import TinyResNet

    def train(device):
        with carbon.enabled(seed=0):
            model = TinyResNet().to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            x, t = torch.randn(8, 3, 16, 16, device=device), torch.randint(0, 10, (8,), device=device)
            for _ in range(3):
                opt.zero_grad()
                F.cross_entropy(model(x), t).backward()
                opt.step()
        return {k: as_bits(v) for k, v in model.state_dict().items() if v.is_floating_point()}
    cpu, gpu = train("cpu"), train("cuda")
    for name in cpu:
        assert torch.equal(cpu[name], gpu[name]), name
