"""Unmodified torchvision models (a real client, test-only dependency) train one step under strict
carbon.enable with the same bits at one and two CPU threads: classification CNNs and a transformer, a
segmentation head (bilinear upsampling, adaptive pooling), Faster R-CNN (anchors, log2 level mapping,
RoIAlign, NMS, sampled proposals) and RAFT optical flow (grid_sample, unfold-based convex upsampling,
correlation by matmul)."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.oracle import as_bits

torchvision = pytest.importorskip("torchvision")
models = torchvision.models


def _step(build, inputs, threads: int) -> list:
    torch.set_num_threads(threads)
    with carbon.enabled(seed=0):
        model = build()
        model.train()
        out = model(*inputs)
        if isinstance(out, dict):  # segmentation: {"out": ...}; detection in training: its losses
            out = out["out"] if "out" in out else sum(out.values())
        if isinstance(out, list):  # RAFT: one flow per refinement step
            out = out[-1]
        (out.float() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return [as_bits(out.detach())] + [as_bits(p.grad) for p in model.parameters() if p.grad is not None]


def _images(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "resnet18": (lambda: models.resnet18(num_classes=10), lambda: (_images(2, 3, 64, 64),)),
    "mobilenet_v3_small": (lambda: models.mobilenet_v3_small(num_classes=10), lambda: (_images(2, 3, 64, 64),)),
    "vit": (lambda: models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                             mlp_dim=64, num_classes=10), lambda: (_images(2, 3, 32, 32),)),
    "lraspp": (lambda: models.segmentation.lraspp_mobilenet_v3_large(num_classes=3, weights_backbone=None),
               lambda: (_images(1, 3, 64, 64),)),
    "fasterrcnn": (lambda: models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None,
                                                                               num_classes=3),
                   lambda: ([torch.rand(3, 128, 128, generator=torch.Generator().manual_seed(3))],
                            [{"boxes": torch.tensor([[10.0, 10.0, 50.0, 60.0]]), "labels": torch.tensor([1])}])),
    "raft_small": (lambda: models.optical_flow.raft_small(),
                   lambda: (_images(1, 3, 128, 128, seed=1), _images(1, 3, 128, 128, seed=2), 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_torchvision_model_trains_to_the_same_bits_at_one_and_two_threads(name, restore_num_threads):
    build, inputs = CASES[name]
    one = _step(build, inputs(), 1)
    two = _step(build, inputs(), 2)
    assert len(one) == len(two) > 1
    for k, (a, b) in enumerate(zip(one, two)):
        assert torch.equal(a, b), f"{name}: tensor {k} differs between 1 and 2 threads"
