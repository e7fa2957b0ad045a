"""The routes of tests/test_enable_more_ops.py on a GPU give the CPU's bits, forward and backward (skipped
without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import carbon
from tests.oracle import as_bits

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _data(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _fold(d):
    return F.fold(d["cols"], (7, 9), 3, padding=1, stride=2)


def _grid_sample(d):
    return F.grid_sample(d["img"], d["grid"], mode="bilinear", padding_mode="border", align_corners=False)


def _affine(d):
    return F.affine_grid(d["theta"], (2, 1, 5, 6), align_corners=False)


def _cdist(d):
    return torch.cdist(d["a"], d["b"])


def _bag(d):
    return F.embedding_bag(d["idx"], d["table"], d["offsets"], mode="mean")


def _pool3d(d):
    return F.avg_pool3d(d["vol"], 2, 2, ceil_mode=True, count_include_pad=False)


def _bicubic(d):
    return F.interpolate(d["img"], scale_factor=2.5, mode="bicubic")


def _antialias(d):
    return F.interpolate(d["img"], size=(4, 5), mode="bilinear", antialias=True) + \
        F.interpolate(d["img"], size=(4, 5), mode="bicubic", antialias=True)


def _logcumsumexp(d):
    return torch.logcumsumexp(d["img"] * 4, -1)


def _multi_margin(d):
    scores = d["a"] / 1e3
    targets = torch.arange(40, device=scores.device) % 6
    return F.multi_margin_loss(scores, targets, p=2, reduction="none")


def _grid_sample_reflection(d):
    return F.grid_sample(d["img"], d["grid"] * 2.5, mode="bilinear", padding_mode="reflection", align_corners=True)


def _rope(d):
    cis = torch.polar(torch.ones_like(d["freqs"]), d["freqs"])
    return torch.view_as_real(torch.view_as_complex(d["q"].reshape(4, 8, 2)) * cis).flatten(-2)


def _ctc(d):
    return F.ctc_loss(d["lp"], d["targets"].to(d["lp"].device), torch.tensor([6, 5]), torch.tensor([2, 3]),
                      reduction="sum")


def _p_norms(d):
    return torch.stack([torch.linalg.vector_norm(d["a"], 3), torch.dist(d["a"][:7], d["b"], 2.5)])


def _addr(d):
    return torch.addr(d["img"][0, 0], d["a"][:7, 0], d["b"][0, :9].repeat(2)[:9]) + \
        torch.addr(d["img"][0, 1], d["a"][:7, 1], d["b"][1, :9].repeat(2)[:9], beta=0.5, alpha=3.0)


def _bessel(d):
    x = d["img"] * 12
    return torch.special.i0(x) + torch.special.i0e(x) + torch.special.i1(x) + torch.special.i1e(x) + \
        torch.kaiser_window(x.shape[-1], True, 9.0, device=x.device)


def _volumes(d):
    warped = F.grid_sample(d["vol"], d["grid3"], mode="bilinear", padding_mode="reflection", align_corners=False)
    return warped + F.affine_grid(d["theta3"], (1, 2, 3, 4, 5), align_corners=False).sum()


def _cpu_indices(d):
    # a device tensor indexed by CPU index tensors (torch allows it): the backward's index_put gets CPU indices
    return d["table"][torch.tensor([3, 1, 3, 0])][:, [0, 2, 2, 5]]


CASES = {"fold": _fold, "grid_sample": _grid_sample, "affine_grid": _affine, "cdist": _cdist,
         "embedding_bag": _bag, "avg_pool3d": _pool3d, "bicubic": _bicubic, "antialias": _antialias,
         "logcumsumexp": _logcumsumexp, "multi_margin": _multi_margin, "complex rope": _rope, "ctc": _ctc,
         "grid_sample reflection": _grid_sample_reflection, "p-norms": _p_norms, "addr": _addr,
         "bessel": _bessel, "grid_sample volumes": _volumes,
         "cpu indices": _cpu_indices}


def _inputs():
    return {
        "cols": _data(2, 18, 20, seed=1), "img": _data(2, 3, 7, 9, seed=2), "grid": _data(2, 4, 5, 2, seed=3) * 0.8,
        "theta": _data(2, 2, 3, seed=4), "a": _data(40, 6, seed=5, scale=1e3), "b": _data(7, 6, seed=6, scale=1e3),
        "idx": torch.tensor([3, 1, 2, 3, 5, 0, 7]), "table": _data(12, 6, seed=7), "offsets": torch.tensor([0, 3, 3]),
        "vol": _data(1, 2, 5, 6, 7, seed=8), "q": _data(4, 16, seed=9), "freqs": _data(4, 8, seed=10),
        "lp": _data(6, 2, 5, seed=11).log_softmax(2), "targets": torch.tensor([[1, 2, 0], [3, 3, 4]]),
        "grid3": _data(1, 3, 4, 5, 3, seed=12) * 1.3, "theta3": _data(1, 3, 4, seed=13),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_route_on_cuda_equals_the_cpu_forward_and_backward(name):
    results = []
    for device in ("cpu", "cuda"):
        d = {k: (v.to(device).requires_grad_() if v.is_floating_point() and k != "freqs" else v.to(device))
             for k, v in _inputs().items()}  # rotary frequencies are buffers: no gradient
        with carbon.enabled():
            out = CASES[name](d)
            real = torch.view_as_real(out) if out.is_complex() else out
            g = torch.linspace(-1, 1, real.numel(), device=device).reshape(real.shape)
            real.backward(g)
        grads = [as_bits(v.grad.cpu()) for v in d.values() if v.is_floating_point() and v.grad is not None]
        results.append([as_bits(real.detach().cpu())] + grads)
    for k, (c, g) in enumerate(zip(*results)):
        assert torch.equal(c, g), f"{name}: tensor {k}"


def test_nms_and_roi_align_on_cuda_equal_the_cpu():
    torchvision = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(12)
    xy = torch.rand(200, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + torch.rand(200, 2, generator=g) * 20 + 1], 1)
    scores = torch.rand(200, generator=g)
    x = torch.randn(2, 4, 16, 16, generator=g)
    rois = torch.tensor([[0, 1.0, 2.0, 9.5, 12.0], [1, -2.0, 3.0, 15.0, 17.0]])
    out = []
    for device in ("cpu", "cuda"):
        with carbon.enabled():
            keep = torchvision.ops.nms(boxes.to(device), scores.to(device), 0.5)
            pooled = torchvision.ops.roi_align(x.to(device), rois.to(device), (3, 3), 0.5, 2, True)
        out.append((keep.cpu(), as_bits(pooled.cpu())))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
