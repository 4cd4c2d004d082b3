"""Naive semantics of every collective: the oracle the tests compare against.

Inputs are lists (one entry per rank) of tensors; outputs likewise. Integer averages truncate
toward zero; scaling of integers happens in float64, as Horovod does.
"""
from __future__ import annotations

import torch

from ..types import ReduceOp


def reduce(tensors: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc += t
        elif op == ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        elif op == ReduceOp.MAX:
            acc = torch.maximum(acc, t)
        elif op == ReduceOp.PRODUCT:
            acc *= t
        else:
            raise ValueError(op)
    return acc


def scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``factor * t``; integers in float64, truncated toward zero."""
    if factor == 1.0:
        return t
    if t.is_floating_point():
        return t * factor
    return torch.trunc(t.double() * factor).to(t.dtype)


def allreduce(tensors, op=ReduceOp.SUM, prescale=1.0, postscale=1.0):
    """``postscale * op(prescale * x_r)``; Average is Sum with ``postscale / p``."""
    red = reduce([scale(t, prescale) for t in tensors], op)
    out = scale(red, postscale / len(tensors) if op == ReduceOp.AVG else postscale)
    return [out.clone() for _ in tensors]


def broadcast(tensors, root):
    return [tensors[root].clone() for _ in tensors]


def allgather(tensors):
    """Concatenation along dim 0; a 0-d tensor counts as one row (as the collective documents)."""
    out = torch.cat([t.reshape(1) if t.dim() == 0 else t for t in tensors], dim=0)
    return [out.clone() for _ in tensors]


def reduce_scatter(tensors, op=ReduceOp.SUM):
    """Horovod semantics: dim 0 split so that the first ``dim0 % size`` ranks get one extra row."""
    p = len(tensors)
    red = allreduce(tensors, op)[0]
    rows = red.shape[0]
    sizes = [rows // p + (1 if r < rows % p else 0) for r in range(p)]
    return list(torch.split(red, sizes, dim=0))


def alltoall(tensors, splits):
    """``splits[r][d]`` rows of rank ``r``'s tensor go to rank ``d``; outputs concatenate by source."""
    p = len(tensors)
    pieces = [list(torch.split(tensors[r], list(splits[r]), dim=0)) for r in range(p)]
    return [torch.cat([pieces[s][d] for s in range(p)], dim=0) for d in range(p)]


def reduce_to_root(tensors, root, op=ReduceOp.SUM):
    red = allreduce(tensors, op)[0]
    return [red if r == root else tensors[r].clone() for r in range(len(tensors))]
