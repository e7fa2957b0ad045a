"""carbon.enable's routes for spatial transformers (docs/enable.md): F.affine_grid and F.grid_sample on images and
volumes (aten.affine_grid_generator, grid_sampler_2d / 3d and their backwards, cuDNN's 2-d sampler), bilinear
(trilinear for volumes) or nearest, with zeros, border or reflection padding.

torch's kernels compute the corner weights, the weighted sums and the grid gradient in float32 with fusing that
differs between devices; here every step is fixed. One definition serves every number of spatial dimensions d
(axes in the grid's order x, y, z; corners nested z outermost, then y, then x, which is torch's nw, ne, sw, se and
tnw … bse order):

* source coordinates in binary64 (torch's unnormalization, each operation rounded; reflection and border padding);
* a corner's weight RN32 of the binary64 product of its distances along x, y, z (in that order);
* out = the corners' RN(w·v) added in corner order, each addition rounded; corners outside +0; nearest copies;
* input gradient: every position RN(exact Σ of RN(g·w) over the samples reading it) (carbon.index_add);
* grid gradient along axis a: per channel t_a = the corner pairs along a, in corner order over the other axes,
  RN(w′·RN(v₁ − v₀)) added with rounding (w′ = RN32 of the binary64 product of the other axes' distances), then
  RN(RN(exact Σ_c g·t_a)·RN32(m_a)) with m_a = (size − 1)/2 or size/2, 0 where border padding clamped, times the
  reflection's sign.

For images (d = 2) these are the steps the 2-d routes always had (their oracle tests pass unchanged).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes

__all__ = ["affine_grid", "grid_sample", "grid_sample_backward", "cudnn_grid_sampler", "cudnn_grid_sampler_backward"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _base_line(n: int, align_corners: bool, like: Tensor) -> Tensor:
    """torch's linspace_from_neg_one, with the routed operations its backward decomposes into."""
    if n <= 1:
        return aten.zeros([1], dtype=like.dtype, device=like.device)
    r = routes._linspace({"start": -1.0, "end": 1.0, "steps": n, "dtype": like.dtype, "device": like.device})
    return r if align_corners else routes.true_divide(aten.mul(r, n - 1), float(n))


def affine_grid(a: dict) -> Tensor:
    """affine_grid: torch's base grid [x, y, (z,) 1] (linspace as routed) times θᵀ, each grid entry RN(exact Σ)
    (one carbon.bmm)."""
    theta, size, align = a["theta"], list(a["size"]), a["align_corners"]
    routes._need_carbon_dtype("affine_grid", theta)
    if len(size) not in (4, 5):
        return routes.PASS  # torch's own error
    n, spatial = size[0], size[2:]  # (H, W) or (D, H, W)
    d = len(spatial)
    base = aten.empty([n, *spatial, d + 1], dtype=theta.dtype, device=theta.device)
    for axis in range(d):  # x runs along the last spatial dimension, y the one before, z the first
        line = _base_line(spatial[d - 1 - axis], align, theta)
        base.select(-1, axis).copy_(line.reshape([-1] + [1] * axis))
    base.select(-1, d).fill_(1)
    points = math.prod(spatial)
    grid = carbon_ops.bmm(base.reshape([n, points, d + 1]), aten.transpose(theta, 1, 2).contiguous(), None)
    return grid.reshape([n, *spatial, d])


