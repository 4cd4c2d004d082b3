"""The one seam between the training front ends and the engine.

:class:`~ringlet.torch.training.DistributedDataParallel`, ``DistributedOptimizer``, the comm hooks for
stock torch DDP and the sufficient-factors path reach the network only through a :class:`Comm`. Its
operations return :class:`CommFuture` — a ``torch.futures.Future`` whose value is the op's result and
which chains with ``then()``. Where the single collectives run is the caller's explicit choice, a
*scheduler* handed to :class:`Comm` (never global state such as whether ``hvd.init()`` has run):

* :data:`ORDERED_QUEUE` (the default), ringlet's core queue (``ringlet.*_async``): ops run in submission
  order, which must be identical on every rank (DDP submits in bucket order, hooks are called in bucket
  order);
* :class:`ringlet.torch.name_matched.NameMatched`, the Horovod coordinator (``ringlet.torch``
  initialised): ops are matched by ``name`` on every rank, so the order of submission does not matter
  and the coordinator records their timeline phases. The Horovod facade chooses it where it needs it.

Jobs of several collectives with computation between them (:meth:`Comm.submit`) and compressed
all-reduces (:meth:`Comm.allreduce_compressed_`) always run on the core queue, in submission order,
beside the coordinator (their tags never meet its). Errors reach the future: ``wait()`` raises the op's
exception.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

import ringlet
from ringlet import collectives as _core
from ringlet import compression as _compression
from ringlet.engine import agree as _agree
from ringlet.engine import compressed_rs as _crs
from ringlet.engine import ops as _ops
from ringlet.engine.meta import Kind as _Kind
from ringlet.engine.meta import Meta as _Meta
from ringlet.group import Group
from ringlet.types import ReduceOp, reduction

__all__ = ["Comm", "CommFuture", "OrderedQueue", "ORDERED_QUEUE", "ensure_initialized", "session_key"]


class CommFuture(torch.futures.Future):
    """A ``torch.futures.Future`` of one collective; :meth:`span` gives its (start, end) of execution in
    timeline microseconds once done on the core queue, else None (the coordinator records its own)."""

    def __init__(self) -> None:
        super().__init__()
        self._span: tuple[float, float] | None = None

    def span(self) -> tuple[float, float] | None:
        return self._span


def _settle(fut: torch.futures.Future, value: Any, error: BaseException | None) -> None:
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _from_work(work) -> CommFuture:
    fut = CommFuture()

    def done(w) -> None:
        fut._span = w.span
        _settle(fut, w._result, w._error)

    work.add_done_callback(done)
    return fut


class OrderedQueue:
    """The scheduler of ringlet's core queue (``ringlet.*_async``): ops run in submission order, which
    must be the same on every rank (DDP submits in bucket order, torch calls hooks in bucket order).
    ``name`` goes into the checked record, so ranks that submit in different orders get a
    ``MismatchError`` naming the tensor. Stateless: :data:`ORDERED_QUEUE` is the one instance."""

    name_matched = False

    def resolve(self, group_or_set) -> tuple[Group | None, Any]:
        """``(group, process_set)`` of a :class:`ringlet.Group`, a ``ringlet.torch`` ProcessSet or None
        (the world: group None, which follows the world through an elastic reset)."""
        return _resolve_group(group_or_set), None

    def allreduce_(self, comm: "Comm", t, op, name, prescale, postscale, check, algorithm) -> CommFuture:
        return _from_work(ringlet.allreduce_async_(t, op=op, algorithm=algorithm, group=comm.group,
                                                   prescale_factor=prescale, postscale_factor=postscale,
                                                   check=check))

    def allgather(self, comm: "Comm", t, name, sizes, check, algorithm) -> CommFuture:
        return _from_work(ringlet.allgather_async(t, group=comm.group, algorithm=algorithm, sizes=sizes, check=check))

    def reduce_scatter(self, comm: "Comm", t, op, name, prescale, postscale) -> CommFuture:
        return _from_work(ringlet.reduce_scatter_async(t, op=op, group=comm.group, prescale_factor=prescale,
                                                       postscale_factor=postscale))

    def broadcast_(self, comm: "Comm", t, name) -> CommFuture:
        return _from_work(ringlet.broadcast_async_(t, comm.root, group=comm.group))


ORDERED_QUEUE = OrderedQueue()


class Comm:
    """Collectives of one group for the training front ends.

    ``group_or_set``: a :class:`ringlet.Group`, a ``ringlet.torch`` ProcessSet or None (the world).
    ``algorithm``: the all-reduce algorithm of the core queue. ``scheduler``: how the single collectives
    (:meth:`allreduce_`, :meth:`allgather`, :meth:`reduce_scatter`, :meth:`broadcast_`) are ordered
    across ranks — :data:`ORDERED_QUEUE` (default: ringlet's core queue, submission order) or the
    Horovod coordinator's name matching (:class:`ringlet.torch.name_matched.NameMatched`, chosen by the
    Horovod facade; it needs ``ringlet.torch`` initialised and a ProcessSet or None as the group).
    Nothing here depends on whether ``hvd.init()`` has run: the caller's choice alone decides. Jobs
    (:meth:`submit`), compressed all-reduces and the flat-buffer ops always run on the core queue.
    ``ValueError`` when ringlet is not initialised.
    """

    def __init__(self, group_or_set=None, algorithm: str = "auto", scheduler=ORDERED_QUEUE):
        self.algorithm = algorithm
        self.scheduler = scheduler
        rt = _core.runtime()
        self.group, self.process_set = scheduler.resolve(group_or_set)
        self.ranks = self.group.ranks if self.group is not None else tuple(range(rt.size))
        self.root = self.ranks[0]
        self.size = len(self.ranks)

    @property
    def coordinated(self) -> bool:
        """Whether the single collectives are matched by name (the Horovod coordinator's scheduler)."""
        return self.scheduler.name_matched

    @property
    def live_size(self) -> int:
        """Ranks in the group now: for the world, its size after any elastic reset (``size`` is the
        size at construction)."""
        if self.group is not None:
            return self.group.size
        return _core.runtime().world.size

    # ---- single collectives (ordered by the scheduler) ---------------------------------------------
    def allreduce_(self, t: torch.Tensor, op: ReduceOp, name: str, prescale: float = 1.0, timed: bool = False,
                   check: bool | None = None, algorithm: str | None = None, postscale: float = 1.0) -> CommFuture:
        """In-place all-reduce of ``t``; the future's value is ``t``. ``check`` and ``algorithm``
        (default: the one given at construction) apply to the core queue (see :func:`ringlet.allreduce`).
        ``timed`` is accepted for callers that ask; the core queue always records :meth:`CommFuture.span`."""
        return self.scheduler.allreduce_(self, t, op, name, prescale, postscale, check, algorithm or self.algorithm)

    def allgather(self, t: torch.Tensor, name: str, *, sizes=None, check: bool | None = None,
                  algorithm: str = "ring") -> CommFuture:
        """Every member's ``t`` concatenated along dim 0 (ragged dim 0; ``sizes``, ``check`` and
        ``algorithm`` as in :func:`ringlet.allgather`, core queue only)."""
        return self.scheduler.allgather(self, t, name, sizes, check, algorithm)

    def reduce_scatter(self, t: torch.Tensor, op: ReduceOp, name: str, prescale: float = 1.0,
                       postscale: float = 1.0) -> CommFuture:
        """Reduce ``t`` over the group; the value is this rank's rows of dim 0 (the first
        ``dim0 % size`` ranks get one extra row)."""
        return self.scheduler.reduce_scatter(self, t, op, name, prescale, postscale)

    def broadcast_(self, t: torch.Tensor, name: str) -> CommFuture:
        """In-place broadcast of ``t`` from the group's first rank."""
        return self.scheduler.broadcast_(self, t, name)

    def allreduce_compressed_(self, t: torch.Tensor, compressor, state: dict | None, name: str,
                              average: bool = True, shapes: Sequence[Sequence[int]] | None = None, *,
                              check: bool | None = None, algorithm: str | None = None,
                              strategy: str | None = None) -> CommFuture:
        """In-place compressed all-reduce of the floating ``t`` (sum, or the average with ``average``); the
        future's value is ``t``. ``compressor``: a :class:`ringlet.compression.Compressor` or a name for
        :func:`ringlet.compression.get`; ``state``: the caller's dict for this tensor, the same every call
        (residuals, PowerSGD's ``Q``); ``shapes``: the tensors ``t`` concatenates (PowerSGD);
        ``strategy``: another than the compressor's own (:mod:`ringlet.engine.compressed`).

        Whatever the scheduler, this is a job on ringlet's core queue, like :meth:`submit`: every rank must
        submit its compressed all-reduces in the same order (they are never matched by name; they run
        beside the coordinator). ``name`` is part of the checked record, so ranks that
        submit in different orders get a MismatchError naming the tensor, not wrong sums; ``check`` and
        ``algorithm`` as in :func:`ringlet.allreduce`."""
        spec = _core.Compressed(_compression.get(compressor), state,
                                None if shapes is None else tuple(tuple(s) for s in shapes), strategy, name)
        work = _core.compressed_allreduce_async_(t, spec, average=average, algorithm=algorithm or self.algorithm,
                                                 group=self.group, check=check)
        return _from_work(work)

    # ---- flat buffers (ZeRO) ---------------------------------------------------------------------------
    def reduce_scatter_flat_(self, flat: torch.Tensor, counts: Sequence[int], op: ReduceOp, name: str, *,
                             prescale: float = 1.0, postscale: float = 1.0, check: bool = False) -> CommFuture:
        """Reduce the contiguous 1-D ``flat`` (``sum(counts)`` elements; ``counts`` in group-rank order)
        over the group in place. The value is this member's block — a view of ``flat``, ``counts[i]``
        elements after the lower members' blocks — holding ``postscale · op(prescale · flat)`` (an average
        divides by the group size); the rest of ``flat`` is scratch afterwards. Runs on ringlet's core
        queue in submission order (also with ``ringlet.torch``'s coordinator running), like :meth:`submit`.
        ``check``: the members first agree on ``name``, dtype and size (a ``MismatchError`` instead of
        wrong sums). ``ValueError`` for a non-contiguous or not 1-D ``flat`` or counts that do not fit."""
        red = reduction(op)
        self._check_flat(flat, counts)

        def job(ch):
            if check:
                _agree.agree(ch, _Meta.of(name, _Kind.REDUCESCATTER, flat, op=red.op, pre=prescale, post=postscale))
            _ops.scale_(flat, prescale)
            block = _ops.reduce_scatter_(ch, flat, counts, red)
            return _ops.finish_(block, red, ch.size, postscale)

        return self._submit_flat(_Kind.REDUCESCATTER, flat, name, job)

    def allgather_flat_(self, flat: torch.Tensor, counts: Sequence[int], name: str, *, check: bool = False,
                        algorithm: str = "ring") -> CommFuture:
        """Fill the contiguous 1-D ``flat`` with every member's block in group-rank order (this member's
        block, ``counts[i]`` elements after the lower members', must hold its data); the value is
        ``flat``. Core queue, ``check`` and errors as :meth:`reduce_scatter_flat_`; ``algorithm``:
        ``"ring"``, ``"direct"`` or ``"auto"`` (the installed cost model's choice, else the ring)."""
        self._check_flat(flat, counts)

        def job(ch):
            if check:
                _agree.agree(ch, _Meta.of(name, _Kind.ALLGATHER, flat))
            _ops.allgather_(ch, flat, counts, algorithm)
            return flat

        return self._submit_flat(_Kind.ALLGATHER, flat, name, job)

    def reduce_scatter_compressed_flat_(self, flat: torch.Tensor, counts: Sequence[int], compressor,
                                        state: dict | None, op: ReduceOp, name: str, *,
                                        check: bool = False) -> CommFuture:
        """:meth:`reduce_scatter_flat_` where every block that travels is a compressor's payload
        (:mod:`ringlet.engine.compressed_rs`): each member compresses every other member's block of the
        floating ``flat`` (``state``: the caller's dict for this buffer, the same every call — one
        sub-dict per destination block holds its error-feedback residual), the owners add the payloads and
        their own block (exact) in float32. The value is this member's block — a view of ``flat`` in
        ``flat``'s dtype, rounded once from the float32 result — holding the sum (``op`` SUM) or the
        average (AVG) over the group; the rest of ``flat`` is unchanged. ``compressor``: a
        :class:`ringlet.compression.Compressor` or a name for :func:`ringlet.compression.get`. Core queue,
        in submission order; ``check``: the members first agree on ``name``, dtype, counts and the
        compression. ``ValueError`` for bad buffers or counts, an op other than SUM/AVG, a compressor with
        its own schedule (PowerSGD) or a state that is not a dict; ``TypeError`` for a non-floating
        ``flat``."""
        red = reduction(op)
        if red.op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"a compressed reduce-scatter sums or averages; op {red.name!r} is not supported")
        self._check_flat(flat, counts)
        if not flat.is_floating_point():
            raise TypeError(f"a compressed reduce-scatter needs a floating buffer, got {flat.dtype}")
        if state is not None and not isinstance(state, dict):
            raise ValueError(f"state must be a dict (the same one every call) or None, got {type(state).__name__}")
        comp = _compression.get(compressor)
        _crs.check_compressor(comp)

        def job(ch):
            if check:
                _agree.agree(ch, _Meta.of(name, _Kind.REDUCESCATTER, flat, op=red.op, splits=tuple(counts),
                                          compression=_crs.describe(comp, counts)))
            start = sum(counts[:ch.rank])
            own = flat[start:start + counts[ch.rank]]
            return own.copy_(_crs.compressed_reduce_scatter_(ch, flat, counts, comp, state, red.averages))

        return self._submit_flat(_Kind.REDUCESCATTER, flat, name, job)

    def _check_flat(self, flat: torch.Tensor, counts: Sequence[int]) -> None:
        if flat.dim() != 1 or not flat.is_contiguous():
            raise ValueError(f"a flat buffer must be 1-D and contiguous, got shape {tuple(flat.shape)}")
        if len(counts) != self.size or sum(counts) != flat.numel() or min(counts, default=0) < 0:
            raise ValueError(f"counts {list(counts)} do not cut {flat.numel()} elements into {self.size} blocks")

    def _submit_flat(self, kind: _Kind, flat: torch.Tensor, name: str, job: Callable) -> CommFuture:
        """Queue ``job(channel)``, one collective on this group, through the runtime's ``submit_op``:
        in order on the core queue, and recorded (flight recorder, stall inspector) as ``kind`` on ``flat``
        under ``name``."""
        rt = _core.runtime()
        group = self.group if self.group is not None else rt.world
        return _from_work(rt.submit_op(_FlatOp(group, kind, flat, name, job), sync=False, library_frames=1))

    # ---- jobs -----------------------------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any], timed: bool = False) -> CommFuture:
        """Run ``fn`` on ringlet's communication thread, in queue order, where it may call ringlet's core
        collectives (synchronous ones run inline there). Every rank must submit the same jobs in the
        same order; the future's value is ``fn``'s return value."""
        rt = _core.runtime()

        def job():
            with _core.use_runtime(rt):  # the caller's runtime, also where runtimes are per thread (tests)
                return fn()

        return _from_work(rt.submit(job, sync=False))


