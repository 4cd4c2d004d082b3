"""Public collectives: validate locally, agree on metadata across ranks, run the engine's operation.

A call reads top to bottom: the API function validates its arguments and queues a request of
:mod:`ringlet.engine.requests` (:meth:`ringlet.runtime.Runtime.submit_op`); the runtime's queue runs it
with the op's channel, and it agrees on the metadata and runs the engine's operation (an all-reduce
through the engine's one entry, :func:`ringlet.engine.allreduce.allreduce_`). docs/design.md, "The path
of one all-reduce".

Every collective has a blocking form, an ``_async`` form returning a :class:`~ringlet.runtime.Work`
handle (``wait()``, ``done()``), and where it makes sense an in-place form with a trailing ``_``.
Before data moves the members compare one :class:`~ringlet.engine.meta.Meta` record
(:func:`ringlet.engine.agree.agree`): a mismatch raises :class:`~ringlet.types.MismatchError` on every
member. Local argument errors raise ``ValueError`` at the call.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Sequence

import torch

from .engine import args, ops
from .engine.allreduce import Compressed
from .engine.meta import Kind
from .engine.requests import (AllgatherRequest, AllreduceRequest, AlltoallRequest, BarrierRequest, ReduceScatterRequest,
                              RootedRequest)
from .group import Group
from .runtime import Runtime, Work
from .tuning import select
from .types import ReduceOp, Reduction, reduction

_runtime: Runtime | None = None
_local = threading.local()  # per-thread override: in-process worlds run one rank per thread


def _set_runtime(rt: Runtime | None) -> None:
    global _runtime
    _runtime = rt


def runtime() -> Runtime:
    """The calling thread's runtime; ``ValueError`` before :func:`ringlet.init`."""
    rt = getattr(_local, "runtime", None)
    if rt is not None:
        return rt
    if _runtime is None:
        raise ValueError("ringlet has not been initialized; use ringlet.init().")
    return _runtime


@contextlib.contextmanager
def use_runtime(rt: Runtime):
    """Make ``rt`` the runtime of the calling thread only (in-process worlds: one rank per thread)."""
    prev = getattr(_local, "runtime", None)
    _local.runtime = rt
    try:
        yield rt
    finally:
        _local.runtime = prev


# ---- local validation ---------------------------------------------------------------------------
_check_tensor = args.check_tensor


def _group(rt: Runtime, group: Group | None) -> Group:
    g = rt.world if group is None else group
    if not isinstance(g, Group):
        raise ValueError(f"group must be a ringlet Group, got {type(g).__name__}.")
    if rt.rank not in g:
        raise ValueError(f"Rank {rt.rank} is not a member of group {g.id} (ranks {list(g.ranks)}); "
                         "only members may call its collectives.")
    return g


def _check_root(g: Group, root: int) -> int:
    """``root`` is a global rank (Horovod habit); returns its group rank."""
    if not isinstance(root, int) or isinstance(root, bool):
        raise ValueError(f"root_rank must be an int, got {root!r}.")
    if root not in g:
        raise ValueError(f"Invalid root rank {root}: not a member of the group (ranks {list(g.ranks)}).")
    return g.rank_of(root)


def resolve_algorithm(name: str | None, rt: Runtime) -> str:
    """``name`` as :func:`ringlet.tuning.select.requested` canonicalises it under ``rt``'s override."""
    return select.requested(name, rt.options.algorithm)


# ---- all-reduce ---------------------------------------------------------------------------------
def _check_compressed(tensor: torch.Tensor, red: Reduction, spec: Compressed) -> None:
    if red.op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(f"A compressed all-reduce sums or averages; op {red.name!r} is not supported with "
                         "compression.")
    if not tensor.is_floating_point():
        raise ValueError(f"Compression needs a floating tensor, got {tensor.dtype}.")
    if spec.state is not None and not isinstance(spec.state, dict):
        raise ValueError(f"compression_state must be a dict, got {type(spec.state).__name__}.")


def _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor, *, inplace, sync,
                      check: bool | None = None, compressed: Compressed | None = None,
                      library_frames: int = 1) -> Work:
    rt = runtime()
    check = rt.options.check if check is None else bool(check)
    _check_tensor(tensor)
    prescale_factor = args.scale_factor(prescale_factor, "prescale_factor")
    postscale_factor = args.scale_factor(postscale_factor, "postscale_factor")
    red = reduction(op)
    g = rt.world if group is None else _group(rt, group)
    algo = resolve_algorithm(algorithm, rt)
    if compressed is not None:
        _check_compressed(tensor, red, compressed)
    buf = tensor if inplace else tensor.clone()
    return rt.submit_op(AllreduceRequest(g, buf, red, algo, prescale_factor, postscale_factor, check, compressed),
                        sync=sync, library_frames=library_frames)


