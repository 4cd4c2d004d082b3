"""Differentiable collectives of ``ringlet.torch`` (they override the raw ones of :mod:`.mpi_ops`).

Forward passes call the non-differentiable ops of :mod:`.mpi_ops` by their public names; backward
passes are collectives too, so every member of the process set must run the backward pass (the
gradient ops carry no name: the per-process ``noname`` counter matches them across ranks, which holds
because every rank differentiates the same graph).

Gradient rules (Horovod's):

- ``allreduce``: the gradient is all-reduced with the same op and scale factors.
- ``allgather``: the gradient is averaged over the set, then this rank's rows are taken.
- ``broadcast``: the gradient is averaged over the set on the root; non-root inputs get zero.
- ``alltoall``: the gradient goes back with an alltoall using the splits this rank received.
- ``reducescatter``: the gradient pieces are all-gathered, multiplied by the set size for ``Sum``.
"""
from __future__ import annotations

import torch

from . import mpi_ops
from .basics import rank as _global_rank
from .compression import Compression
from .process_sets import global_process_set


def _resolve_op(average, op):
    """The op a call means (``average`` is Horovod's deprecated spelling); argument errors are left
    to :mod:`.mpi_ops`, which sees the original arguments first."""
    if op is not None:
        return op
    if average is None or average:
        return mpi_ops.Average
    return mpi_ops.Sum


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.detach().contiguous()


