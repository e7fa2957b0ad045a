"""Carbon's attention: ``scaled_dot_product_attention`` composed of exact ops.

    s = RN32(q kᵀ)                              carbon.bmm, exact, one rounding
    z = RN32((s ⊗ scale) ⊕ mask)               attention_logits (−∞ above the diagonal if causal)
    p = carbon.softmax(z, −1)                   float32
    p = carbon.dropout(p, dropout_p)            if dropout_p > 0 (default generator)
    o = RN(p v)                                 carbon.bmm, in q's dtype

Every step is one of carbon's correctly rounded ops, so the output and all
gradients (by autograd through those ops) are the same bits on every device,
batch size and thread count. docs/contract.md §9 states the definition.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from carbon.dropout import dropout
from carbon.ops import bmm
from carbon.softmax import softmax

__all__ = ["scaled_dot_product_attention"]


def _additive_mask(mask: Tensor, shape: tuple, batch: int) -> Tensor:
    """The mask as additive float values of shape [batch, L, S]: a boolean
    mask (True = attend) becomes 0 / −∞ exactly."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, -math.inf)
    try:
        mask.expand(shape)
    except RuntimeError:
        raise ValueError(
            f"carbon.scaled_dot_product_attention: attn_mask of shape {tuple(mask.shape)} does not broadcast to {shape}"
        ) from None
    return _BroadcastMask.apply(mask, shape, batch)


class _BroadcastMask(torch.autograd.Function):
    """mask.expand(shape) viewed as [batch, L, S]. Its gradient (for a learned
    mask, e.g. T5's relative position bias) sums the logits' gradient over the
    broadcast dimensions exactly, with one rounding to the mask's dtype
    (carbon.sum), where autograd's expand would add in float32. A learned
    bfloat16/float16 mask is passed on widened to float32 (exact, so the
    logits are unchanged): autograd would otherwise round the logits' float32
    gradient to the mask's dtype before the sum, a second rounding."""

    @staticmethod
    def forward(ctx: Any, mask: Tensor, shape: tuple, batch: int) -> Tensor:
        ctx.mask_shape, ctx.dtype, ctx.full = tuple(mask.shape), mask.dtype, tuple(shape)
        if ctx.needs_input_grad[0] and mask.dtype in (torch.bfloat16, torch.float16):
            mask = mask.float()
        return mask.expand(shape).reshape(batch, shape[-2], shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: Tensor):
        full = grad.reshape(ctx.full)
        lead = len(ctx.full) - len(ctx.mask_shape)
        dims = list(range(lead)) + [lead + i for i, n in enumerate(ctx.mask_shape) if n == 1 and ctx.full[lead + i] != 1]
        if not dims:
            return full.to(ctx.dtype), None, None
        return torch.ops.carbon.sum(full, dims, False, ctx.dtype).reshape(ctx.mask_shape), None, None


class _AttentionProbs(torch.autograd.Function):
    """p = softmax(attention_logits(bmm(q, kᵀ, float32), scale, mask, causal))
    as one op on the CPU (torch.ops.carbon.attention_probs): the same bits
    as those three ops, with the scores in reused memory and, when causal,
    only the entries j <= i that attention_logits reads computed; each row's
    logits go to the softmax while in the cache. The backward is the
    composition's: ds = attention_logits's gradient of softmax's gradient
    (fused likewise, torch.ops.carbon.attention_probs_backward), then
    carbon.bmm's gradients of q kᵀ. A mask that requires grad takes the
    composition instead (its gradient is the softmax's gradient)."""

    @staticmethod
    def forward(q3: Tensor, k3: Tensor, scale: float, mask3: Optional[Tensor], causal: bool) -> Tensor:
        return torch.ops.carbon.attention_probs(q3, k3, scale, mask3, causal)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        q3, k3, scale, _, _ = inputs
        ctx.save_for_backward(q3, k3, output)
        ctx.scale = scale

    @staticmethod
    def backward(ctx, grad: Tensor):
        q3, k3, probs = ctx.saved_tensors
        ds = torch.ops.carbon.attention_probs_backward(grad, probs, ctx.scale)
        grad_q = bmm(ds, k3, out_dtype=q3.dtype) if ctx.needs_input_grad[0] else None
        grad_k = bmm(q3.transpose(1, 2), ds, out_dtype=k3.dtype).transpose(1, 2) if ctx.needs_input_grad[1] else None
        return grad_q, grad_k, None, None, None


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` with Carbon's
    contract. query [..., L, E], key [..., S, E], value [..., S, Ev] with the
    same leading dimensions; attn_mask boolean (True = attend) or additive,
    broadcastable to [..., L, S]; is_causal masks j > i (top-left aligned, as
    torch does); scale defaults to 1/sqrt(E). The scores and probabilities are
    float32 whatever the input dtype; the output has query's dtype. A fully
    masked row gives zeros (not NaN). dropout_p > 0 applies carbon.dropout
    to the probabilities (one draw of carbon.default_generator, as torch
    uses its default generator). A float attn_mask that requires grad gets
    the logits' gradient, summed exactly over its broadcast dimensions."""
    op = "carbon.scaled_dot_product_attention"
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1], got {dropout_p}")
    if enable_gqa:
        raise NotImplementedError(f"{op}: enable_gqa is not supported")
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            f"{op}: query, key and value must have the same number (>= 2) of dimensions, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    lead = tuple(query.shape[:-2])
    if tuple(key.shape[:-2]) != lead or tuple(value.shape[:-2]) != lead:
        raise ValueError(f"{op}: query, key and value must share their leading dimensions (no broadcasting), got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    L, E = query.shape[-2:]
    S, Ek = key.shape[-2:]
    if Ek != E or value.shape[-2] != S:
        raise ValueError(f"{op}: shapes do not match: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    if not (query.device == key.device == value.device):
        raise ValueError(f"{op}: expected all tensors on one device, got {query.device}, {key.device}, {value.device}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: pass either attn_mask or is_causal, not both")
    if attn_mask is not None and attn_mask.device != query.device:
        raise ValueError(f"{op}: expected all tensors on one device, but attn_mask is on {attn_mask.device} "
                         f"and query is on {query.device}")
    batch = math.prod(lead)
    q3, k3, v3 = query.reshape(batch, L, E), key.reshape(batch, S, E), value.reshape(batch, S, -1)
    mask3 = None if attn_mask is None else _additive_mask(attn_mask, lead + (L, S), batch)
    factor = 1.0 / math.sqrt(E) if scale is None else float(scale)
    if q3.device.type == "cpu" and (mask3 is None or not mask3.requires_grad):
        probs = _AttentionProbs.apply(q3, k3, factor, mask3, is_causal)
    else:
        scores = bmm(q3, k3.transpose(1, 2), out_dtype=torch.float32)
        logits = torch.ops.carbon.attention_logits(scores, factor, mask3, is_causal)
        probs = softmax(logits, -1)
    if dropout_p > 0.0:  # one draw of carbon.default_generator (docs/contract.md §10)
        probs = dropout(probs, dropout_p)
    out = bmm(probs, v3, out_dtype=query.dtype)
    return out.reshape(lead + (L, value.shape[-1]))