def _allreduce_call(tensor, op, algorithm, group, prescale_factor, postscale_factor, check, compression,
                    compression_state, *, inplace: bool, sync: bool) -> Work:
    """The body of the four public all-reduces, which differ only in ``inplace`` and ``sync``:
    ``compression`` and ``compression_state`` become a :class:`Compressed` (None when ``compression`` is
    None) and the call is submitted. A non-tensor passes shape ``()``; the argument checks reject it."""
    compressed = None if compression is None else Compressed.of(compression, compression_state,
                                                                getattr(tensor, "shape", ()))
    return _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor, inplace=inplace,
                             sync=sync, check=check, compressed=compressed, library_frames=2)


def allreduce(tensor: torch.Tensor, op=ReduceOp.SUM, algorithm: str = "auto", group: Group | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, *, check: bool | None = None,
              compression=None, compression_state: dict | None = None) -> torch.Tensor:
    """Return ``postscale * reduce_op(prescale * tensor over all ranks of group)``.

    ``op``: sum, avg (sum then divide by the group size), min, max, product. Integer tensors are
    scaled in float64 and truncated toward zero (so an integer average truncates). ``algorithm``
    names one of :func:`ringlet.algorithms.allreduce_names` or ``"auto"``; ``RINGLET_ALGORITHM``
    overrides ``"auto"``. The input is not modified.

    ``check``: compare shape, dtype, op, algorithm and scale factors across ranks before data moves
    (default: ``RINGLET_CHECK``, on). ``False`` saves that exchange when the caller already knows the
    ranks agree, e.g. a layout validated once and then reused; a mismatch then gives wrong results or a
    timeout instead of a :class:`MismatchError`.

    ``compression``: None (the tensor travels as it is), a name (``"fp16"``, ``"bf16"``, ``"none"``,
    whatever :func:`ringlet.compression.get` knows) or a :class:`ringlet.compression.Compressor`: what
    travels are the compressor's payloads, summed in float32 (:mod:`ringlet.engine.compressed`; docs/
    compression.md), and the result comes back in the tensor's dtype, the same bits on every rank. Sum and
    avg of floating tensors only (``ValueError`` otherwise); the compression is part of what the ranks
    check. ``compression_state``: a dict kept by the caller for this tensor and passed on every call
    (error-feedback residuals live there); None: a fresh one each call.
    """
    return _allreduce_call(tensor, op, algorithm, group, prescale_factor, postscale_factor, check, compression,
                           compression_state, inplace=False, sync=True).wait()


def allreduce_async(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
                    postscale_factor=1.0, *, check: bool | None = None, compression=None,
                    compression_state: dict | None = None) -> Work:
    """Like :func:`allreduce` but returns a handle at once; ``handle.wait()`` gives the output or raises
    the collective's error. The input is copied before the call returns, so the caller may change it at
    once; argument errors raise ``ValueError`` here, not at ``wait()``."""
    return _allreduce_call(tensor, op, algorithm, group, prescale_factor, postscale_factor, check, compression,
                           compression_state, inplace=False, sync=False)


def allreduce_(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
               postscale_factor=1.0, *, check: bool | None = None, compression=None,
               compression_state: dict | None = None) -> torch.Tensor:
    """In-place :func:`allreduce`: ``tensor`` receives the result and is returned."""
    return _allreduce_call(tensor, op, algorithm, group, prescale_factor, postscale_factor, check, compression,
                           compression_state, inplace=True, sync=True).wait()


def allreduce_async_(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
                     postscale_factor=1.0, *, check: bool | None = None, compression=None,
                     compression_state: dict | None = None) -> Work:
    """In-place :func:`allreduce_async`: do not touch ``tensor`` until the handle completes."""
    return _allreduce_call(tensor, op, algorithm, group, prescale_factor, postscale_factor, check, compression,
                           compression_state, inplace=True, sync=False)


def compressed_allreduce_async_(tensor: torch.Tensor, spec: Compressed, *, average: bool = True,
                                algorithm: str = "auto", group: Group | None = None,
                                check: bool | None = None) -> Work:
    """In place: the compressed all-reduce (sum, or ``average``) of ``tensor`` on the core queue, with
    every choice of ``spec`` (shapes, strategy, name); the training front ends' entry
    (:meth:`ringlet.torch.comm.Comm.allreduce_compressed_`)."""
    op = ReduceOp.AVG if average else ReduceOp.SUM
    return _allreduce_submit(tensor, op, algorithm, group, 1.0, 1.0, inplace=True, sync=False, check=check,
                             compressed=spec)


