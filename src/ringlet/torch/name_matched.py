"""The Horovod coordinator as a :class:`~ringlet.torch.comm.Comm` scheduler: single collectives matched
by name on every rank (the order of submission does not matter), fused and timed by the coordinator.

The Horovod facade chooses it explicitly (``Comm(process_set, scheduler=NAME_MATCHED)``) where its
semantics need name matching: ``DistributedOptimizer``'s name-matched gradients (``groups``, ops other
than Average/Sum, ``RINGLET_HVD_GRADIENTS=named``). The training layers never pick it from global state.
"""
from __future__ import annotations

from typing import Any

from ringlet.group import Group

from . import mpi_ops
from .comm import CommFuture
from .context import context, current

__all__ = ["NameMatched", "NAME_MATCHED"]


def _settle(fut: CommFuture, value: Any, error: BaseException | None) -> None:
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _from_handle(handle: int) -> CommFuture:
    """The future of a coordinator handle, from the current ``ringlet.torch`` context (the one that made
    the handle: an elastic reset may have replaced the context a Comm was built under)."""
    fut = CommFuture()
    current().handles.on_done(handle, lambda value, error: _settle(fut, value, error))
    return fut


class NameMatched:
    """Single collectives through ``ringlet.torch``'s coordinator, matched by ``name``; ``check`` and
    ``algorithm`` are the coordinator's business (ignored here). Stateless: :data:`NAME_MATCHED`."""

    name_matched = True

    def resolve(self, group_or_set) -> tuple[Group | None, Any]:
        """``(group, process_set)``: None or a world :class:`ringlet.Group` is the global process set,
        else a ``ringlet.torch`` ProcessSet (``TypeError`` for anything else); ``ValueError`` (Horovod's
        wording) before ``hvd.init()``."""
        from .process_sets import ProcessSet, global_process_set

        ctx = context()
        if group_or_set is None:
            ps = global_process_set
        elif isinstance(group_or_set, ProcessSet):
            ps = group_or_set
        elif isinstance(group_or_set, Group) and group_or_set.ranks == tuple(range(ctx.rt.size)):
            ps = global_process_set
        else:
            raise TypeError("The name-matched scheduler needs a ringlet.torch ProcessSet (or None for the "
                            f"world) as the group, not {type(group_or_set).__name__}.")
        group = ps._group() if ps.process_set_id != 0 else None
        return group, ps

    def allreduce_(self, comm, t, op, name, prescale, postscale, check, algorithm) -> CommFuture:
        return _from_handle(mpi_ops.allreduce_async_(t, name=name, op=int(op), prescale_factor=prescale,
                                                     postscale_factor=postscale, process_set=comm.process_set))

    def allgather(self, comm, t, name, sizes, check, algorithm) -> CommFuture:
        return _from_handle(mpi_ops.allgather_async(t, name=name, process_set=comm.process_set))

    def reduce_scatter(self, comm, t, op, name, prescale, postscale) -> CommFuture:
        return _from_handle(mpi_ops.reducescatter_async(t, name=name, op=int(op), process_set=comm.process_set,
                                                        prescale_factor=prescale, postscale_factor=postscale))

    def broadcast_(self, comm, t, name) -> CommFuture:
        return _from_handle(mpi_ops.broadcast_async_(t, comm.root, name=name, process_set=comm.process_set))


NAME_MATCHED = NameMatched()
