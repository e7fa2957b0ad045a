"""nn.LSTM / GRU / RNN and their cells under carbon.enable on a GPU: the CPU's bits, forward and backward (cuDNN's
and CUDA's fused cells would differ; carbon runs the CPU's recurrence there). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]

MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}


def _bits_of_step(kind: str, device: str, packed: bool) -> list:
    torch.manual_seed(0)
    options = dict(num_layers=2, bidirectional=True, dropout=0.3, batch_first=True)
    if kind == "lstm":
        options["proj_size"] = 4
    model = MODULES[kind](5, 6, **options).to(device)
    x = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    with carbon.enabled(seed=2):
        inp = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([7, 5, 2]), batch_first=True) if packed else x
        out = model(inp)
        y = out[0].data if packed else out[0]
        states = out[1] if isinstance(out[1], tuple) else (out[1],)
        (y.square().sum() + sum(h.square().sum() for h in states)).backward()
    tensors = [y, *states, x.grad, *(p.grad for p in model.parameters())]
    return [as_bits(t.detach().cpu()) for t in tensors]


@pytest.mark.parametrize("kind", sorted(MODULES))
@pytest.mark.parametrize("packed", [False, True])
def test_recurrent_layers_on_the_gpu_equal_the_cpu(kind, packed):
    for k, (g, c) in enumerate(zip(_bits_of_step(kind, "cuda", packed), _bits_of_step(kind, "cpu", packed))):
        assert torch.equal(g, c), f"tensor {k}"


def test_cells_on_the_gpu_equal_the_cpu():
    results = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        cells = [torch.nn.LSTMCell(5, 6).to(device), torch.nn.GRUCell(5, 6).to(device), torch.nn.RNNCell(5, 6).to(device)]
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3)).to(device).requires_grad_()
        with carbon.enabled():
            h, c = cells[0](x)
            loss = h.square().sum() + c.square().sum() + cells[1](x).square().sum() + cells[2](x).square().sum()
            loss.backward()
        results[device] = [as_bits(t.detach().cpu()) for t in [h, c, x.grad] + [p.grad for m in cells for p in m.parameters()]]
    for g, c in zip(results["cuda"], results["cpu"]):
        assert torch.equal(g, c)