# ---- broadcast and reduce -----------------------------------------------------------------------
def _rooted_submit(tensor, root_rank, group, kind: Kind, op, *, inplace, sync) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    g = _group(rt, group)
    root_g = _check_root(g, root_rank)
    red = reduction(op)
    buf = tensor if inplace else tensor.clone()
    return rt.submit_op(RootedRequest(g, buf, kind, root_g, red, rt.options.check), sync=sync, library_frames=1)


def broadcast(tensor: torch.Tensor, root_rank: int, group: Group | None = None) -> torch.Tensor:
    """Return a copy of ``root_rank``'s tensor on every rank (``root_rank`` is a global rank)."""
    return _rooted_submit(tensor, root_rank, group, Kind.BROADCAST, ReduceOp.SUM, inplace=False, sync=True).wait()


def broadcast_async(tensor, root_rank, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, Kind.BROADCAST, ReduceOp.SUM, inplace=False, sync=False)


def broadcast_(tensor, root_rank, group=None) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` becomes the root's."""
    return _rooted_submit(tensor, root_rank, group, Kind.BROADCAST, ReduceOp.SUM, inplace=True, sync=True).wait()


def broadcast_async_(tensor, root_rank, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, Kind.BROADCAST, ReduceOp.SUM, inplace=True, sync=False)


def reduce(tensor: torch.Tensor, root_rank: int, op=ReduceOp.SUM, group: Group | None = None) -> torch.Tensor:
    """Reduce to ``root_rank``: the root gets ``op`` over all ranks; other ranks get their input back."""
    return _rooted_submit(tensor, root_rank, group, Kind.REDUCE, op, inplace=False, sync=True).wait()


def reduce_async(tensor, root_rank, op=ReduceOp.SUM, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, Kind.REDUCE, op, inplace=False, sync=False)


def reduce_(tensor, root_rank, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """In-place :func:`reduce`; on non-root ranks the content of ``tensor`` is unspecified afterwards."""
    return _rooted_submit(tensor, root_rank, group, Kind.REDUCE, op, inplace=True, sync=True).wait()


def reduce_async_(tensor, root_rank, op=ReduceOp.SUM, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, Kind.REDUCE, op, inplace=True, sync=False)


# ---- all-gather (ragged first dimension) --------------------------------------------------------
def _allgather_submit(tensor: torch.Tensor, group, algorithm: str, sizes, check: bool | None, *, sync: bool) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    algorithm = select.allgather(algorithm)
    g = _group(rt, group)
    if sizes is not None:
        sizes = tuple(int(s) for s in sizes)
        own, grank = (tensor.shape[0] if tensor.dim() else 1), g.rank_of(rt.rank)
        if len(sizes) != g.size or any(s < 0 for s in sizes) or sizes[grank] != own:
            raise ValueError(f"allgather: sizes must list the group's {g.size} first dimensions, this rank's "
                             f"({own}) at position {grank}; got {list(sizes)}")
    check = rt.options.check if check is None else bool(check)
    src = tensor if sync else tensor.clone()  # an async caller may change its tensor before the job runs
    return rt.submit_op(AllgatherRequest(g, src, algorithm, sizes, check, rt.options.check), sync=sync,
                        library_frames=1)


def allgather_async(tensor: torch.Tensor, group: Group | None = None, algorithm: str = "ring", *,
                    sizes=None, check: bool | None = None) -> Work:
    return _allgather_submit(tensor, group, algorithm, sizes, check, sync=False)


def allgather(tensor: torch.Tensor, group: Group | None = None, algorithm: str = "ring", *,
              sizes=None, check: bool | None = None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (sizes of dim 0 may differ; other dims must match).
    A 0-d tensor is treated as one row. ``algorithm``: ``"ring"`` (p-1 steps to the next rank) or
    ``"direct"`` (one step: every rank sends its block to every other; fewer dependent steps for ranks
    that cannot react at once, p-1 connections per rank).

    ``sizes``: every member's first dimension in group-rank order, when every caller knows them (MPI's
    ``Allgatherv`` counts). With ``check=False`` the data then moves at once, without the exchange that
    otherwise comes first; the lists must agree on every rank, or the result is wrong or the call times
    out. With checking on (default: ``RINGLET_CHECK``) the sizes are verified against the exchanged ones:
    a rank whose list differs raises ``ValueError`` once the data has moved (by the exchanged sizes), so
    the ranks whose lists were right complete the call."""
    return _allgather_submit(tensor, group, algorithm, sizes, check, sync=True).wait()


# ---- reduce-scatter -----------------------------------------------------------------------------
split_rows = ops.split_rows


def _reduce_scatter_submit(tensor, op, group, pre, post, sync) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension (got a scalar).")
    pre, post = args.scale_factor(pre, "prescale_factor"), args.scale_factor(post, "postscale_factor")
    red = reduction(op)
    g = _group(rt, group)
    buf = tensor.clone()
    return rt.submit_op(ReduceScatterRequest(g, buf, red, pre, post, rt.options.check), sync=sync,
                        library_frames=1)


def reduce_scatter(tensor: torch.Tensor, op=ReduceOp.SUM, group: Group | None = None,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over ranks, then return this rank's slice of dim 0 (the first ``dim0 % size`` ranks get one
    extra row), as Horovod's ``reducescatter``."""
    return _reduce_scatter_submit(tensor, op, group, prescale_factor, postscale_factor, True).wait()


def reduce_scatter_async(tensor, op=ReduceOp.SUM, group=None, prescale_factor=1.0, postscale_factor=1.0) -> Work:
    return _reduce_scatter_submit(tensor, op, group, prescale_factor, postscale_factor, False)


# ---- all-to-all ---------------------------------------------------------------------------------
def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | None = None, group: Group | None = None,
                   algorithm: str = "auto", *, recv_splits: Sequence[int] | None = None,
                   check: bool | None = None) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    algorithm = select.alltoall(algorithm)
    g = _group(rt, group)
    splits = args.alltoall_splits(splits, tensor, g.size)
    recv = args.alltoall_recv_splits(recv_splits, splits, g.size, g.rank_of(rt.rank))
    check = rt.options.check if check is None else bool(check)
    src = tensor.clone()
    return rt.submit_op(AlltoallRequest(g, src, tuple(splits), check, algorithm, recv), sync=False)


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | None = None, group: Group | None = None,
             algorithm: str = "auto", *, recv_splits: Sequence[int] | None = None, check: bool | None = None):
    """Send ``splits[d]`` rows (dim 0) to rank ``d``; return ``(output, received_splits)`` where the
    output concatenates the received rows in rank order. Without ``splits`` dim 0 is split evenly.

    ``algorithm``: ``"pairwise"`` (p-1 steps, one message per rank each), ``"hierarchical"`` (gather
    inside each host, one exchange between hosts; on one host it is a one-step direct exchange),
    ``"bruck"`` (ceil(log2 p) rounds, for small messages) or ``"auto"`` (the runtime's selector picks
    from the exchanged counts: :func:`ringlet.tuning.select.alltoall_choice`). docs/algorithms.md,
    "All-to-all". ``ValueError`` for an unknown name.

    ``recv_splits``: the rows this rank receives from each rank, when the caller knows them (torch's
    ``output_split_sizes``, MPI's ``recvcounts``; it is what this call would return as
    ``received_splits``). Give it on every rank of the group or on none. Then ``"auto"`` runs the
    pairwise exchange on every rank and nothing is exchanged before the data: no counts (the other
    schedules need every rank's counts, so a forced ``"hierarchical"`` or ``"bruck"`` exchanges them).
    ``check`` (default: ``RINGLET_CHECK``): the ranks' ops are compared, and their counts checked
    against each other, in the one small round every checked collective makes; counts that disagree
    (a rank's ``recv_splits[s]`` is not what rank ``s`` sends it) raise the same
    :class:`~ringlet.types.MismatchError` on every rank, before data moves. With ``check=False`` the
    counts are trusted: counts that disagree then give a wrong result or an error or a timeout of the
    transport (as MPI's ``Alltoallv``)."""
    return alltoall_async(tensor, splits, group, algorithm, recv_splits=recv_splits, check=check).wait()


# ---- barrier ------------------------------------------------------------------------------------
def barrier_async(group: Group | None = None) -> Work:
    rt = runtime()
    g = _group(rt, group)
    return rt.submit_op(BarrierRequest(g, rt.options.check), sync=False)


def barrier(group: Group | None = None) -> None:
    """Return once every member of ``group`` has entered the barrier."""
    rt = runtime()
    g = _group(rt, group)
    rt.submit_op(BarrierRequest(g, rt.options.check), sync=True).wait()
