"""Where the collectives of :class:`~ringlet.torch.DistributedDataParallel` and of the stock-DDP comm
hooks go: :class:`Comm` picks ringlet's core queue or, when ``ringlet.torch`` is initialised, its
name-matched coordinator; :class:`Pending` is one collective in flight on either path.
"""
from __future__ import annotations

import torch

import ringlet
from ringlet import collectives as _core
from ringlet import timeline
from ringlet.group import Group
from ringlet.types import ReduceOp

__all__ = ["Comm", "Pending"]


class Pending:
    """An in-flight collective of :class:`Comm`: ``wait()`` returns its result or raises its error;
    ``span()`` gives (start, end) in timeline microseconds when it was timed."""

    __slots__ = ("_work", "_handle", "_ctx", "_marks")

    def __init__(self, work=None, handle: int | None = None, ctx=None, marks: list | None = None):
        # The context is kept so that any thread may wait (hvd's synchronize looks it up per thread).
        self._work, self._handle, self._ctx, self._marks = work, handle, ctx, marks

    def wait(self):
        if self._handle is not None:
            return self._ctx.handles.wait(self._handle)
        return self._work.wait()

    def span(self) -> tuple[float, float] | None:
        if not self._marks:
            return None
        return self._marks[0].wait(), self._marks[1].wait()


class Comm:
    """Where the collectives of DDP and the comm hooks go.

    Normally ringlet's core queue (``allreduce_async_`` / ``broadcast_async_``): ops run in submission
    order, which is identical on every rank because DDP submits in bucket order. When ``ringlet.torch``
    is initialised its coordinator also drives that queue, from its own thread, so the interleaving
    would differ between ranks; then the ops go through the coordinator under fixed names instead
    (matched by name, so interleaving does not matter), and the coordinator records their timeline phases.
    """

    def __init__(self, group_or_set=None, algorithm: str = "auto"):
        self.algorithm = algorithm
        ctx = _torch_context()
        self.coordinated = ctx is not None
        if self.coordinated:
            from .process_sets import ProcessSet, global_process_set

            if group_or_set is None:
                self.process_set = global_process_set
            elif isinstance(group_or_set, ProcessSet):
                self.process_set = group_or_set
            elif isinstance(group_or_set, Group) and group_or_set.ranks == tuple(range(ctx.rt.size)):
                self.process_set = global_process_set
            else:
                raise TypeError("With ringlet.torch initialised, pass a ringlet.torch ProcessSet (or None for "
                                f"the world) as the group, not {type(group_or_set).__name__}.")
            ranks = self.process_set.ranks
            self.group = None
            self.ranks = tuple(ranks)
        else:
            self.group = _resolve_group(group_or_set)
            self.ranks = self.group.ranks if self.group is not None else tuple(range(_core.runtime().size))
        self.root = self.ranks[0]
        self.size = len(self.ranks)

    def allreduce_(self, t: torch.Tensor, op: ReduceOp, name: str, prescale: float = 1.0,
                   timed: bool = False, check: bool | None = None, algorithm: str | None = None) -> Pending:
        """In-place all-reduce of ``t`` (``name`` is used only in coordinated mode, where the coordinator
        validates every op; ``check`` and ``algorithm`` (default: the one given at construction) apply to
        the core path, see :func:`ringlet.allreduce`)."""
        if self.coordinated:
            from . import mpi_ops

            return Pending(handle=mpi_ops.allreduce_async_(t, name=name, op=int(op), prescale_factor=prescale,
                                                           process_set=self.process_set), ctx=_torch_context())
        marks = [_stamp()] if timed else None
        work = ringlet.allreduce_async_(t, op=op, algorithm=algorithm or self.algorithm, group=self.group,
                                        prescale_factor=prescale, check=check)
        if timed:
            marks.append(_stamp())
        return Pending(work=work, marks=marks)

    def submit(self, fn, timed: bool = False) -> Pending:
        """Run ``fn`` on ringlet's communication thread, in queue order, where it may issue several
        collectives of its own (core path only; every rank must submit the same jobs in the same order)."""
        if self.coordinated:
            raise RuntimeError("jobs of several collectives need ringlet's core queue, not the coordinator")
        rt = _core.runtime()

        def job():
            with _core.use_runtime(rt):  # the caller's runtime, also where runtimes are per thread (tests)
                return fn()

        marks = [_stamp()] if timed else None
        work = rt.submit(job, sync=False)
        if timed:
            marks.append(_stamp())
        return Pending(work=work, marks=marks)

    def broadcast_(self, t: torch.Tensor, name: str) -> Pending:
        """In-place broadcast of ``t`` from the group's first rank."""
        if self.coordinated:
            from . import mpi_ops

            return Pending(handle=mpi_ops.broadcast_async_(t, self.root, name=name, process_set=self.process_set),
                           ctx=_torch_context())
        return Pending(work=ringlet.broadcast_async_(t, self.root, group=self.group))


def _torch_context():
    from .context import current as _ctx_or_none

    return _ctx_or_none()


def _resolve_group(g) -> Group | None:
    if g is None or isinstance(g, Group):
        return g
    if hasattr(g, "_group") and callable(g._group):  # a ringlet.torch ProcessSet
        return g._group()
    raise TypeError(f"process_group must be a ringlet Group or ProcessSet, got {type(g).__name__}; torch "
                    "ProcessGroups belong to torch's own DistributedDataParallel (see ringlet.torch.hooks).")


def _stamp():
    """A no-op queued on ringlet's comm thread whose result is the time it ran: placed right before and
    after a collective, the two stamps bracket its execution (collectives run one at a time in order)."""
    return _core.runtime().submit(timeline.now_us, sync=False)
