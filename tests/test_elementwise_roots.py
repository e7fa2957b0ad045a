"""Derivatives that cross zero — gelu', gelu_tanh', silu' (contract §6): near their roots the result is still
one rounding of a value within 2^-41 relative of the exact derivative (mpmath at 256 bits,
tests/elementwise_ref.py), with no absolute slack. The float32 inputs closest to each root are where the
plain formulas, Φ(x) + x·φ(x) and the like, lost up to 27 bits to cancellation (0.58 ulp; found by the
exhaustive run of scripts/elementwise_ulp.py); the cores now take a Taylor series there
(scripts/elementwise_roots.py). Checked through the scalar core (short tensors) and inside long tensors,
where the CPU's vector loop must hand these inputs to the core."""

from __future__ import annotations

import struct

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)

from tests.elementwise_ref import grad_expected_bits
from tests.oracle import as_bits

ROOTS = {"gelu": -0.751791524693564457, "gelu_tanh": -0.752461422071016258, "silu": -1.278464542761073795}


def _neighbours(r: float, count: int) -> list:
    """The float32 values closest to r, count on each side, plus points across the series' edge |x - r| = 2^-7."""
    bits = struct.unpack("<I", struct.pack("<f", r))[0]
    near = [struct.unpack("<f", struct.pack("<I", bits + k))[0] for k in range(-count, count + 1)]
    edge = [r + s * 2.0 ** -7 * f for s in (-1, 1) for f in (0.999, 1.0, 1.001)]
    return near + [struct.unpack("<f", struct.pack("<f", v))[0] for v in edge]


@pytest.mark.parametrize("name", sorted(ROOTS))
@pytest.mark.parametrize("long", [False, True], ids=["core", "in-a-vector-loop"])
def test_derivatives_are_accurate_next_to_their_roots(name, long):
    xs = _neighbours(ROOTS[name], 200)
    x = torch.tensor(xs, dtype=torch.float32)
    if long:  # the roots' neighbours among ordinary inputs: a vector loop over blocks
        filler = torch.linspace(-4, 4, 4096)
        x = torch.cat([filler[:1000], x, filler[1000:]])
    got = torch.ops.carbon.elementwise_backward(torch.ones_like(x), x, name)
    got = got[1000:1000 + len(xs)] if long else got
    bits = as_bits(got).tolist()
    for v, b in zip(xs, bits):
        want = grad_expected_bits(name, 1.0, v, torch.float32, abs_slack=0)
        assert (b & 0xFFFFFFFF) in {w & 0xFFFFFFFF for w in want}, (name, v)
