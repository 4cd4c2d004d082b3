"""``SyncBatchNorm``: batch normalisation whose training statistics cover the batches of every rank.

In training mode the per-channel mean and variance are those of the concatenation of all ranks' inputs
(ranks may hold different batch sizes), so the output equals ``BatchNorm`` applied to the global batch.
Statistics are combined exactly: each rank contributes (count, mean, sum of squared deviations) and the
merge adds the between-rank term, rather than the cancellation-prone sum of squares. The backward pass
all-reduces the two per-channel sums the input gradient depends on; weight and bias gradients stay
local (a ``DistributedOptimizer`` reduces them like any other parameter gradient).
In eval mode (running statistics) nothing is communicated.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import mpi_ops
from .process_sets import global_process_set


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    # Half-precision statistics lose too much: compute them in float32.
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cfg):
        running_mean, running_var, eps, momentum, ps = cfg
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        work = x.to(_work_dtype(x))
        n_local = x.numel() // c if c else 0
        if n_local > 0:
            var_l, mean_l = torch.var_mean(work, dim=dims, correction=0)
            m2_l = var_l * n_local
        else:
            mean_l = m2_l = torch.zeros(c, dtype=work.dtype)
        row = torch.cat([torch.tensor([float(n_local)], dtype=torch.float64), mean_l.double(), m2_l.double()])
        stats = mpi_ops.allgather(row.unsqueeze(0), process_set=ps)
        counts, means, m2s = stats[:, :1], stats[:, 1:1 + c], stats[:, 1 + c:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{list(x.shape)} and {int(total)} values per channel over all ranks.")
        mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - mean) ** 2).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_((mean * momentum).to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_((m2 / (total - 1) * momentum).to(running_var.dtype))
        xhat = (work - mean.to(work.dtype).view(shape)) * invstd.to(work.dtype).view(shape)
        y = xhat
        if weight is not None:
            y = xhat * weight.to(work.dtype).view(shape) + bias.to(work.dtype).view(shape)
        ctx.save_for_backward(xhat, weight, invstd.to(work.dtype))
        ctx.meta = (total, dims, shape, ps, x.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        xhat, weight, invstd = ctx.saved_tensors
        total, dims, shape, ps, in_dtype = ctx.meta
        c = shape[1]
        g = gy.to(xhat.dtype)
        sum_dy = g.sum(dims)
        sum_dy_xhat = (g * xhat).sum(dims)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            both = mpi_ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=mpi_ops.Sum, process_set=ps)
            mean_dy, mean_dy_xhat = both[:c] / total, both[c:] / total
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            gx = ((g - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape)) * scale.view(shape)).to(in_dtype)
        if weight is not None:
            if ctx.needs_input_grad[1]:
                gw = sum_dy_xhat.to(weight.dtype)
            if ctx.needs_input_grad[2]:
                gb = sum_dy.to(weight.dtype)
        return gx, gw, gb, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the union of all ranks' batches (drop-in for ``torch.nn.BatchNorm1d/2d/3d``
    on input of shape ``(N, C, ...)``).

    Training mode: normalises with the mean and biased variance of the inputs of every member of
    ``process_set``, and updates the running statistics with the unbiased variance, exactly as
    ``BatchNorm`` would on the concatenated batch. Every member must call forward and backward.
    Eval mode, or ``track_running_stats`` with no training: plain batch norm with running statistics.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or self.running_mean is None
        keep_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep_running else None
        running_var = self.running_var if keep_running else None
        if not batch_stats or self.process_set.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, batch_stats, factor,
                                self.eps)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      (running_mean, running_var, self.eps, factor, self.process_set))


__all__ = ["SyncBatchNorm"]
