"""nn.LSTM / GRU / RNN on a GPU under carbon.enable: ATen's CPU recurrence, op for op (docs/enable.md, "Recurrent
layers").

On the CPU (oneDNN switched off while enabled) torch's RNN code (aten/src/ATen/native/RNN.cpp) runs routed ops: the
input projection of the whole sequence by one `linear` (bias inside the rounding), then per step
`linear(h, w_hh, b_hh).add_(projected input)`, the gates' sigmoid / tanh in place, and so on. On a GPU the same
code takes another path — cuDNN, or `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell`, which add the two biases and
the two products in their own order inside one kernel — so its bits could not equal the CPU's. Here the CPU path is
written out in Python with the same aten ops in the same order, in place where torch's are, and run for tensors on
any device: the forward ops are the CPU's, autograd records the same graph, and so the backward ops are the CPU's
too (tests/test_enable_rnn.py checks bit equality with torch's own CPU path, forward and every gradient).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["recurrent", "cell"]

aten = torch.ops.aten


class _Params:
    """One direction of one layer: ATen's CellParams (w_ih, w_hh, optional biases, optional projection)."""

    def __init__(self, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor], b_hh: Optional[Tensor],
                 w_hr: Optional[Tensor]) -> None:
        self.w_ih, self.w_hh, self.b_ih, self.b_hh, self.w_hr = w_ih, w_hh, b_ih, b_hh, w_hr

    def linear_ih(self, x: Tensor) -> Tensor:
        return aten.linear(x, self.w_ih, self.b_ih)

    def linear_hh(self, h: Tensor) -> Tensor:
        return aten.linear(h, self.w_hh, self.b_hh)

    def matmul_hr(self, h: Tensor) -> Tensor:
        return h if self.w_hr is None else aten.matmul(h, aten.t(self.w_hr))


def _gather_params(flat: Sequence[Tensor], has_biases: bool, has_projections: bool) -> List[_Params]:
    per = (2 + 2 * has_biases) + has_projections
    if len(flat) % per:
        raise RuntimeError("got an incorrect number of RNN parameters")
    out = []
    for i in range(0, len(flat), per):
        group = list(flat[i:i + per])
        w_ih, w_hh = group[0], group[1]
        b_ih, b_hh = (group[2], group[3]) if has_biases else (None, None)
        out.append(_Params(w_ih, w_hh, b_ih, b_hh, group[-1] if has_projections else None))
    return out


# ---- cells (projected: the step's input is already linear_ih of it, as in a layer on the CPU) --------------------

def _lstm_cell(x: Tensor, hidden: Tuple[Tensor, Tensor], p: _Params, projected: bool = True) -> Tuple[Tensor, Tensor]:
    hx, cx = hidden
    gates = p.linear_hh(hx)  # before linear_ih: C++ sequences a member call's object before its argument
    gates = gates.add_(x if projected else p.linear_ih(x))
    ingate, forgetgate, cellgate, outgate = aten.unsafe_chunk(gates, 4, 1)
    ingate = ingate.sigmoid_()
    forgetgate = forgetgate.sigmoid_()
    cellgate = cellgate.tanh_()
    outgate = outgate.sigmoid_()
    cy = (forgetgate * cx).add_(ingate * cellgate)
    hy = outgate * cy.tanh()
    return p.matmul_hr(hy), cy


def _gru_cell(x: Tensor, hidden: Tensor, p: _Params, projected: bool = True) -> Tensor:
    i_r, i_z, i_n = aten.unsafe_chunk(x if projected else p.linear_ih(x), 3, 1)
    h_r, h_z, h_n = aten.unsafe_chunk(p.linear_hh(hidden), 3, 1)
    reset_gate = h_r.add_(i_r).sigmoid_()
    input_gate = h_z.add_(i_z).sigmoid_()
    new_gate = i_n.add(h_n.mul_(reset_gate)).tanh_()
    return (hidden - new_gate).mul_(input_gate).add_(new_gate)