def _detached(tensors) -> list:
    # The ops run on the coordinator's thread, where grad mode is on: hand them plain tensors.
    return [t.detach() for t in tensors]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        out = mpi_ops.allreduce(tensor.detach(), average=average, name=name, op=op, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
        ctx.op = _resolve_op(average, op)
        ctx.factors = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return out

    @staticmethod
    def backward(ctx, grad):
        pre, post = ctx.factors
        g = mpi_ops.allreduce(_dense(grad), op=ctx.op, prescale_factor=pre, postscale_factor=post,
                              process_set=ctx.process_set)
        return g, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Differentiable all-reduce: ``postscale * reduce_op(prescale * tensor)`` over ``process_set``,
    returned as a new tensor (``Average`` divides the sum by the set size). ``compression`` is applied
    around the collective. The gradient is the all-reduce of the output gradient with the same op and
    factors."""
    wire, cctx = compression.compress(tensor)
    out = _Allreduce.apply(wire, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, *tensors):
        average, name, op, pre, post, ps = cfg
        outs = mpi_ops.grouped_allreduce(_detached(tensors), average=average, name=name, op=op,
                                         prescale_factor=pre, postscale_factor=post, process_set=ps)
        ctx.cfg = (_resolve_op(average, op), pre, post, ps)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.cfg
        gs = mpi_ops.grouped_allreduce([_dense(g) for g in grads], op=op, prescale_factor=pre,
                                       postscale_factor=post, process_set=ps)
        return (None, *gs)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Differentiable all-reduce of a list of tensors as one group (one name, fused when possible);
    returns a list. Gradients as :func:`allreduce`, as one grouped all-reduce."""
    if not tensors:
        return []
    wires, ctxs = zip(*(compression.compress(t) for t in tensors))
    outs = _GroupedAllreduce.apply((average, name, op, prescale_factor, postscale_factor, process_set), *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def _member_rows(ps, shapes) -> torch.Tensor:
    """First dimensions of every member's inputs, shape (set size, number of tensors); a 0-d input
    counts as one row, as the all-gather treats it."""
    local = [int(s[0]) if len(s) > 0 else 1 for s in shapes]
    return mpi_ops.allgather(torch.tensor([local], dtype=torch.int64), process_set=ps)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.shape = tensor.shape
        ctx.process_set = process_set
        return mpi_ops.allgather(tensor.detach(), name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.process_set
        g = mpi_ops.allreduce(_dense(grad), op=mpi_ops.Average, process_set=ps)
        dims = _member_rows(ps, [ctx.shape])[:, 0]
        offset = int(dims[:ps.rank()].sum())
        return g.narrow(0, offset, int(dims[ps.rank()])).reshape(ctx.shape), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Differentiable all-gather: the members' tensors concatenated on dim 0 in rank order (dim 0 may
    differ between ranks). The gradient is the averaged all-reduce of the output gradient, sliced to
    this rank's rows."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, *tensors):
        name, ps = cfg
        ctx.shapes = [t.shape for t in tensors]
        ctx.process_set = ps
        return tuple(mpi_ops.grouped_allgather(_detached(tensors), name=name, process_set=ps))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        gs = mpi_ops.grouped_allreduce([_dense(g) for g in grads], op=mpi_ops.Average, process_set=ps)
        dims = _member_rows(ps, ctx.shapes)
        me = ps.rank()
        offsets = dims[:me].sum(dim=0)
        out = [g.narrow(0, int(offsets[i]), int(dims[me, i])).reshape(s)
               for i, (g, s) in enumerate(zip(gs, ctx.shapes))]
        return (None, *out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Differentiable all-gather of a list of tensors as one group; returns a list."""
    if not tensors:
        return []
    return list(_GroupedAllgather.apply((name, process_set), *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return mpi_ops.broadcast(tensor.detach(), root_rank, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):
        g = mpi_ops.allreduce(_dense(grad), op=mpi_ops.Average, process_set=ctx.process_set)
        if _global_rank() != ctx.root_rank:
            g = torch.zeros_like(g)
        return g, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Differentiable broadcast from global rank ``root_rank`` to the members of ``process_set``; returns
    a new tensor. The gradient is the averaged all-reduce of the output gradient on the root and zero
    elsewhere (non-root inputs do not influence the output)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        res = mpi_ops.alltoall(tensor.detach(), splits=splits, name=name, process_set=process_set)
        if isinstance(res, tuple):
            out, received = res
        else:  # only reached if mpi_ops accepted splits=None for this input: its parts are equal
            out, n = res, process_set.size()
            received = torch.full((n,), out.shape[0] // n, dtype=torch.int32)
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _grad_splits):
        g, _ = mpi_ops.alltoall(_dense(grad), splits=ctx.received, process_set=ctx.process_set)
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Differentiable all-to-all: rows ``splits[i]`` of ``tensor`` go to the i-th member (``None``: equal
    parts). Returns ``(output, received_splits)`` when ``splits`` is given, else ``output``. The gradient
    travels back by an all-to-all with the received splits."""
    n = process_set.size()
    call_splits = splits
    if splits is None and tensor.dim() > 0 and tensor.shape[0] % n == 0:
        # Explicit equal splits give us the received splits the backward pass needs; indivisible
        # input is passed on as is so that mpi_ops reports the error in its own words.
        call_splits = torch.full((n,), tensor.shape[0] // n, dtype=torch.int32)
    out, received = _Alltoall.apply(tensor, call_splits, name, process_set)
    return (out, received) if splits is not None else out


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.process_set = process_set
        return mpi_ops.reducescatter(tensor.detach(), name=name, op=op, process_set=process_set,
                                     prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    @staticmethod
    def backward(ctx, grad):
        g = mpi_ops.allgather(_dense(grad), process_set=ctx.process_set)
        if ctx.op == mpi_ops.Sum:
            g = g * ctx.process_set.size()
        return g, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=mpi_ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Differentiable reduce-scatter: the reduction (``Sum`` or ``Average``) of the members' tensors,
    split on dim 0 with the first ``dim0 % size`` members getting one extra row; returns this rank's
    part. The gradient is the all-gather of the parts' gradients, times the set size for ``Sum``."""
    wire, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(wire, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, *tensors):
        name, op, ps, pre, post = cfg
        ctx.op = op
        ctx.process_set = ps
        return tuple(mpi_ops.grouped_reducescatter(_detached(tensors), name=name, op=op, process_set=ps,
                                                   prescale_factor=pre, postscale_factor=post))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        gs = mpi_ops.grouped_allgather([_dense(g) for g in grads], process_set=ps)
        if ctx.op == mpi_ops.Sum:
            gs = [g * ps.size() for g in gs]
        return (None, *gs)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=mpi_ops.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Differentiable reduce-scatter of a list of tensors as one group; returns a list."""
    if not tensors:
        return []
    wires, ctxs = zip(*(compression.compress(t) for t in tensors))
    outs = _GroupedReducescatter.apply((name, op, process_set, prescale_factor, postscale_factor), *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
           "reducescatter", "grouped_reducescatter"]
