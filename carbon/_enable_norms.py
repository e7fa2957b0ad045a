"""carbon.enable's whole-function routes for batch, group and instance norm
(docs/enable.md, "Routed functions").

Each normalizes rows of a reshaped input with carbon.layer_norm (no affine
parameters): per row, mean and variance from exact sums, each rounded once,
then xhat = RN32((x - mean) * rstd) (contract §7). torch's own kernels differ
by device (CPU, cuDNN, CUDA) and by batch layout; these definitions do not.
The per-channel affine step is then two rounded operations, RN(RN(xhat * w) + b)
(for bfloat16 / float16 inputs xhat and both steps are float32, rounded once to
the input's dtype at the end, as torch's opmath),
and the gradients are autograd's through carbon.layer_norm (exact sums) and
those two operations (whose parameter gradients are carbon.sum's exact sums of
the rounded products g * xhat and of g).

Each function returns None for arguments it does not cover; the caller then
runs torch's function (whose aten ops carbon.enable checks one by one).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

import carbon

__all__ = ["batch_norm", "group_norm", "instance_norm"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _per_channel(t: Tensor, ndim: int) -> Tensor:
    """A [C] tensor shaped [1, C, 1, ...] to broadcast over an input of ndim dims."""
    return t.reshape([1, -1] + [1] * (ndim - 2))


def _affine(y: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """RN(RN(y * w) + b) per channel, then the input's dtype. For 16-bit inputs y is float32 (from
    _rows_normalized) and so are the two steps, with one rounding to 16 bits at the end, as torch's opmath."""
    wide = y.dtype == torch.float32 and dtype in (torch.bfloat16, torch.float16)
    if weight is not None:
        y = y * _per_channel(weight.float() if wide else weight, y.dim())
    if bias is not None:
        y = y + _per_channel(bias.float() if wide else bias, y.dim())
    return y.to(dtype)


def _rows_normalized(rows: Tensor, eps: float) -> Tensor:
    """carbon.layer_norm of each row; 16-bit rows are widened first (exactly), so the statistics are the same
    and x̂ = RN32((x − mean)·rstd) stays in float32 until the affine step's final rounding."""
    return carbon.layer_norm(rows.float() if rows.dtype != torch.float32 else rows, [rows.shape[1]], None, None, eps)


def _update_running(running: Tensor, batch_stat: Tensor, momentum: float) -> None:
    """running = RN(RN(m * stat) + RN((1 - m) * running)), m and 1 - m as float32 scalars."""
    with torch.no_grad():
        running.copy_(batch_stat.to(running.dtype) * momentum + running * (1.0 - momentum))


def batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, training: bool = False,
               momentum: Optional[float] = 0.1, eps: float = 1e-5) -> Optional[Tensor]:
    """``F.batch_norm``. Training (or no running statistics): each channel's values over the batch and
    every position form one row of carbon.layer_norm; the running statistics become
    RN(RN(m * stat) + RN((1 - m) * running)) with the exact batch mean and the exact unbiased variance
    (var_mean_rows, correction 1). Evaluation: RN(RN(RN(x - running_mean) * rstd) * w) + b) with
    rstd = RN(1 / RN(sqrt(RN(running_var + eps)))) per channel."""
    if input.dtype not in _DTYPES or input.dim() < 2 or momentum is None or not eps >= 0:
        return None
    c = input.shape[1]
    if training or running_mean is None or running_var is None:
        rows = input.movedim(1, 0).reshape(c, -1)
        if rows.shape[1] <= 1 and training:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(input.shape)}")
        y = _rows_normalized(rows, eps).reshape([c, input.shape[0]] + list(input.shape[2:])).movedim(0, 1)
        if training and running_mean is not None and running_var is not None:
            var, mean = torch.ops.carbon.var_mean_rows(rows.detach(), 1)
            _update_running(running_mean, mean, momentum)
            _update_running(running_var, var, momentum)
    else:
        # 16-bit inputs and statistics (model.to(torch.bfloat16)) are widened: every step in float32
        x_, mean_, var_ = (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
                           for t in (input, running_mean, running_var))
        rstd = torch.rsqrt(var_ + eps)
        y = (x_ - _per_channel(mean_, input.dim())) * _per_channel(rstd, input.dim())
        if y.dtype != torch.float32:
            y = y.to(input.dtype)  # float64 running statistics: the input's dtype, as before
    return _affine(y, weight, bias, input.dtype)


def group_norm(input: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Optional[Tensor]:
    """``F.group_norm``: each (sample, group) is one row of carbon.layer_norm, then the affine step."""
    if input.dtype not in _DTYPES or input.dim() < 2 or input.shape[1] % num_groups != 0 or not eps >= 0:
        return None
    n = input.shape[0]
    y = _rows_normalized(input.reshape(n * num_groups, -1), eps).reshape(input.shape)
    return _affine(y, weight, bias, input.dtype)


def instance_norm(input: Tensor, running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
                  weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Optional[Tensor]:
    """``F.instance_norm`` without running statistics: each (sample, channel) is one row of
    carbon.layer_norm, then the affine step."""
    if (input.dtype not in _DTYPES or input.dim() < 3 or running_mean is not None or running_var is not None
            or not eps >= 0):
        return None
    if not use_input_stats:
        return None
    n, c = input.shape[:2]
    y = _rows_normalized(input.reshape(n * c, -1), eps).reshape(input.shape)
    return _affine(y, weight, bias, input.dtype)