def _simple_cell(nonlinearity: Callable[[Tensor], Tensor]) -> Callable:
    def cell(x: Tensor, hidden: Tensor, p: _Params, projected: bool = True) -> Tensor:
        gates = p.linear_hh(hidden)
        return nonlinearity(gates.add_(x if projected else p.linear_ih(x)))
    return cell


_CELLS = {"lstm": _lstm_cell, "gru": _gru_cell, "rnn_tanh": _simple_cell(aten.tanh),
          "rnn_relu": _simple_cell(aten.relu)}


def _output(hidden: Any) -> Tensor:
    return hidden[0] if isinstance(hidden, tuple) else hidden


def _concat(hiddens: List[Any]) -> Any:
    if isinstance(hiddens[0], tuple):
        return aten.cat([h[0] for h in hiddens], 0), aten.cat([h[1] for h in hiddens], 0)
    return aten.cat(hiddens, 0)


def _slice(hidden: Any, start: int, end: int) -> Any:
    if isinstance(hidden, tuple):
        return tuple(aten.narrow(h, 0, start, end - start) for h in hidden)
    return aten.narrow(hidden, 0, start, end - start)


# ---- layers -----------------------------------------------------------------------------------------------------

def _full_layer(cell: Callable, steps: List[Tensor], hidden: Any, p: _Params) -> Tuple[List[Tensor], Any]:
    outputs = []
    for x in steps:
        hidden = cell(x, hidden, p)
        outputs.append(_output(hidden))
    return outputs, hidden


def _padded_layer(cell: Callable, x: Tensor, hidden: Any, p: Any, bidirectional: bool) -> Tuple[Tensor, Any]:
    if not bidirectional:
        outputs, final = _full_layer(cell, list(aten.unbind(p.linear_ih(x), 0)), hidden, p)
        if not outputs:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        return aten.stack(outputs, 0), final
    forward_p, backward_p = p
    fw_outputs, fw_final = _full_layer(cell, list(aten.unbind(forward_p.linear_ih(x), 0)), hidden[0], forward_p)
    if not fw_outputs:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    fw = aten.stack(fw_outputs, 0)
    rev_steps = list(aten.unbind(backward_p.linear_ih(x), 0))[::-1]
    rev_outputs, rev_final = _full_layer(cell, rev_steps, hidden[1], backward_p)
    rev = aten.stack(rev_outputs[::-1], 0)
    return aten.cat([fw, rev], fw.dim() - 1), (fw_final, rev_final)


def _packed_forward(cell: Callable, data: Tensor, sizes: List[int], hidden: Any, p: _Params) -> Tuple[Tensor, Any]:
    projected = p.linear_ih(data)
    outputs, finished = [], []
    offset, last = 0, sizes[0]
    for size in sizes:
        step = aten.narrow(projected, 0, offset, size)
        offset += size
        dec = last - size
        if dec > 0:
            finished.append(_slice(hidden, last - dec, last))
            hidden = _slice(hidden, 0, last - dec)
        last = size
        hidden = cell(step, hidden, p)
        outputs.append(_output(hidden))
    finished.append(hidden)
    return aten.cat(outputs, 0), _concat(finished[::-1])


def _packed_reversed(cell: Callable, data: Tensor, sizes: List[int], initial: Any, p: _Params) -> Tuple[Tensor, Any]:
    projected = p.linear_ih(data)
    outputs = []
    offset, last = data.shape[0], sizes[-1]
    hidden = _slice(initial, 0, sizes[-1])
    for size in reversed(sizes):
        inc = size - last
        if inc > 0:
            hidden = _concat([hidden, _slice(initial, last, size)])
        step = aten.narrow(projected, 0, offset - size, size)
        offset -= size
        last = size
        hidden = cell(step, hidden, p)
        outputs.append(_output(hidden))
    return aten.cat(outputs[::-1], 0), hidden


def _packed_layer(cell: Callable, data: Tensor, sizes: List[int], hidden: Any, p: Any,
                  bidirectional: bool) -> Tuple[Tensor, Any]:
    if not bidirectional:
        return _packed_forward(cell, data, sizes, hidden, p)
    fw, fw_final = _packed_forward(cell, data, sizes, hidden[0], p[0])
    rev, rev_final = _packed_reversed(cell, data, sizes, hidden[1], p[1])
    return aten.cat([fw, rev], -1), (fw_final, rev_final)


