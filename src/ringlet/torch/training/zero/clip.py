"""Gradient clipping by the norm of the whole model's averaged gradient when every rank holds a shard of it.

Each rank reduces its float32 gradient shards to one partial value (the sum of ``|g|^p``, or the maximum
for the infinity norm), one all-reduce over the data-parallel group combines them, and every rank scales
its shards by the same factor: the result is that of ``torch.nn.utils.clip_grad_norm_`` over the full
averaged gradient, up to the order of summation. Where shards are replicated (a hierarchical reducer:
``world`` ranks hold ``shard_size`` distinct shards), the sum counts every shard ``world / shard_size``
times and is divided accordingly.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ringlet.types import ReduceOp

__all__ = ["clip_shards_"]


@torch.no_grad()
def clip_shards_(shards: Sequence[torch.Tensor], max_norm: float, norm_type: float, comm, replicas: int,
                 name: str) -> torch.Tensor:
    """Scale ``shards`` in place so that the group's gradient norm is at most ``max_norm``; return that
    norm (before clipping) as a float32 0-dim tensor, the same on every rank. ``ValueError`` for a
    ``norm_type`` that is not positive."""
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"norm_type must be positive (or inf), got {norm_type}")
    inf = norm_type == float("inf")
    parts = [s.abs().max() if inf else s.abs().pow(norm_type).sum() for s in shards if s.numel()]
    local = torch.stack(parts).max() if inf and parts else torch.stack(parts).sum() if parts else torch.zeros(())
    flag = local.reshape(1).to(torch.float64)
    if comm.size > 1:
        comm.allreduce_(flag, ReduceOp.MAX if inf else ReduceOp.SUM, name).wait()
    total = flag[0] if inf else (flag[0] / replicas) ** (1.0 / norm_type)
    total = total.to(torch.float32)
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for s in shards:
            s.mul_(coef)
    return total
