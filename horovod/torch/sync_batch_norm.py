"""Batch normalization whose statistics cover the whole global batch, on CPU and GPU alike.

In training, every rank contributes (count, mean, biased variance) per channel; one allgather
gives every rank the same global mean and variance, combined with the parallel-variance
formula (numerically stable, unlike a sum of squares). Backward needs two more per-channel
sums over the global batch, obtained with one allreduce. N ranks with SyncBatchNorm then
compute what one process would compute with BatchNorm on the N shards together.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from horovod.common import basics
from horovod.common.reduce_ops import Sum
from horovod.torch._bridge import run

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Drop-in for `torch.nn.BatchNorm1d/2d/3d` (any input of shape (N, C, ...))."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of at least 2 dimensions (N, C, ...), "
                             f"got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        batch_stats = self.training or self.running_mean is None
        if not batch_stats or not basics.is_initialized() or basics.size() == 1:
            return super().forward(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        running = (self.running_mean, self.running_var) if self.training else (None, None)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, *running, self.eps, momentum)


def _channel_view(t: torch.Tensor, dims: int) -> torch.Tensor:
    return t.view([1, -1] + [1] * (dims - 2))


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float) -> torch.Tensor:
        stat_dtype = torch.promote_types(x.dtype, torch.float32)
        xs = x.to(stat_dtype).contiguous()
        channels = xs.shape[1]
        reduce_dims = [0] + list(range(2, xs.dim()))
        count = xs.numel() // channels
        if count:
            local = torch.cat([xs.new_tensor([count]), xs.mean(reduce_dims), xs.var(reduce_dims, unbiased=False)])
        else:
            local = xs.new_zeros(2 * channels + 1)
        stats = run("allgather", [local.unsqueeze(0)], name="sync_batch_norm.stats")
        counts, means, variances = stats[:, :1], stats[:, 1:channels + 1], stats[:, channels + 1:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"SyncBatchNorm needs more than one value per channel in training, got {total:.0f} "
                             "over all ranks")
        mean = (counts * means).sum(0) / total
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (total / (total - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        xhat = (xs - _channel_view(mean, xs.dim())) * _channel_view(invstd, xs.dim())
        y = xhat if weight is None else xhat * _channel_view(weight.to(stat_dtype), xs.dim())
        if bias is not None:
            y = y + _channel_view(bias.to(stat_dtype), xs.dim())
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total = total
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        xhat, weight, invstd = ctx.saved_tensors
        dims = xhat.dim()
        reduce_dims = [0] + list(range(2, dims))
        dys = dy.to(xhat.dtype)
        sum_dy = dys.sum(reduce_dims)
        sum_dy_xhat = (dys * xhat).sum(reduce_dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(weight.dtype if weight is not None else dy.dtype) if ctx.has_bias else None
        sums = torch.cat([sum_dy, sum_dy_xhat]).contiguous()
        sums = run("allreduce", [sums], inplace=True, name="sync_batch_norm.grads", op=Sum)
        channels = sum_dy.numel()
        mean_dy = _channel_view(sums[:channels] / ctx.total, dims)
        mean_dy_xhat = _channel_view(sums[channels:] / ctx.total, dims)
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        grad_x = (dys - mean_dy - xhat * mean_dy_xhat) * _channel_view(scale, dims)
        return grad_x.to(dy.dtype), grad_weight, grad_bias, None, None, None, None