def _dropout(x: Tensor, p: float) -> Tensor:
    """at::dropout(x, p, train=True) as it decomposes for a CPU tensor (its CUDA form is native_dropout)."""
    if p == 1:
        return x * aten.zeros([], dtype=x.dtype, device=x.device)
    noise = aten.empty_like(x).bernoulli_(1 - p)
    noise.div_(1 - p)
    return x * noise


def _stack(cell: Callable, layer: Callable, x: Tensor, hiddens: List[Any], params: List[_Params], num_layers: int,
           dropout_p: float, train: bool, bidirectional: bool) -> Tuple[Tensor, List[Any]]:
    if bidirectional:
        hiddens = [(hiddens[i], hiddens[i + 1]) for i in range(0, len(hiddens), 2)]
        params = [(params[i], params[i + 1]) for i in range(0, len(params), 2)]  # type: ignore[misc]
    if len(hiddens) != num_layers or len(params) != num_layers:
        raise RuntimeError("Expected more hidden states in stacked_rnn")
    finals = []
    for index in range(num_layers):
        x, final = layer(cell, x, hiddens[index], params[index], bidirectional)
        finals.append(final)
        if dropout_p != 0 and train and index < num_layers - 1:
            x = _dropout(x, dropout_p)
    if bidirectional:
        finals = [h for pair in finals for h in pair]
    return x, finals


def recurrent(kind: str, args: tuple) -> tuple:
    """torch.lstm / gru / rnn_tanh / rnn_relu with torch's positional arguments: (input, hx, params, has_biases,
    num_layers, dropout, train, bidirectional, batch_first) for a padded input (called time-major here), or
    (data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional) for a packed one."""
    cell = _CELLS[kind]
    packed = isinstance(args[1], Tensor) and args[1].dim() == 1 and not args[1].is_floating_point()
    if packed:
        data, batch_sizes, hx, flat, has_biases, num_layers, dropout_p, train, bidirectional = args
        sizes = [int(s) for s in batch_sizes.tolist()]  # a CPU tensor in a PackedSequence: no device sync
        layer: Callable = lambda c, x, h, p, b: _packed_layer(c, x, sizes, h, p, b)  # noqa: E731
        x = data
    else:
        x, hx, flat, has_biases, num_layers, dropout_p, train, bidirectional, batch_first = args
        if batch_first:
            x = x.transpose(0, 1)
        layer = _padded_layer
    if kind == "lstm":
        h0, c0 = hx
        projections = h0.shape[2] != c0.shape[2]
        params = _gather_params(flat, has_biases, projections)
        hiddens: List[Any] = list(zip(aten.unbind(h0, 0), aten.unbind(c0, 0)))
    else:
        params = _gather_params(flat, has_biases, False)
        hiddens = list(aten.unbind(hx, 0))
    out, finals = _stack(cell, layer, x, hiddens, params, num_layers, dropout_p, train, bidirectional)
    if not packed and batch_first:
        out = out.transpose(0, 1)
    if kind == "lstm":
        return out, aten.stack([h for h, _ in finals], 0), aten.stack([c for _, c in finals], 0)
    return out, aten.stack(finals, 0)


def cell(kind: str, args: tuple) -> Any:
    """torch.lstm_cell / gru_cell / rnn_tanh_cell / rnn_relu_cell (nn.LSTMCell, ...): (input, hx, w_ih, w_hh,
    b_ih=None, b_hh=None), the CPU's cell with the input projected inside it."""
    x, hx, w_ih, w_hh = args[:4]
    b_ih = args[4] if len(args) > 4 else None
    b_hh = args[5] if len(args) > 5 else None
    p = _Params(w_ih, w_hh, b_ih, b_hh, None)
    hidden = (hx[0], hx[1]) if kind == "lstm" else hx
    return _CELLS[kind](x, hidden, p, False)
