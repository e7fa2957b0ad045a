"""Backward formulas of Carbon's ops. Each gradient is computed by a carbon
op, so it is itself a correctly rounded exact result, rounded once into the
dtype of the input it belongs to:

    mm/bmm:     d a = RN(grad @ b^T),  d b = RN(a^T @ grad),  d bias = RN(sum of grad over broadcast dims)
    sum:        d x = RN(grad)            (broadcast back over the reduced dims)
    mean:       d x = RN(grad / n)
    round_to:   d x = RN(grad / divisor)
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from carbon._fake import reduced_dims


def reduce_to_shape(grad: Tensor, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """RN_dtype of the exact sum of ``grad`` over the dimensions that were
    broadcast to turn ``shape`` into ``grad.shape``: one rounding, whatever
    the number of summed elements (a product with a row of ones, whose
    products are exact)."""
    lead = grad.dim() - len(shape)
    padded = (1,) * lead + tuple(shape)
    summed = [d for d in range(grad.dim()) if padded[d] == 1 and grad.shape[d] != 1]
    kept = [d for d in range(grad.dim()) if d not in summed]
    rows = math.prod(grad.shape[d] for d in summed)
    columns = grad.permute(summed + kept).reshape(rows, math.prod(shape))
    ones = grad.new_ones((1, rows))
    return torch.ops.carbon.mm(ones, columns, dtype).reshape(shape)


def _setup_matmul(ctx: Any, inputs: tuple, output: Tensor) -> None:
    # inputs: (a, b, out_dtype) or (bias, a, b, out_dtype)
    has_bias = len(inputs) == 4
    a, b = inputs[1:3] if has_bias else inputs[0:2]
    ctx.save_for_backward(a, b)
    ctx.has_bias = has_bias
    if has_bias:
        ctx.bias_shape = tuple(inputs[0].shape)
        ctx.bias_dtype = inputs[0].dtype


def _matmul_grads(ctx: Any, grad: Tensor, product: Any) -> tuple:
    a, b = ctx.saved_tensors
    offset = 1 if ctx.has_bias else 0
    need = ctx.needs_input_grad
    grad_a = product(grad, b.transpose(-1, -2), a.dtype) if need[offset] else None
    grad_b = product(a.transpose(-1, -2), grad, b.dtype) if need[offset + 1] else None
    if not ctx.has_bias:
        return grad_a, grad_b, None
    grad_bias = reduce_to_shape(grad, ctx.bias_shape, ctx.bias_dtype) if need[0] else None
    return grad_bias, grad_a, grad_b, None


def _mm_backward(ctx: Any, grad: Tensor) -> tuple:
    return _matmul_grads(ctx, grad, torch.ops.carbon.mm)


def _bmm_backward(ctx: Any, grad: Tensor) -> tuple:
    return _matmul_grads(ctx, grad, torch.ops.carbon.bmm)


torch.library.register_autograd("carbon::mm", _mm_backward, setup_context=_setup_matmul)
torch.library.register_autograd("carbon::addmm", _mm_backward, setup_context=_setup_matmul)
torch.library.register_autograd("carbon::bmm", _bmm_backward, setup_context=_setup_matmul)
torch.library.register_autograd("carbon::baddbmm", _bmm_backward, setup_context=_setup_matmul)


def _setup_reduce(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, dim, keepdim, _ = inputs
    ctx.x_shape, ctx.x_dtype = tuple(x.shape), x.dtype
    ctx.reduced = reduced_dims("sum", x.dim(), dim)
    ctx.keepdim = keepdim
    ctx.count = math.prod(x.shape[d] for d in ctx.reduced)


def _broadcast_back(ctx: Any, grad: Tensor) -> Tensor:
    if not ctx.keepdim:
        for d in sorted(ctx.reduced):
            grad = grad.unsqueeze(d)
    return grad.expand(ctx.x_shape)


def _sum_backward(ctx: Any, grad: Tensor) -> tuple:
    # round_to even when the dtypes agree: it writes the canonical NaN, as
    # every carbon result does (an incoming NaN may carry any payload).
    return torch.ops.carbon.round_to(_broadcast_back(ctx, grad), ctx.x_dtype, 1), None, None, None


def _mean_backward(ctx: Any, grad: Tensor) -> tuple:
    if ctx.count == 0:  # x is empty: so is its gradient
        return grad.new_zeros(ctx.x_shape, dtype=ctx.x_dtype), None, None, None
    return torch.ops.carbon.round_to(_broadcast_back(ctx, grad), ctx.x_dtype, ctx.count), None, None, None


def _setup_round_to(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, _, divisor = inputs
    ctx.x_dtype, ctx.divisor = x.dtype, divisor


def _round_to_backward(ctx: Any, grad: Tensor) -> tuple:
    return torch.ops.carbon.round_to(grad, ctx.x_dtype, ctx.divisor), None, None


torch.library.register_autograd("carbon::sum", _sum_backward, setup_context=_setup_reduce)
torch.library.register_autograd("carbon::mean", _mean_backward, setup_context=_setup_reduce)
torch.library.register_autograd("carbon::round_to", _round_to_backward, setup_context=_setup_round_to)


# ---------------------------------------------------------------- softmax family
# Every gradient is carbon's own kernel (docs/contract.md §8): the softmax
# gradients need one exact sum per row, cross-entropy's only the saved
# log-probabilities.


def _setup_softmax(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, dim = inputs[:2]
    ctx.dim, ctx.x_dtype = dim, x.dtype
    ctx.save_for_backward(output)


def _as_output_dtype(grad: Tensor, y: Tensor) -> Tensor:
    return grad if grad.dtype == y.dtype else torch.ops.carbon.round_to(grad, y.dtype, 1)


def _softmax_backward(ctx: Any, grad: Tensor) -> tuple:
    (y,) = ctx.saved_tensors
    return torch.ops.carbon.softmax_backward(_as_output_dtype(grad, y), y, ctx.dim, ctx.x_dtype), None, None, None


def _log_softmax_backward(ctx: Any, grad: Tensor) -> tuple:
    (y,) = ctx.saved_tensors
    return (torch.ops.carbon.log_softmax_backward(_as_output_dtype(grad, y), y, ctx.dim, ctx.x_dtype), None, None,
            None)


def _setup_cross_entropy(ctx: Any, inputs: tuple, output: tuple) -> None:
    logits, target, reduction, ignore_index, label_smoothing = inputs
    _, log_probs, count = output
    ctx.mark_non_differentiable(log_probs, count)
    # The backward reads only the loss's gradient: without this, autograd
    # fills an [N, C] float32 zero gradient for log_probs on every backward
    # (a third of cross-entropy's backward time at a GPT-2 vocabulary).
    ctx.set_materialize_grads(False)
    ctx.args = (reduction, ignore_index, label_smoothing, logits.dtype)
    ctx.save_for_backward(log_probs, target, count)


def _cross_entropy_backward(ctx: Any, grad: Tensor, _grad_log_probs: Any, _grad_count: Any) -> tuple:
    log_probs, target, count = ctx.saved_tensors
    reduction, ignore_index, label_smoothing, dtype = ctx.args
    dx = torch.ops.carbon.cross_entropy_backward(
        grad, log_probs, target, count, reduction, ignore_index, label_smoothing, dtype
    )
    return dx, None, None, None, None


torch.library.register_autograd("carbon::softmax", _softmax_backward, setup_context=_setup_softmax)
torch.library.register_autograd("carbon::log_softmax", _log_softmax_backward, setup_context=_setup_softmax)
torch.library.register_autograd("carbon::cross_entropy", _cross_entropy_backward, setup_context=_setup_cross_entropy)


# ---------------------------------------------------------------- attention


def _setup_attention_logits(ctx: Any, inputs: tuple, output: Tensor) -> None:
    _, scale, _, _ = inputs
    ctx.scale = scale


def _attention_logits_backward(ctx: Any, grad: Tensor) -> tuple:
    # d/ds of RN32(s * scale + m) is the same step without the mask: RN32(dz * scale); d/dm is dz itself.
    grad_mask = grad if _needs(ctx, 2) else None
    return torch.ops.carbon.attention_logits(grad.float(), ctx.scale, None, False), None, grad_mask, None


torch.library.register_autograd(
    "carbon::attention_logits", _attention_logits_backward, setup_context=_setup_attention_logits
)
# ---------------------------------------------------------------------------
# Elementwise math: d x = RN_{x.dtype}(grad * f'(x)), one fp64 product of the
# incoming gradient and the derivative's fp64 core, rounded once
# (torch.ops.carbon.elementwise_backward). Self-contained section.
# ---------------------------------------------------------------------------


def _setup_elementwise(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.fn = "gelu_tanh" if len(inputs) > 1 and inputs[1] == "tanh" else None


def _elementwise_backward_for(name: str) -> Any:
    def backward(ctx: Any, grad: Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        fn = ctx.fn or name
        grad_x = torch.ops.carbon.elementwise_backward(grad, x, fn) if ctx.needs_input_grad[0] else None
        return (grad_x, None) if name == "gelu" else grad_x

    return backward


for _name in ("exp", "log", "tanh", "sigmoid", "erf", "gelu", "silu", "sin", "cos", "log1p", "softplus", "log_sigmoid",
              "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv", "asinh",
              "acosh", "atanh", "lgamma", "digamma", "trigamma"):
    torch.library.register_autograd(f"carbon::{_name}", _elementwise_backward_for(_name), setup_context=_setup_elementwise)
del _name


def _setup_sqrt(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(output)


def _sqrt_backward(ctx: Any, grad: Tensor) -> Tensor:
    (y,) = ctx.saved_tensors
    return grad / (2 * y)  # torch's formula: 2y is exact, then one IEEE division (the same bits on every device)


torch.library.register_autograd("carbon::sqrt", _sqrt_backward, setup_context=_setup_sqrt)
# ============================================================================
# Normalization (layer_norm, rms_norm). docs/contract.md §7:
#   dx = per row: exact means of g and g * xhat
#   d weight[j] = RN_w(sum over rows of dy[row, j] * xhat[row, j])   exact column sums
#   d bias[j]   = RN_b(sum over rows of dy[row, j])
# with xhat = RN32((x (-) mean) (x) rstd) (layer_norm) or RN32(x (x) rstd) (rms_norm),
# recomputed from the saved statistics. One carbon.norm_backward call returns the
# three (on the CPU from one pass over x and dy).


def _norm_backward(grad: Tensor, x: Tensor, normalized_shape: Sequence[int], mean: Optional[Tensor], rstd: Tensor,
                   weight: Optional[Tensor], need_x: bool, need_w: bool, need_b: bool) -> tuple:
    mask = [need_x, need_w and weight is not None, need_b]
    if not any(mask):
        return None, None, None
    outs = torch.ops.carbon.norm_backward(grad, x, normalized_shape, mean, rstd, weight, mask)
    return tuple(o if m else None for o, m in zip(outs, mask))


def _needs(ctx: Any, i: int) -> bool:
    # needs_input_grad omits trailing arguments left at their defaults
    need = ctx.needs_input_grad
    return i < len(need) and bool(need[i])


def _setup_layer_norm(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, mean, rstd, weight)
    ctx.normalized_shape = list(normalized_shape)
    ctx.has_bias = bias is not None


def _layer_norm_backward(ctx: Any, grad: Tensor, _grad_mean: Any, _grad_rstd: Any) -> tuple:
    x, mean, rstd, weight = ctx.saved_tensors
    grad_x, grad_w, grad_b = _norm_backward(grad, x, ctx.normalized_shape, mean, rstd, weight, _needs(ctx, 0),
                                            _needs(ctx, 2), ctx.has_bias and _needs(ctx, 3))
    return grad_x, None, grad_w, grad_b, None


def _setup_rms_norm(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, normalized_shape, weight, _ = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, rstd, weight)
    ctx.normalized_shape = list(normalized_shape)


def _rms_norm_backward(ctx: Any, grad: Tensor, _grad_rstd: Any) -> tuple:
    x, rstd, weight = ctx.saved_tensors
    grad_x, grad_w, _ = _norm_backward(grad, x, ctx.normalized_shape, None, rstd, weight, _needs(ctx, 0),
                                       _needs(ctx, 2), False)
    return grad_x, None, grad_w, None


torch.library.register_autograd("carbon::layer_norm", _layer_norm_backward, setup_context=_setup_layer_norm)
torch.library.register_autograd("carbon::rms_norm", _rms_norm_backward, setup_context=_setup_rms_norm)
# ============================================================================
# Indexed accumulation (index_add, scatter_add, embedding). docs/contract.md §11:
#   index_add:   d self = RN(grad),  d source = RN(grad gathered at index along dim)   (a gather is exact)
#   scatter_add: d self = RN(grad),  d src = RN(grad.gather(dim, index)), 0 outside index's shape
#   embedding:   d weight[j] = RN(exact sum of grad over the tokens equal to j)  (carbon.embedding_backward)
# RN into the same dtype only canonicalizes NaNs (carbon.round_to).


def _setup_index_add(ctx: Any, inputs: tuple, output: Tensor) -> None:
    self, dim, index, source = inputs
    ctx.dim, ctx.self_dtype, ctx.source_dtype = dim, self.dtype, source.dtype
    ctx.save_for_backward(index)


def _index_add_backward(ctx: Any, grad: Tensor) -> tuple:
    (index,) = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_self = torch.ops.carbon.round_to(grad, ctx.self_dtype, 1) if need[0] else None
    grad_source = None
    if need[3]:
        grad_source = torch.ops.carbon.round_to(grad.index_select(ctx.dim, index.reshape(-1)), ctx.source_dtype, 1)
    return grad_self, None, None, grad_source


def _setup_scatter_add(ctx: Any, inputs: tuple, output: Tensor) -> None:
    self, dim, index, src = inputs
    ctx.dim, ctx.self_dtype, ctx.src_dtype, ctx.src_shape = dim, self.dtype, src.dtype, tuple(src.shape)
    ctx.save_for_backward(index)


def _scatter_add_backward(ctx: Any, grad: Tensor) -> tuple:
    (index,) = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_self = torch.ops.carbon.round_to(grad, ctx.self_dtype, 1) if need[0] else None
    grad_src = None
    if need[3]:
        grad_src = grad.new_zeros(ctx.src_shape, dtype=ctx.src_dtype)
        if index.numel() > 0:
            region = grad_src
            for d in range(index.dim()):
                region = region.narrow(d, 0, index.shape[d])
            region.copy_(torch.ops.carbon.round_to(grad.gather(ctx.dim, index), ctx.src_dtype, 1))
    return grad_self, None, None, grad_src


def _setup_embedding(ctx: Any, inputs: tuple, output: Tensor) -> None:
    weight, indices, padding_idx = inputs
    ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx
    ctx.save_for_backward(indices)


def _embedding_backward(ctx: Any, grad: Tensor) -> tuple:
    (indices,) = ctx.saved_tensors
    grad_weight = torch.ops.carbon.embedding_backward(grad, indices, ctx.num_weights, ctx.padding_idx)
    return grad_weight, None, None


torch.library.register_autograd("carbon::index_add", _index_add_backward, setup_context=_setup_index_add)
torch.library.register_autograd("carbon::scatter_add", _scatter_add_backward, setup_context=_setup_scatter_add)
torch.library.register_autograd("carbon::embedding", _embedding_backward, setup_context=_setup_embedding)
# Dropout (docs/contract.md §10): dx_i = keep_i ? RN(g_i / (1 - p)) : +0 with
# the keep-mask regenerated from the saved (seed, offset) -- the same op applied
# to the gradient, so no mask is stored (and dropout's backward is again
# differentiable the same way). The .state form saves the draw's state tensor
# (a copy the generator never advances: Generator.next_state).


def _setup_dropout(ctx: Any, inputs: tuple, output: Tensor) -> None:
    _, ctx.p, ctx.seed, ctx.offset = inputs


def _dropout_backward(ctx: Any, grad: Tensor) -> tuple:
    return torch.ops.carbon.dropout(grad, ctx.p, ctx.seed, ctx.offset), None, None, None


def _setup_dropout_state(ctx: Any, inputs: tuple, output: Tensor) -> None:
    _, ctx.p, state = inputs
    ctx.save_for_backward(state)


def _dropout_state_backward(ctx: Any, grad: Tensor) -> tuple:
    (state,) = ctx.saved_tensors
    return torch.ops.carbon.dropout.state(grad, ctx.p, state), None, None


torch.library.register_autograd("carbon::dropout", _dropout_backward, setup_context=_setup_dropout)
torch.library.register_autograd("carbon::dropout.state", _dropout_state_backward, setup_context=_setup_dropout_state)
