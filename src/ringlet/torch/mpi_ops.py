"""Horovod's op surface (``horovod.torch.mpi_ops``) on ringlet's name-matched coordinator.

Every ``*_async`` call validates its arguments locally (``ValueError`` at the call), names the op
``<kind>.<name>`` or ``<kind>.noname.<handle>``, hands it to the coordinator and returns an int
handle; ``synchronize(handle)`` returns the result or raises ``HorovodInternalError`` (cross-rank
mismatch, dead peer, shutdown). Ops run once every member of the process set submitted the name,
in whatever order the ranks submitted. These functions are not differentiable; the package's
top-level ``allreduce``/``allgather``/... are the autograd-aware versions.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import torch

from ringlet.engine import args
from ringlet.types import ReduceOp

from . import requests as rq
from .context import context, control as _control, submit as _submit
from .errors import HorovodInternalError
from .process_sets import ProcessSet, _resolve, global_process_set
from .requests import Meta, Request

Average, Sum, Adasum, Min, Max, Product = (int(ReduceOp.AVG), int(ReduceOp.SUM), int(ReduceOp.ADASUM),
                                           int(ReduceOp.MIN), int(ReduceOp.MAX), int(ReduceOp.PRODUCT))

_REDUCE_DTYPES = (torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MOVE_DTYPES = _REDUCE_DTYPES + (torch.uint8, torch.int8, torch.int16)


# ---- local validation --------------------------------------------------------------------------------
def _check_tensor(t, allowed: Sequence[torch.dtype]) -> None:
    args.check_tensor(t, allowed, sparse_hint="use sparse_allreduce_async or densify")


def _member(process_set) -> tuple[int, object]:
    ps_id, g = _resolve(process_set)
    rank = context().rt.rank
    if rank not in g:
        raise ValueError(f"Rank {rank} is not a member of process set {ps_id} (ranks {list(g.ranks)}); "
                         "only members may submit its operations.")
    return ps_id, g


def _reduce_op(average, op, *, default: int = Average) -> int:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average; please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed.", DeprecationWarning,
                      stacklevel=3)
        op = Average if average else Sum
    if op is None:
        op = default
    op = int(ReduceOp.parse(op))
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by ringlet; use Average or Sum.")
    return op


def _scale(x, what: str) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {x!r}.") from None


_MAX_NAME_BYTES = 60000  # an op's name travels with a 16-bit length, suffixes included


def _check_name(kind: str, name) -> None:
    """``ValueError`` (before a handle is taken) for a name that is not UTF-8 text of at most 60000 bytes."""
    if name is None:
        return
    try:
        size = len(f"{kind}.{name}".encode())
    except UnicodeEncodeError as exc:
        raise ValueError(f"Op names must be valid Unicode text; {name!r} is not ({exc.reason}).") from None
    if size > _MAX_NAME_BYTES:
        raise ValueError(f"Op name of {size} bytes is too long (at most {_MAX_NAME_BYTES}).")


def _base_name(kind: str, name, handle: int) -> str:
    return f"{kind}.{name}" if name is not None else f"{kind}.noname.{handle}"


def _meta(name: str, kind: int, ps_id: int, t: torch.Tensor | None, **kw) -> Meta:
    return Meta.of(name, kind, t, ps_id=ps_id, **kw)


# ---- allreduce -------------------------------------------------------------------------------------
def _allreduce_reqs(tensors, base: str, handle: int, op: int, pre: float, post: float, ps_id: int,
                    inplace: bool, grouped: bool) -> list[Request]:
    n = len(tensors)
    out = []
    for i, t in enumerate(tensors):
        name = f"{base}_{i}of{n}" if grouped else base
        meta = _meta(name, rq.ALLREDUCE, ps_id, t, op=op, pre=pre, post=post)
        output = t if inplace else torch.empty_like(t, memory_format=torch.contiguous_format)
        out.append(Request(meta, t, output, handle, i))
    return out


def _allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set, *,
                     inplace: bool, grouped: bool) -> int:
    op = _reduce_op(average, op)
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    ps_id, _ = _member(process_set)
    _check_name("allreduce", name)
    if grouped:
        tensors = list(tensors)
    for t in tensors:
        _check_tensor(t, _REDUCE_DTYPES)
    ctx = context()
    h = ctx.handles.allocate(len(tensors), list if grouped else None)
    reqs = _allreduce_reqs(tensors, _base_name("allreduce", name, h), h, op, pre, post, ps_id, inplace, grouped)
    return _submit(reqs, h)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start ``postscale * op(prescale * tensor over the process set)``; returns a handle.

    ``op``: Average (default; Sum divided by the set size), Sum, Min, Max, Product. Integer tensors
    are scaled in float64 and truncated toward zero. ``tensor`` must not change until synchronize.
    """
    return _allreduce_async([tensor], average, name, op, prescale_factor, postscale_factor, process_set,
                            inplace=False, grouped=False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`allreduce_async`: ``tensor`` receives the result."""
    return _allreduce_async([tensor], average, name, op, prescale_factor, postscale_factor, process_set,
                            inplace=True, grouped=False)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Blocking :func:`allreduce_async`; ``compression`` (``Compression.fp16``, ...) wraps the transfer."""
    if compression is not None:
        wire, cctx = compression.compress(tensor)
        out = synchronize(allreduce_async(wire, average, name, op, prescale_factor, postscale_factor, process_set))
        return compression.decompress(out, cctx)
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Blocking in-place all-reduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """All-reduce a list of tensors as one handle (members named ``<base>_<i>of<N>``, fused when ready)."""
    return _allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                            inplace=False, grouped=True)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set: ProcessSet = global_process_set) -> int:
    return _allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                            inplace=True, grouped=True)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set: ProcessSet = global_process_set) -> list:
    """Blocking :func:`grouped_allreduce_async`: list in, list out."""
    if compression is not None:
        pairs = [compression.compress(t) for t in tensors]
        outs = synchronize(grouped_allreduce_async([p[0] for p in pairs], average, name, op, prescale_factor,
                                                   postscale_factor, process_set))
        return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set: ProcessSet = global_process_set) -> list:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set: ProcessSet = global_process_set):
    """All-reduce a sparse COO tensor by all-gathering its indices and values; returns a callable that
    waits and yields the (uncoalesced) sparse sum, divided by the set size for Average."""
    op = _reduce_op(None, op)
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports Average and Sum only.")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    idx = t.indices().transpose(0, 1).contiguous()
    vals = t.values().contiguous()
    h_idx = allgather_async(idx, name=f"{name}.indices", process_set=process_set)
    h_val = allgather_async(vals, name=f"{name}.values", process_set=process_set)
    _, g = _member(process_set)
    shape = tensor.shape

    def result():
        values = synchronize(h_val)
        indices = synchronize(h_idx)
        if op == Average:
            values = values / g.size
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, shape)

    return result