class _FlatOp:
    """A flat-buffer collective as an engine request (``group``, ``run(channel)``; ``kind``, ``buf`` and
    ``name`` for its flight record)."""

    __slots__ = ("group", "kind", "buf", "name", "_job")

    def __init__(self, group: Group, kind: _Kind, buf: torch.Tensor, name: str, job: Callable) -> None:
        self.group, self.kind, self.buf, self.name, self._job = group, kind, buf, name, job

    def run(self, channel) -> Any:
        return self._job(channel)


def ensure_initialized() -> None:
    """Initialise ringlet when nothing has yet (the comm hooks need nothing but the hook line): over
    shared memory when the launcher chose it (``ringlet run`` on one host), else on torch.distributed's
    existing default process group, with ringlet's traffic on a Gloo group of its own beside the
    script's. ``ValueError`` when torch.distributed is not initialised either."""
    try:
        _core.runtime()
        return
    except ValueError:
        pass
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("ringlet has not been initialized and torch.distributed has no default process group: "
                         "call dist.init_process_group(...) or ringlet.init() first.")
    from ringlet.transport import detect
    from ringlet.transport.torchdist import TorchTransport

    ringlet.init("shm" if detect() == "shm" else TorchTransport.beside_default_group())


def session_key() -> tuple[int, int]:
    """Identifies the current ringlet runtime and ``ringlet.torch`` context: it changes when either is
    initialised or shut down, so a cached :class:`Comm` knows to be rebuilt."""
    from .context import current

    return id(_core.runtime()), id(current())


def _resolve_group(g) -> Group | None:
    if g is None or isinstance(g, Group):
        return g
    if hasattr(g, "_group") and callable(g._group):  # a ringlet.torch ProcessSet
        if getattr(g, "process_set_id", None) == 0:
            return None  # the global set: the world, which follows an elastic reset
        return g._group()
    raise TypeError(f"process_group must be a ringlet Group or ProcessSet, got {type(g).__name__}; torch "
                    "ProcessGroups belong to torch's own DistributedDataParallel (see ringlet.torch.hooks).")
