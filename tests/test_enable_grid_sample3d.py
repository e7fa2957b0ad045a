"""grid_sample and affine_grid on volumes under carbon.enable (docs/enable.md, carbon/_enable_grid_sample.py):
trilinear sampling and both gradients against an oracle of the documented steps (binary64 coordinates in Python
floats, every float32 rounding by Fractions), the three paddings and both align_corners, nearest sampling, the 3-d
affine grid against an exact oracle, closeness to torch's float64 kernels, and a VoxelMorph-style registration step
(a flow field added to an identity grid, trilinear warping) under strict mode with the same bits at 1 and 2 threads."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import assert_bits_equal, bits_tensor, bits_to_float, round_bits, row_sum_bits
from tests.grid_reference import reflect as _reflect

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32


def _rn(q) -> float:
    return bits_to_float(round_bits(Fraction(q), F32), F32)


def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _corners() -> list:
    """(x, y, z) offsets in torch's order tnw … bse: z outermost, x innermost."""
    return [(bx, by, bz) for bz, by, bx in itertools.product((0, 1), repeat=3)]


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_trilinear_grid_sample_and_its_gradients_follow_the_documented_steps(padding, align):
    n, c, d, h, w = 1, 2, 3, 4, 5
    x = _randn(n, c, d, h, w, seed=1).requires_grad_()
    grid = (_randn(n, 2, 2, 2, 3, seed=2) * 0.8).requires_grad_()
    with torch.no_grad():
        grid[0, 0, 0, 0] = torch.tensor([1.3, -1.1, 0.2])  # outside the volume
        grid[0, 1, 1, 1] = torch.tensor([-2.7, 3.4, 1.9])  # reflected more than once
    with carbon.enabled():
        y = F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=align)
        gy = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(gy)
    xv, gyv = x.detach().double().tolist()[0], gy.double().tolist()[0]
    sizes = (w, h, d)
    mults = [_rn((s - 1) / 2 if align else s / 2) for s in sizes]
    points = grid.detach().double().reshape(-1, 3).tolist()
    want_y, shares, want_grid = {}, {}, []
    for p, g in enumerate(points):
        coords, signs, clips = [], [], []
        for k in range(3):
            size = sizes[k]
            v = ((g[k] + 1) / 2) * (size - 1) if align else ((g[k] + 1) * size - 1) / 2
            sign = 1.0
            if padding == "reflection":
                v, sign = _reflect(v, size, align)
            clips.append(0 < v < size - 1)
            if padding != "zeros":
                v = min(max(v, 0.0), size - 1.0)
            coords.append(v)
            signs.append(sign)
        low = [math.floor(v) for v in coords]
        dist = [(low[k] + 1 - coords[k], coords[k] - low[k]) for k in range(3)]

        def val(ch, off):
            xx, yy, zz = (low[k] + off[k] for k in range(3))
            return xv[ch][zz][yy][xx] if 0 <= xx < w and 0 <= yy < h and 0 <= zz < d else 0.0

        def weight(off, skip=None):
            prod = None
            for k in range(3):
                if k != skip:
                    prod = dist[k][off[k]] if prod is None else prod * dist[k][off[k]]  # binary64, x, y, z order
            return _rn(prod)
        for ch in range(c):
            acc = None
            for off in _corners():
                term = _rn(Fraction(weight(off)) * Fraction(val(ch, off)))
                acc = term if acc is None else _rn(Fraction(acc) + Fraction(term))
                pos = tuple(low[k] + off[k] for k in range(3))
                if 0 <= pos[0] < w and 0 <= pos[1] < h and 0 <= pos[2] < d:
                    shares.setdefault((ch, pos[2], pos[1], pos[0]), []).append(
                        _rn(Fraction(gyv[ch][p // 4][(p // 2) % 2][p % 2]) * Fraction(weight(off))))
            want_y[(ch, p)] = round_bits(acc, F32)
        for axis in range(3):
            ts = []
            for ch in range(c):
                t = None
                for off in _corners():
                    if off[axis]:
                        continue
                    high = tuple(1 if k == axis else off[k] for k in range(3))
                    term = _rn(Fraction(weight(off, axis)) * Fraction(_rn(Fraction(val(ch, high)) - Fraction(val(ch, off)))))
                    t = term if t is None else _rn(Fraction(t) + Fraction(term))
                ts.append(t)
            dot = _rn(sum((Fraction(gyv[ch][p // 4][(p // 2) % 2][p % 2]) * Fraction(ts[ch]) for ch in range(c)), Fraction(0)))
            r = _rn(Fraction(dot) * Fraction(mults[axis]))
            if padding != "zeros" and not clips[axis]:
                r = 0.0
            want_grid.append(round_bits(r * signs[axis], F32))
    want = [want_y[(ch, p)] for ch in range(c) for p in range(len(points))]
    assert_bits_equal(y, bits_tensor(want, F32).reshape(y.shape), "values")
    want_gx = [row_sum_bits(shares.get((ch, zz, yy, xx), [0.0]), F32)
               for ch in range(c) for zz in range(d) for yy in range(h) for xx in range(w)]
    assert_bits_equal(x.grad, bits_tensor(want_gx, F32).reshape(x.shape), "input gradient")
    assert_bits_equal(grid.grad, bits_tensor(want_grid, F32).reshape(grid.shape), "grid gradient")


def test_nearest_and_affine_grid_on_volumes():
    """Sizes whose base points are exact (align_corners: −1 + 2i/(n − 1) with n − 1 a power of two): each grid entry
    is RN(exact Σ_k base_k·θ_rk)."""
    x = _randn(2, 3, 3, 5, 9, seed=3)
    theta = _randn(2, 3, 4, seed=4) * 0.5
    with carbon.enabled():
        grid = F.affine_grid(theta, (2, 3, 3, 5, 9), align_corners=True)
        near = F.grid_sample(x, grid, mode="nearest", align_corners=True)
    lines = [[-1 + Fraction(2 * i, n - 1) for i in range(n)] for n in (9, 5, 3)]  # x, y, z
    want = []
    for b in range(2):
        th = theta[b].double().tolist()
        for zz in range(3):
            for yy in range(5):
                for xx in range(9):
                    base = (lines[0][xx], lines[1][yy], lines[2][zz], Fraction(1))
                    for r in range(3):
                        want.append(round_bits(sum((base[k] * Fraction(th[r][k]) for k in range(4)), Fraction(0)), F32))
    assert_bits_equal(grid, bits_tensor(want, F32).reshape(grid.shape), "affine_grid 3-d")
    assert torch.equal(near, F.grid_sample(x, grid, mode="nearest", align_corners=True))  # a copy either way


def test_trilinear_sampling_is_close_to_torchs_float64():
    x, flow = _randn(2, 3, 6, 7, 8, seed=5), _randn(2, 6, 7, 8, 3, seed=6) * 0.7
    with carbon.enabled():
        got = F.grid_sample(x, flow, mode="bilinear", padding_mode="border", align_corners=True)
    want = F.grid_sample(x.double(), flow.double(), mode="bilinear", padding_mode="border", align_corners=True)
    assert (got.double() - want).abs().max().item() < 1e-5


class SpatialTransformer(torch.nn.Module):
    """VoxelMorph's warping layer: an identity grid plus a flow field (in voxels), normalized, trilinear."""

    def __init__(self, size) -> None:
        super().__init__()
        grids = torch.meshgrid([torch.arange(0, s, dtype=torch.float32) for s in size], indexing="ij")
        self.register_buffer("grid", torch.stack(grids).unsqueeze(0), persistent=False)

    def forward(self, src: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        new = self.grid + flow
        shape = flow.shape[2:]
        new = torch.stack([2 * (new[:, i] / (shape[i] - 1) - 0.5) for i in range(len(shape))], 1)
        new = new.permute(0, 2, 3, 4, 1)[..., [2, 1, 0]]
        return F.grid_sample(src, new, align_corners=True, mode="bilinear")


def _register(threads: int) -> tuple:
    torch.set_num_threads(threads)
    with carbon.enabled(seed=7):
        net = torch.nn.Sequential(torch.nn.Conv3d(2, 8, 3, padding=1), torch.nn.LeakyReLU(0.2),
                                  torch.nn.Conv3d(8, 3, 3, padding=1))
        warp = SpatialTransformer((8, 8, 8))
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        moving, fixed = torch.rand(2, 1, 8, 8, 8), torch.rand(2, 1, 8, 8, 8)
        for _ in range(2):
            flow = net(torch.cat([moving, fixed], 1))
            loss = F.mse_loss(warp(moving, flow), fixed) + 0.01 * flow.square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return float(loss.detach()), carbon.fingerprint(net, optimizer)


def test_voxelmorph_registration_trains_under_strict_mode_with_the_same_bits_at_any_thread_count(restore_num_threads):
    one, two = _register(1), _register(2)
    assert one == two and math.isfinite(one[0])
