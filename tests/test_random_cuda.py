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


def test_sizes_around_the_counter_packing():
    """Element i depends on (seed, offset, i) only: every draw of n values is
    the first n of a longer draw, on the GPU as on the CPU, for n around the
    4 (uniform, bernoulli, dropout) and 2 (normal) values per Philox block."""
    seed, offset = 12345, 7
    for dtype in DTYPES:
        long = {name: draw(4 * 1031, "cuda") for name, draw in _prefix_draws(dtype, seed, offset).items()}
        for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 255, 256, 257, 1023, 1024, 1025):
            for name, draw in _prefix_draws(dtype, seed, offset).items():
                short_gpu, short_cpu = draw(n, "cuda"), draw(n, "cpu")
                same_bits(short_gpu, short_cpu)
                assert torch.equal(as_bits(short_gpu), as_bits(long[name])[:n]), f"{name} {dtype} n={n}"


def _prefix_draws(dtype, seed, offset):
    x = torch.randn(4 * 1031, generator=torch.Generator().manual_seed(3)).to(dtype)
    return {
        "uniform": lambda n, d: carbon.rand(n, dtype=dtype, device=d, generator=gen(seed, offset)),
        "normal": lambda n, d: carbon.randn(n, dtype=dtype, device=d, generator=gen(seed, offset)),
        "trunc_normal": lambda n, d: carbon.random.trunc_normal((n,), 0.0, 1.0, -0.5, 0.5, dtype=dtype, device=d,
                                                               generator=gen(seed, offset)),
        "dropout": lambda n, d: carbon.dropout(x[:n].to(d), 0.4, generator=gen(seed, offset)),
        "bernoulli": lambda n, d: carbon.bernoulli(x[:n].abs().clamp(max=1).to(d), generator=gen(seed, offset)),
    }


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_draws_on_a_device_that_is_not_current():
    """A generator and a draw on cuda:1 while cuda:0 is current: the CPU's
    bits; a state on another GPU than the draw is refused."""
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        g1, cpu = carbon.Generator(dev, seed=21), carbon.Generator(seed=21)
        x = torch.randn(1001)
        got = [carbon.rand(1001, device=dev, generator=g1), carbon.randn(1001, device=dev, generator=g1),
               carbon.dropout(x.to(dev), 0.3, generator=g1)]
        want = [carbon.rand(1001, generator=cpu), carbon.randn(1001, generator=cpu), carbon.dropout(x, 0.3, generator=cpu)]
        for a, b in zip(got, want):
            assert a.device == dev
            same_bits(a, b)
        assert g1.offset == 3
        with pytest.raises(RuntimeError, match="the state is on"):
            carbon.rand(8, device="cuda:0", generator=g1)


def test_generators_saved_by_carbon_save_load_with_map_location_cuda(tmp_path):
    """carbon.load(map_location="cuda") puts the saved generator state on the GPU; torch's CUDA generator
    takes its state only as a CPU ByteTensor ("RNG state must be a torch.ByteTensor"), carbon's from any
    device: both resume their stream."""
    path = str(tmp_path / "g.pt")
    for make, draw in ((lambda: torch.Generator("cuda").manual_seed(3), lambda g: torch.randn(5, device="cuda", generator=g)),
                       (lambda: carbon.Generator("cuda", seed=3), lambda g: carbon.randn(5, device="cuda", generator=g))):
        g = make()
        draw(g)
        carbon.save(path, generator=g)
        expected = draw(g)
        g2 = make()
        carbon.load(path, generator=g2, map_location="cuda")
        assert torch.equal(draw(g2), expected)
