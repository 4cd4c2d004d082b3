"""How :class:`~ringlet.torch.training.ddp.DistributedDataParallel` sends its gradients with
``priority=Priority(...)``: pieces, front layers first (:mod:`~ringlet.torch.training.pieces`,
:mod:`~ringlet.torch.training.piece_round`).

The calls are those of :class:`~ringlet.torch.training.launch_fifo.FifoLaunch`, plus
:meth:`PriorityLaunch.deliver_params`, which lands the averages of some parameters only (for
:class:`~ringlet.torch.training.overlap.OptimizerOverlap`). A whole piece (a compressed bucket, or a weight
averaged from sufficient factors) is staged on the main thread when it is ready (the factors are taken
from the layer there) and sent by its slot on the communication thread; its reduction's ``finish`` runs
when its average is first needed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ringlet import collectives as _core
from ringlet import timeline

from .pieces import PieceLayout, piece_layout, spacing
from .piece_round import Round

if TYPE_CHECKING:
    import torch

    from .buckets import Bucket, BucketSet
    from .priority import Priority
    from .reduction import ReductionContext, StepMarks

__all__ = ["PriorityLaunch"]


class PriorityLaunch:
    """Priority-scheduled pieces (see the module doc); ``algorithm()``: the all-reduce algorithm of the
    step, read at :meth:`start`."""

    def __init__(self, priority: Priority, ctx: ReductionContext, algorithm: Callable[[], str]):
        self.priority = priority
        self._ctx = ctx
        self._algorithm = algorithm
        self._set: BucketSet | None = None
        self._layout: PieceLayout | None = None
        self._recent: list[tuple[BucketSet, PieceLayout]] = []  # the last two sets' layouts (dense, factored)
        self._pending: list[int] = []
        self._marks: StepMarks | None = None
        self._landed: dict[int, list[bool]] = {}  # bucket index -> per parameter: average delivered
        self._finished: set[int] = set()           # whole buckets whose reduction finished
        self.round: Round | None = None

    def spacing(self, layout: list[list[torch.nn.Parameter]], reductions: list) -> list:
        """Where parameters sit in the buckets' buffers: around the control vectors' gaps
        (:func:`~ringlet.torch.training.pieces.spacing`; the ``spacing`` of a bucket set)."""
        return spacing(layout, reductions, self.priority.partition_bytes)

    @property
    def layout(self) -> PieceLayout | None:
        """The pieces of the bucket set last started (for inspection and tests)."""
        return self._layout

    def _layout_of(self, bucket_set: BucketSet) -> PieceLayout:
        """The pieces of ``bucket_set`` (kept for the last two sets: the dense and the factored one)."""
        known = [lay for s, lay in self._recent if s is bucket_set]
        layout = known[0] if known else piece_layout(bucket_set, self.priority.partition_bytes)
        self._recent = [(s, lay) for s, lay in self._recent if s is not bucket_set][-1:] + [(bucket_set, layout)]
        return layout

    def messages(self, bucket_set: BucketSet) -> dict[str, int]:
        """The dense all-reduces of a step with ``bucket_set``: ``pieceK`` -> bytes (control vector included)."""
        pieces = self._layout_of(bucket_set).pieces
        return {f"piece{q.index}": (q.hi - q.lo + (2 * len(pieces) if q.carries else 0)) * q.bucket.buffer.element_size()
                for q in pieces if not q.whole}

    def start(self, bucket_set: BucketSet, marks: StepMarks) -> None:
        if bucket_set is not self._set:
            self._set, self._layout = bucket_set, self._layout_of(bucket_set)
        layout = self._layout
        self._pending = [len(q.slots) for q in layout.pieces]
        self._marks = marks
        self._landed = {b.index: [False] * len(b.params) for b in layout.buckets}
        self._finished = set()
        self.round = Round(layout, self._ctx.comm, self._algorithm(), _core.runtime().options.timeout,
                           self.priority.partition_bytes, self._ctx.observe)

    def accepted(self, b: Bucket, j: int) -> None:
        ready = []
        for i in self._layout.of_slot[b.index][j]:
            self._pending[i] -= 1
            if self._pending[i] == 0:
                q = self._layout.pieces[i]
                ready.append((i, self._stage(q.bucket) if q.whole else None))
        if ready:
            self.round.mark_ready(ready)

    def _stage(self, b: Bucket) -> Callable[[], Any]:
        b.algo = self.round.algo
        stage = getattr(b.reduction, "stage", None)
        if stage is not None:
            return stage(b)
        timed = timeline.active() is not None
        return lambda: b.reduction.launch(b, timed).wait()

    def end_backward(self) -> None:
        pass  # every piece was marked ready as its last parameter was accepted

    def wait(self) -> None:
        """Wait for every piece, finish the whole ones; raise the first error, if any."""
        error: BaseException | None = None
        for i in range(len(self._layout.pieces)):
            try:
                self.round.wait(i)
            except BaseException as exc:  # noqa: BLE001 - keep waiting so no piece is left in flight
                error = error or exc
        if error is not None:
            raise error
        for b in self._layout.buckets:
            self._finish(b)

    def _finish(self, b: Bucket) -> None:
        pieces = self._layout.of_bucket[b.index]
        if b.index in self._finished or not pieces or not self._layout.pieces[pieces[0]].whole:
            return
        b.reduction.finish(b, self.round.wait(pieces[0]))
        b.validated.add(b.algo)
        self._finished.add(b.index)

    def deliver(self, marks: StepMarks) -> None:
        for b in self._layout.buckets:
            b.reduction.deliver(b, marks)

    def deliver_params(self, params: list[torch.nn.Parameter]) -> None:
        """Wait for the pieces of ``params`` and deliver their averages (a whole piece's bucket at once)."""
        layout, where = self._layout, self._set.where
        for p in params:
            b, j, _ = where[id(p)]
            landed = self._landed[b.index]
            if landed[j]:
                continue
            pieces = layout.of_slot[b.index][j]
            if pieces and layout.pieces[pieces[0]].whole:
                self._finish(b)
                b.reduction.deliver(b, self._marks)
                landed[:] = [True] * len(landed)
                continue
            for i in pieces:
                self.round.wait(i)
            b.reduction.deliver_slot(b, j, self._marks)
            landed[j] = True

    def landable(self, params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
        """Those of ``params`` whose pieces are all sent already (delivering them would not wait)."""
        of_slot, where, futures = self._layout.of_slot, self._set.where, self.round.futures
        out = []
        for p in params:
            b, j, _ = where[id(p)]
            if all(futures[i].done() for i in of_slot[b.index][j]):
                out.append(p)
        return out

    def record(self, tl: timeline.Timeline) -> None:
        pass  # the slots record their spans as they run
