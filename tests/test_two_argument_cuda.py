"""carbon.atan2, carbon.hypot and the pow of two tensors on a CUDA GPU: the CPU's bits (one shared binary64
core), for random values over a wide range of exponents, C's special values and every dtype. Skipped without
a GPU."""

import math

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_atan2_and_hypot_on_the_gpu_equal_the_cpu(dtype):
    g = torch.Generator().manual_seed(0)
    n = 1 << 16
    if dtype == torch.float32:
        patterns = torch.randint(-(2**31), 2**31 - 1, (2, n), generator=g, dtype=torch.int64).to(torch.int32)
    else:
        patterns = torch.randint(-(2**15), 2**15 - 1, (2, n), generator=g, dtype=torch.int64).to(torch.int16)
    a, b = patterns.view(dtype)  # every kind of value: zeros, subnormals, infinities, NaNs
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0], dtype=dtype)
    a = torch.cat([a, specials.repeat_interleave(7)])
    b = torch.cat([b, specials.repeat(7)])
    for fn in (carbon.atan2, carbon.hypot, torch.ops.carbon.pow_tensor_tensor):
        assert torch.equal(as_bits(fn(a.cuda(), b.cuda()).cpu()), as_bits(fn(a, b))), str(fn)


def test_a_cpu_scalar_beside_a_cuda_tensor_under_enable(carbon_disabled_after):
    """torch allows a 0-dim CPU tensor beside a CUDA one; the route moves it to the GPU."""
    y = torch.randn(100, generator=torch.Generator().manual_seed(1))
    with carbon.enabled():
        got = torch.atan2(y.cuda(), torch.tensor(2.0))
        want = torch.atan2(y, torch.tensor(2.0))
    assert got.device.type == "cuda" and torch.equal(as_bits(got.cpu()), as_bits(want))