# ---- allgather ---------------------------------------------------------------------------------------
def _allgather_async(tensors, name, process_set, grouped: bool) -> int:
    ps_id, _ = _member(process_set)
    _check_name("allgather", name)
    tensors = list(tensors)
    for t in tensors:
        _check_tensor(t, _MOVE_DTYPES)
    ctx = context()
    h = ctx.handles.allocate(len(tensors), list if grouped else None)
    base = _base_name("allgather", name, h)
    n = len(tensors)
    reqs = [Request(_meta(f"{base}_{i}of{n}" if grouped else base, rq.ALLGATHER, ps_id, t), t, None, h, i)
            for i, t in enumerate(tensors)]
    return _submit(reqs, h)


def allgather_async(tensor, name=None, process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every member's tensor along dim 0 (dim 0 may differ between ranks)."""
    return _allgather_async([tensor], name, process_set, False)


def allgather(tensor, name=None, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Blocking :func:`allgather_async`."""
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set: ProcessSet = global_process_set) -> int:
    return _allgather_async(tensors, name, process_set, True)


def grouped_allgather(tensors, name=None, process_set: ProcessSet = global_process_set) -> list:
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast ---------------------------------------------------------------------------------------
def _broadcast_async(tensor, root_rank, name, process_set, inplace: bool) -> int:
    ps_id, g = _member(process_set)
    _check_tensor(tensor, _MOVE_DTYPES)
    _check_name("broadcast", name)
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or root_rank not in g:
        raise ValueError(f"Invalid root rank {root_rank!r}: it must be a global rank in the process set "
                         f"(ranks {list(g.ranks)}).")
    ctx = context()
    h = ctx.handles.allocate(1)
    out = tensor if inplace else torch.empty_like(tensor, memory_format=torch.contiguous_format)
    meta = _meta(_base_name("broadcast", name, h), rq.BROADCAST, ps_id, tensor, root=root_rank)
    return _submit([Request(meta, tensor, out, h, 0)], h)


def broadcast_async(tensor, root_rank, name=None, process_set: ProcessSet = global_process_set) -> int:
    """Start copying ``root_rank``'s tensor (a global rank) to every member; returns a handle."""
    return _broadcast_async(tensor, root_rank, name, process_set, False)


def broadcast_async_(tensor, root_rank, name=None, process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`broadcast_async`."""
    return _broadcast_async(tensor, root_rank, name, process_set, True)


def broadcast(tensor, root_rank, name=None, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ----------------------------------------------------------------------------------------
def alltoall_async(tensor, splits=None, name=None, process_set: ProcessSet = global_process_set) -> int:
    """Start sending ``splits[i]`` rows (dim 0) to the i-th member. ``synchronize`` returns
    ``(output, received_splits)``; without ``splits`` dim 0 is divided evenly."""
    ps_id, g = _member(process_set)
    _check_tensor(tensor, _MOVE_DTYPES)
    sp = args.alltoall_splits(splits, tensor, g.size)
    _check_name("alltoall", name)
    ctx = context()
    h = ctx.handles.allocate(1)
    meta = _meta(_base_name("alltoall", name, h), rq.ALLTOALL, ps_id, tensor, splits=tuple(sp))
    return _submit([Request(meta, tensor, None, h, 0)], h)


def alltoall(tensor, splits=None, name=None, process_set: ProcessSet = global_process_set):
    """Blocking :func:`alltoall_async`: ``(output, received_splits)`` when ``splits`` is given, else the output."""
    out, recv = synchronize(alltoall_async(tensor, splits, name, process_set))
    return (out, recv) if splits is not None else out


# ---- reducescatter -----------------------------------------------------------------------------------
def _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor, grouped) -> int:
    op = _reduce_op(None, op)
    if op not in (Average, Sum):
        raise HorovodInternalError(f"reducescatter supports Sum and Average only, not {ReduceOp(op).name}.")
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    ps_id, _ = _member(process_set)
    _check_name("reducescatter", name)
    tensors = list(tensors)
    for t in tensors:
        _check_tensor(t, _REDUCE_DTYPES)
        if t.dim() == 0:
            raise ValueError("reducescatter needs a tensor with at least one dimension (got a scalar).")
    ctx = context()
    h = ctx.handles.allocate(len(tensors), list if grouped else None)
    base = _base_name("reducescatter", name, h)
    n = len(tensors)
    reqs = [Request(_meta(f"{base}_{i}of{n}" if grouped else base, rq.REDUCESCATTER, ps_id, t, op=op, pre=pre,
                          post=post), t, None, h, i) for i, t in enumerate(tensors)]
    return _submit(reqs, h)


def reducescatter_async(tensor, name=None, op=Average, process_set: ProcessSet = global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start reducing over the set and keep this rank's rows of dim 0 (the first ``dim0 % size`` ranks
    get one extra row). Sum and Average only."""
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor, postscale_factor, False)


def reducescatter(tensor, name=None, compression=None, op=Average, process_set: ProcessSet = global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    if compression is not None:
        wire, cctx = compression.compress(tensor)
        out = synchronize(reducescatter_async(wire, name, op, process_set, prescale_factor, postscale_factor))
        return compression.decompress(out, cctx)
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set: ProcessSet = global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    return _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor, True)


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set: ProcessSet = global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> list:
    if compression is not None:
        pairs = [compression.compress(t) for t in tensors]
        outs = synchronize(grouped_reducescatter_async([p[0] for p in pairs], name, op, process_set,
                                                       prescale_factor, postscale_factor))
        return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor))


