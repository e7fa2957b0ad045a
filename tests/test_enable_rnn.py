"""nn.LSTM / GRU / RNN and their cells on a GPU under carbon.enable run ATen's CPU recurrence written out in Python
(carbon/_enable_rnn.py). These tests run that mirror on the CPU and compare it bit for bit with torch's own CPU
path under carbon.enable (an independent implementation: ATen's C++), forward outputs, final states, the input's
gradient and every parameter's gradient: padded and packed sequences, batch-first, bidirectional, several layers,
dropout between layers (the same draws), LSTM projections, given initial states, and the four cells. Equal on the
CPU, the mirror gives the CPU's bits on every device (its ops are carbon's routes; tests/test_enable_rnn_cuda.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

import carbon
import carbon._enable as enable_module
from tests.oracle import as_bits

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")

MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN, "rnn_relu": torch.nn.RNN}
CELLS = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell, "rnn_tanh": torch.nn.RNNCell, "rnn_relu": torch.nn.RNNCell}


def _module(kind: str, **options) -> torch.nn.Module:
    if kind.startswith("rnn"):
        options["nonlinearity"] = kind[4:]
    torch.manual_seed(0)
    return MODULES[kind](5, 6, **options)


def _states(out) -> tuple:
    return out[1] if isinstance(out[1], tuple) else (out[1],)


def _run(kind: str, mirror: bool, monkeypatch, *, packed: bool = False, batch_first: bool = False,
         initial: bool = False, **options) -> list:
    """Bits of the output, final states, the input's gradient and every parameter's gradient."""
    model = _module(kind, batch_first=batch_first, **options)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*((3, 7, 5) if batch_first else (7, 3, 5)), generator=g).requires_grad_()
    layers = model.num_layers * (2 if model.bidirectional else 1)
    h0 = torch.randn(layers, 3, model.proj_size or 6, generator=g) if initial else None
    c0 = torch.randn(layers, 3, 6, generator=g) if initial else None
    with monkeypatch.context() as patch:
        if mirror:
            patch.setattr(enable_module, "_native_recurrence", lambda t: False)
        with carbon.enabled(seed=2):
            inp = x
            if packed:
                inp = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([7, 5, 2]), batch_first=batch_first)
            hidden = None if not initial else ((h0, c0) if kind == "lstm" else h0)
            out = model(inp, hidden)
            y = out[0].data if packed else out[0]
            loss = y.square().sum() + sum(h.square().sum() for h in _states(out))
            loss.backward()
    return [as_bits(y.detach())] + [as_bits(h.detach()) for h in _states(out)] + [as_bits(x.grad)] + \
        [as_bits(p.grad) for p in model.parameters()]


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for k, (u, v) in enumerate(zip(a, b)):
        assert torch.equal(u, v), f"tensor {k}"


@pytest.mark.parametrize("kind", sorted(MODULES))
@pytest.mark.parametrize("bidirectional,packed,batch_first", list(itertools.product((False, True), repeat=3)))
def test_the_written_out_recurrence_equals_torchs_cpu_path(kind, bidirectional, packed, batch_first, monkeypatch):
    options = dict(num_layers=2, bidirectional=bidirectional, dropout=0.3, packed=packed, batch_first=batch_first)
    _same(_run(kind, True, monkeypatch, **options), _run(kind, False, monkeypatch, **options))


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_initial_states_and_a_single_layer_without_biases(kind, monkeypatch):
    options = dict(num_layers=1, bias=False, initial=True)
    _same(_run(kind, True, monkeypatch, **options), _run(kind, False, monkeypatch, **options))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_projections(bidirectional, monkeypatch):
    options = dict(num_layers=2, bidirectional=bidirectional, proj_size=4, initial=True)
    _same(_run("lstm", True, monkeypatch, **options), _run("lstm", False, monkeypatch, **options))


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_cells_equal_torchs_cpu_cells(kind, monkeypatch):
    results = []
    for mirror in (True, False):
        torch.manual_seed(0)
        cell = CELLS[kind](5, 6, nonlinearity=kind[4:]) if kind.startswith("rnn") else CELLS[kind](5, 6)
        g = torch.Generator().manual_seed(3)
        x, h = torch.randn(4, 5, generator=g).requires_grad_(), torch.randn(4, 6, generator=g).requires_grad_()
        c = torch.randn(4, 6, generator=g).requires_grad_()
        with monkeypatch.context() as patch:
            if mirror:
                patch.setattr(enable_module, "_native_recurrence", lambda t: False)
            with carbon.enabled():
                out = cell(x, (h, c)) if kind == "lstm" else cell(x, h)
                outs = out if isinstance(out, tuple) else (out,)
                sum(o.square().sum() for o in outs).backward()
        leaves = [x, h] + ([c] if kind == "lstm" else [])
        results.append([as_bits(o.detach()) for o in outs] + [as_bits(t.grad) for t in leaves] +
                       [as_bits(p.grad) for p in cell.parameters()])
    _same(*results)


def test_sequences_are_batch_invariant_through_the_written_out_recurrence(monkeypatch):
    """A sequence alone and in a batch of three: the same bits (the mirror's per-step products are carbon's)."""
    model = _module("lstm", num_layers=2, batch_first=True)
    x = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(enable_module, "_native_recurrence", lambda t: False)
    with carbon.enabled(), torch.no_grad():
        whole = model(x)[0]
        alone = model(x[1:2])[0]
    assert torch.equal(as_bits(whole[1:2]), as_bits(alone))
