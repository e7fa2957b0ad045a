"""On a CUDA GPU carbon's random draws and dropout are the same bits as on
the CPU (docs/contract.md §10): every distribution, every dtype, sizes that
cut counter blocks and span many grid strides, gradients. Skipped without a GPU."""

import pytest
import torch

import carbon
from oracle import as_bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 7, 4099, 3 * 2**20 + 5)


def gen(seed, offset=0):
    g = carbon.Generator(seed=seed)
    g.offset = offset
    return g


def same_bits(gpu, cpu):
    assert gpu.device.type == "cuda" and gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
    assert torch.equal(as_bits(gpu), as_bits(cpu))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_draws_match_cpu(dtype, n):
    seed, offset = 2**63 + 99, 2**32 + 3
    draws = [
        lambda d: carbon.rand(n, dtype=dtype, device=d, generator=gen(seed, offset)),
        lambda d: carbon.randn(n, dtype=dtype, device=d, generator=gen(seed, offset)),
        lambda d: carbon.random.uniform((n,), -2.5, 7.0, dtype=dtype, device=d, generator=gen(seed, offset)),
        lambda d: carbon.random.normal((n,), 0.5, 3.0, dtype=dtype, device=d, generator=gen(seed, offset)),
        lambda d: carbon.random.trunc_normal((min(n, 100_000),), 0.0, 1.0, -1.0, 0.5, dtype=dtype, device=d,
                                             generator=gen(seed, offset)),
    ]
    for draw in draws:
        same_bits(draw("cuda"), draw("cpu"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_and_bernoulli_match_cpu(dtype, n, p):
    x = torch.randn(n).to(dtype)
    x[0] = float("nan")
    xg = x.cuda().requires_grad_()
    xc = x.clone().requires_grad_()
    yg = carbon.dropout(xg, p, generator=gen(5, 6))
    yc = carbon.dropout(xc, p, generator=gen(5, 6))
    same_bits(yg, yc)
    dy = torch.randn(n).to(dtype)
    yg.backward(dy.cuda())
    yc.backward(dy)
    same_bits(xg.grad, xc.grad)
    probs = torch.rand(n).to(dtype)
    same_bits(carbon.bernoulli(probs.cuda(), generator=gen(1, 2)), carbon.bernoulli(probs, generator=gen(1, 2)))
    same_bits(carbon.bernoulli(probs.cuda(), p, generator=gen(1, 2)), carbon.bernoulli(probs, p, generator=gen(1, 2)))


def test_init_matches_cpu():
    wg = torch.empty(256, 384, device="cuda")
    wc = torch.empty(256, 384)
    for fn in (carbon.nn.init.kaiming_uniform_, carbon.nn.init.xavier_normal_, carbon.nn.init.trunc_normal_):
        fn(wg, generator=gen(3))
        fn(wc, generator=gen(3))
        same_bits(wg, wc)