class _Sampling:
    """Where grid_sample reads: per output point and axis (x, y, z) the source coordinate in binary64 (torch's
    unnormalization, each binary64 operation rounded; border padding clamps it to [0, size − 1])."""

    def __init__(self, grid: Tensor, sizes: Sequence[int], padding_mode: int, align: bool) -> None:
        g = grid.double()
        self.bad = aten.logical_not(aten.isfinite(g).all(-1))  # a non-finite coordinate: NaN out
        g = aten.where(self.bad.unsqueeze(-1), 0.0, g)
        self.sizes = list(sizes)  # along x, y, z
        self.coords: List[Tensor] = [self._unnormalize(g[..., k], size, align) for k, size in enumerate(self.sizes)]
        self.clips: List[Optional[Tensor]] = [None] * len(self.sizes)
        self.signs: List[Optional[Tensor]] = [None] * len(self.sizes)
        for k, size in enumerate(self.sizes):
            if padding_mode == 2:  # reflection, then the border's clamp
                self.coords[k], self.signs[k] = self._reflect(self.coords[k], size, align)
            if padding_mode in (1, 2):  # border
                self.clips[k] = aten.logical_and(aten.gt(self.coords[k], 0), aten.lt(self.coords[k], size - 1))
                self.coords[k] = aten.clamp(self.coords[k], 0, size - 1)
        self.mults = [(size - 1) / 2 if align else size / 2 for size in self.sizes]

    @staticmethod
    def _reflect(c: Tensor, size: int, align: bool) -> tuple:
        """torch's reflect_coordinates in binary64 and the sign it gives the gradient: between min = 0 and
        size − 1 (align_corners) or −½ and size − ½, d = RN(c − min), e = fmod(|d|, span) (exact),
        f = ⌊RN(|d| / span)⌋, c′ = e + min for even f, RN(span − e) + min for odd f; sign −1 for d < 0 times −1 for
        odd f. A single-pixel dimension with align_corners reflects everything to 0 (sign 0)."""
        low, high = (0.0, 2.0 * (size - 1)) if align else (-1.0, 2.0 * size - 1.0)
        if low == high:
            return aten.zeros_like(c), aten.zeros_like(c)
        lo, span = low / 2, (high - low) / 2
        d = aten.sub(c, lo)
        a = aten.abs(d)
        extra = aten.fmod(a, span)
        odd = aten.eq(aten.remainder(aten.floor(aten.div(a, span)), 2.0), 1.0)
        r = aten.where(odd, aten.add(aten.rsub(extra, span), lo), aten.add(extra, lo))
        sign = aten.mul(aten.where(aten.lt(d, 0), -1.0, 1.0), aten.where(odd, -1.0, 1.0))
        return r, sign

    @staticmethod
    def _unnormalize(c: Tensor, size: int, align: bool) -> Tensor:
        if align:
            return aten.mul(aten.div(aten.add(c, 1.0), 2.0), float(size - 1))
        return aten.div(aten.sub(aten.mul(aten.add(c, 1.0), float(size)), 1.0), 2.0)

    def corner(self, at: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
        """(flat index (z·H + y)·W + x clamped into the input, inside mask) of integer-valued binary64 coordinates
        along x, y, z."""
        inside, flat, stride = None, None, 1
        for c, size in zip(at, self.sizes):
            ok = aten.logical_and(aten.ge(c, 0), aten.le(c, size - 1))
            inside = ok if inside is None else aten.logical_and(inside, ok)
            term = aten.mul(aten.clamp(c, 0, size - 1).to(torch.int64), stride)
            flat = term if flat is None else aten.add(flat, term)
            stride *= size
        return flat, inside


def _gather_corner(planes: Tensor, flat: Tensor, inside: Tensor) -> Tensor:
    """planes [N, C, P_in] (float32), flat / inside [N, P] → [N, C, P], +0 outside the input."""
    n, c, _ = planes.shape
    v = aten.gather(planes, 2, flat.unsqueeze(1).expand([n, c, flat.shape[1]]))
    return aten.where(inside.unsqueeze(1), v, 0.0)


def _corner_bits(d: int) -> List[Tuple[int, ...]]:
    """Each corner's (x, y, z) offsets in corner order: z outermost, x innermost."""
    return [tuple(reversed(bits)) for bits in itertools.product((0, 1), repeat=d)]


def _linear_parts(s: _Sampling) -> tuple:
    """Corners (flat, inside) in corner order, their float32 weights, and each axis' binary64 distances
    (to the low corner's far side, to the low corner)."""
    lows = [aten.floor(c) for c in s.coords]
    highs = [aten.add(low, 1.0) for low in lows]
    distances = [(aten.sub(high, c), aten.sub(c, low)) for c, low, high in zip(s.coords, lows, highs)]  # exact
    corners, weights = [], []
    for bits in _corner_bits(len(s.coords)):
        corners.append(s.corner([highs[k] if b else lows[k] for k, b in enumerate(bits)]))
        w = None
        for k, b in enumerate(bits):
            w = distances[k][b] if w is None else aten.mul(w, distances[k][b])
        weights.append(w.to(torch.float32))
    return corners, weights, distances


def _args(a: dict) -> tuple:
    x, grid = a["input"], a["grid"]
    mode, padding, align = a.get("interpolation_mode", 0), a.get("padding_mode", 0), a.get("align_corners", True)
    routes._need_carbon_dtype("grid_sample", x, grid)
    if x.dim() not in (4, 5):
        return None
    if mode not in (0, 1) or padding not in (0, 1, 2):
        raise routes.NotCovered("grid_sample with bicubic interpolation")
    return x, grid, mode, padding, align


def _layout(x: Tensor, grid: Tensor, padding: int, align: bool) -> tuple:
    """(N, C, input points, output spatial shape, sampling) for an image or a volume."""
    n, c = x.shape[:2]
    spatial = list(x.shape[2:])  # (H, W) or (D, H, W)
    out_spatial = list(grid.shape[1:-1])
    s = _Sampling(grid.reshape([n, math.prod(out_spatial), len(spatial)]), spatial[::-1], padding, align)
    return n, c, math.prod(spatial), out_spatial, s


def grid_sample(a: dict) -> Any:
    """grid_sample forward (module docstring): in float32, rounded to the input's dtype at the end. Nearest: the
    value at the coordinate rounded half to even (a copy). A non-finite coordinate gives NaN."""
    parsed = _args(a)
    if parsed is None:
        return routes.PASS
    x, grid, mode, padding, align = parsed
    n, c, points, out_spatial, s = _layout(x, grid, padding, align)
    planes = x.reshape([n, c, points]).to(torch.float32)
    if mode == 1:
        flat, inside = s.corner([aten.round(k) for k in s.coords])
        out = _gather_corner(planes, flat, inside)
    else:
        corners, weights, _ = _linear_parts(s)
        out = None
        for (flat, inside), wt in zip(corners, weights):
            term = aten.mul(_gather_corner(planes, flat, inside), wt.unsqueeze(1))
            out = term if out is None else aten.add(out, term)
    out = aten.where(s.bad.unsqueeze(1), math.nan, out)
    return out.reshape([n, c, *out_spatial]).to(x.dtype)


def _grid_gradient(s: _Sampling, gp: Tensor, planes: Tensor, corners: list, distances: list) -> Tensor:
    """[N, P, d] per the module docstring."""
    d = len(s.coords)
    v = {bits: _gather_corner(planes, flat, inside) for bits, (flat, inside) in zip(_corner_bits(d), corners)}
    components = []
    for axis in range(d):
        t = None
        for bits in _corner_bits(d):
            if bits[axis]:
                continue
            high = tuple(1 if k == axis else b for k, b in enumerate(bits))
            w = None
            for k, b in enumerate(bits):
                if k != axis:
                    w = distances[k][b] if w is None else aten.mul(w, distances[k][b])
            term = aten.mul(w.to(torch.float32).unsqueeze(1), aten.sub(v[high], v[bits]))
            t = term if t is None else aten.add(t, term)
        dot = carbon_ops.sum(aten.stack(routes.exact_product_parts(gp, t), -1), [1, 3], False, torch.float32)
        r = aten.mul(dot, float(torch.tensor(s.mults[axis], dtype=torch.float32)))
        if s.clips[axis] is not None:
            r = aten.where(s.clips[axis], r, 0.0)
        if s.signs[axis] is not None:  # reflection: ±1 (exact), 0 for a reflected-away single-pixel dimension
            r = aten.mul(r, s.signs[axis].to(torch.float32))
        components.append(aten.where(s.bad, math.nan, r))
    return aten.stack(components, -1)


def grid_sample_backward(a: dict) -> Any:
    """(input gradient, grid gradient) per the module docstring; nearest: a grid gradient of 0. Non-finite
    coordinates: NaN grid gradient, no input gradient."""
    parsed = _args(a)
    if parsed is None:
        return routes.PASS
    x, grid, mode, padding, align = parsed
    g = a["grad_output"]
    mask = a.get("output_mask", [True, True])
    n, c, points, _, s = _layout(x, grid, padding, align)
    gp = g.reshape([n, c, -1]).to(torch.float32)
    ok = aten.logical_not(s.bad).unsqueeze(1)
    if mode == 1:
        corners, weights, distances = [s.corner([aten.round(k) for k in s.coords])], [None], None
    else:
        corners, weights, distances = _linear_parts(s)
    grad_input = None
    if mask[0]:
        dest, contrib = [], []
        base = aten.mul(aten.arange(n, device=x.device), points).unsqueeze(1)
        for (flat, inside), wt in zip(corners, weights):
            share = gp if wt is None else aten.mul(gp, wt.unsqueeze(1))
            share = aten.where(aten.logical_and(inside.unsqueeze(1), ok), share, 0.0)
            dest.append(aten.add(flat, base).reshape([-1]))
            contrib.append(aten.movedim(share, 1, 2).reshape([-1, c]))
        total = carbon_ops.index_add(aten.zeros([n * points, c], dtype=torch.float32, device=x.device), 0,
                                     aten.cat(dest), aten.cat(contrib))
        grad_input = aten.movedim(total.reshape([n, points, c]), 2, 1).reshape(x.shape).to(x.dtype)
    grad_grid = None
    if mask[1]:
        if mode == 1:
            grad_grid = aten.zeros_like(grid)
        else:
            planes = x.reshape([n, c, points]).to(torch.float32)
            grad_grid = _grid_gradient(s, gp, planes, corners, distances).reshape(grid.shape).to(grid.dtype)
    return grad_input, grad_grid


def cudnn_grid_sampler(a: dict) -> Any:
    return grid_sample({"input": a["self"], "grid": a["grid"], "interpolation_mode": 0, "padding_mode": 0,
                        "align_corners": True})


def cudnn_grid_sampler_backward(a: dict) -> Any:
    return grid_sample_backward({"grad_output": a["grad_output"], "input": a["self"], "grid": a["grid"],
                                 "interpolation_mode": 0, "padding_mode": 0, "align_corners": True})
