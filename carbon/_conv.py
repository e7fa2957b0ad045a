"""Convolutions as exact matrix products (docs/contract.md §3, "Convolutions").

A convolution output is a dot product over one window of the zero-padded
input; copying every window into a column (im2col: copies only, no
arithmetic) turns the whole convolution into one `carbon.mm` per group, so each output is
the correctly rounded exact sum of its window's products (plus the bias)
and does not depend on the batch, the thread count or the device.

The gradients are exact sums too:

- weight: Σ over every batch element and output position of g · window, one
  `carbon.bmm` over all of them (never a sum of per-sample rounded parts);
- input: the transposed convolution, computed as a stride-1 convolution of
  the gradient spread out by the stride (zeros between and around its
  values) with the flipped, transposed weight. The zeros add +0·w terms; they
  change no value, only (as the contract states) the sign of an all-zero sum
  and a 0·∞ with an infinite weight;
- bias: `carbon.sum` over the batch and every output position.

Transposed convolutions (ConvTranspose*d) are the same two computations
with the roles swapped: their forward is the input-gradient computation
above (bias inside the rounding), their input gradient a convolution.

Used by carbon.enable's `convolution` / `convolution_backward` routes.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["conv_forward", "conv_backward", "conv_transpose_forward", "conv_transpose_backward"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon


def _columns(x: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
             padding: Sequence[int], groups: int, windows: Optional[Sequence[int]] = None) -> Tuple[Tensor, List[int]]:
    """Every window of x [N, C, L...] zero-padded by `padding`, as columns:
    [groups, (C / groups) * prod(kernel), N * prod(out)], rows ordered (c, k...)
    and columns (n, out...), and the output sizes. (Columns rather than rows:
    the copy's innermost loop then runs along an output row, not along the
    few kernel taps, which makes the copy several times faster.)"""
    d = len(kernel)
    pads: List[int] = []
    for i in reversed(range(d)):  # constant_pad_nd lists the last dimension first
        pads += [padding[i], padding[i]]
    xp = aten.constant_pad_nd(x, pads, 0.0) if any(pads) else x.contiguous()  # +0 padding
    n, c = xp.shape[:2]
    size = xp.shape[2:]
    out = [(size[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(d)]
    if windows is not None:  # only the first windows (a transposed convolution's output_padding adds a tail)
        out = [min(o, w) for o, w in zip(out, windows)]
    sn, sc, *sl = xp.stride()
    cg = c // groups
    view = xp.as_strided([groups, cg, *kernel, n, *out],
                         [cg * sc, sc, *(sl[i] * dilation[i] for i in range(d)), sn,
                          *(sl[i] * stride[i] for i in range(d))])
    return view.reshape(groups, cg * math.prod(kernel), n * math.prod(out)), out


def _grouped_rows(t: Tensor, groups: int) -> Tensor:
    """[N, G*Og, S...] -> [G, N * prod(S), Og] (a copy)."""
    n, o = t.shape[:2]
    spatial = list(t.shape[2:])
    v = t.reshape(n, groups, o // groups, *spatial).movedim(1, 0).movedim(2, -1)
    return v.reshape(groups, n * math.prod(spatial), o // groups)


def conv_forward(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], groups: int,
                 windows: Optional[Sequence[int]] = None) -> Tensor:
    """out[n, o, q] = RN(bias[o] + Σ_{c, k} xpad[n, g·Cg + c, q·s + k·dil] · w[o, c, k]), one rounding
    (only the first `windows` positions q when given)."""
    kernel = list(weight.shape[2:])
    cols, out = _columns(x, kernel, stride, dilation, padding, groups, windows)
    o = weight.shape[0]
    w = weight.reshape(groups, o // groups, -1)  # [G, Og, Cg*K]
    if bias is None:
        y = carbon_ops.bmm(w, cols)
    else:
        y = carbon_ops.baddbmm(bias.reshape(groups, o // groups, 1), w, cols)
    # [G, Og, N*Q] -> [N, G*Og, Q...]
    n = x.shape[0]
    return y.reshape(o, n, *out).movedim(1, 0).contiguous()


def _transposed_conv(g: Tensor, weight: Tensor, bias: Optional[Tensor], input_size: Sequence[int],
                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> Tensor:
    """The transposed convolution of g [N, O, Q...] with a convolution weight [O, Cg, K...] onto
    input_size: the convolution's input gradient, and ConvTranspose's forward (plus its bias)."""
    d = len(input_size)
    kernel = list(weight.shape[2:])
    reach = [dilation[i] * (kernel[i] - 1) for i in range(d)]
    padded = [input_size[i] + 2 * padding[i] for i in range(d)]
    # g[t] at position t*s + reach of a zero tensor long enough for a stride-1
    # convolution over every padded input position.
    spread = g.new_zeros([g.shape[0], g.shape[1], *(padded[i] + reach[i] for i in range(d))])
    out = list(g.shape[2:])
    index = [slice(None), slice(None)] + [slice(reach[i], reach[i] + (out[i] - 1) * stride[i] + 1, stride[i])
                                          for i in range(d)]
    spread[tuple(index)] = g
    o, cg = weight.shape[:2]
    flipped = weight.flip(list(range(2, 2 + d)))
    # [G*Og, Cg, *K] -> [G*Cg, Og, *K]: the convolution from gradient channels to input channels.
    transposed = flipped.reshape(groups, o // groups, cg, *kernel).transpose(1, 2).reshape(groups * cg, o // groups, *kernel)
    full = conv_forward(spread, transposed, bias, [1] * d, [0] * d, dilation, groups)
    crop = [slice(None), slice(None)] + [slice(padding[i], padding[i] + input_size[i]) for i in range(d)]
    return full[tuple(crop)].contiguous()


def _weight_gradient(grad: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], groups: int) -> Tensor:
    """dw[o, c, k] = RN(Σ_{n, q} grad[n, o, q] · xpad[n, g·Cg + c, q·s + k·dil]): one exact sum per weight, over
    the grad's positions q (x may extend past the last window: a transposed convolution's output_padding)."""
    cols, _ = _columns(x, list(weight.shape[2:]), stride, dilation, padding, groups,
                       windows=list(grad.shape[2:]))  # [G, Cg*K, N*Q]
    # The transposed gradient, [G, Cg*K, Og], from two contiguous operands.
    grad_weight_t = carbon_ops.bmm(cols, _grouped_rows(grad, groups), weight.dtype)
    return grad_weight_t.transpose(1, 2).reshape(weight.shape)


def _bias_gradient(grad: Tensor) -> Tensor:
    return carbon_ops.sum(grad, [0] + list(range(2, grad.dim())), False, grad.dtype)


Gradients = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


def conv_backward(grad: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], groups: int, mask: Sequence[bool]) -> Gradients:
    """(grad_input, grad_weight, grad_bias) for the entries of `mask` that are set."""
    return (_transposed_conv(grad, weight, None, list(x.shape[2:]), stride, padding, dilation, groups)
            if mask[0] else None,
            _weight_gradient(grad, x, weight, stride, padding, dilation, groups) if mask[1] else None,
            _bias_gradient(grad) if mask[2] else None)


def conv_transpose_size(x: Tensor, weight: Tensor, stride: Sequence[int], padding: Sequence[int],
                        output_padding: Sequence[int], dilation: Sequence[int]) -> List[int]:
    kernel = weight.shape[2:]
    return [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
            for i in range(x.dim() - 2)]


def conv_transpose_forward(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int],
                           padding: Sequence[int], output_padding: Sequence[int], dilation: Sequence[int],
                           groups: int) -> Tensor:
    """ConvTranspose (weight [Cin, Cout/G, K...]): the input gradient of the convolution from the output
    back to x, with the bias inside the single rounding."""
    size = conv_transpose_size(x, weight, stride, padding, output_padding, dilation)
    return _transposed_conv(x, weight, bias, size, stride, padding, dilation, groups)


def conv_transpose_backward(grad: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int],
                            padding: Sequence[int], dilation: Sequence[int], groups: int,
                            mask: Sequence[bool]) -> Gradients:
    """ConvTranspose's gradients: the input's is the convolution of grad with the same weight; the
    weight's the convolution weight gradient with the roles of grad (the windowed input) and x swapped."""
    return (conv_forward(grad, weight, None, stride, padding, dilation, groups, list(x.shape[2:])) if mask[0] else None,
            _weight_gradient(x, grad, weight, stride, padding, dilation, groups) if mask[1] else None,
            _bias_gradient(grad) if mask[2] else None)