# ---- handles, join, barrier --------------------------------------------------------------------------
def poll(handle: int) -> bool:
    """True when the op behind ``handle`` has finished (never blocks); ValueError for an unknown handle."""
    return context().handles.poll(handle)


def synchronize(handle: int):
    """Wait for ``handle`` and return its result; raise ``HorovodInternalError`` when the op failed."""
    return context().handles.wait(handle)


def join(device: int = -1) -> int:
    """Announce that this rank has no more data; until every rank joined, take part in the others'
    all-reduces with zeros (Average still divides by the full set size). Returns the last rank to join.
    Other collectives fail while a rank has joined (``HorovodInternalError`` on the ranks that submitted
    them).

    The gradient reductions of a ``DistributedOptimizer`` that go as ordered, fused all-reduces
    (:mod:`ringlet.torch.ordered_grads`, world optimizers) are served too: the joined rank takes part
    in the others' steps with zero gradients until every rank has joined.

    A joined rank submits none of the ops the others run meanwhile, so its handle counter (which numbers
    ``noname`` ops) falls behind theirs. Every rank announces its counter with the join and, once all
    have joined, moves it to the largest one: after ``join()`` returns everywhere, unnamed ops match
    again, and the ranks are ordinary members.
    """
    ctx = context()
    h = ctx.handles.allocate(1)
    meta = Meta("join", rq.JOIN, 0, splits=(ctx.handles.peek(),))
    h = _submit([Request(meta, None, None, h, 0)], h)
    ctx.serve_join(h)  # the others' fused gradient reductions, with zeros, until all have joined
    last, counter = synchronize(h)
    ctx.handles.advance_to(counter)
    return int(last)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every member of ``process_set`` has called barrier. Ops submitted before the barrier
    are not waited for: the barrier matches by name like any op, so it cannot deadlock on them."""
    ps_id, _ = _member(process_set)
    _control("barrier", [], name=f"barrier.{ps_id}", ps_id=ps_id)


__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce_async", "allreduce_async_", "allreduce", "allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "sparse_allreduce_async",
    "allgather_async", "allgather", "grouped_allgather_async", "grouped_allgather",
    "broadcast_async", "broadcast_async_", "broadcast", "broadcast_",
    "alltoall_async", "alltoall", "reducescatter_async", "reducescatter", "grouped_reducescatter_async",
    "grouped_reducescatter", "poll", "synchronize", "join", "barrier",
]
