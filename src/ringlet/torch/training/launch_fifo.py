"""How :class:`~ringlet.torch.training.ddp.DistributedDataParallel` launches its buckets by default:
first in, first out.

A bucket is launched (its reduction's :meth:`~ringlet.torch.training.reduction.Reduction.launch`) as soon
as it and every bucket before it are full, so buckets start in index order on every rank; at the end of
backward every bucket is waited for and the averages are delivered (:class:`EagerLaunch`: each bucket as
soon as it is full, for name-matched collectives). The other launcher is
:class:`~ringlet.torch.training.launch_priority.PriorityLaunch`. A launcher's calls per reduced backward:
:meth:`start` at the forward, :meth:`accepted` after each parameter's gradient went into its bucket,
:meth:`end_backward` once every parameter was accepted, :meth:`wait`, then :meth:`deliver` (and
:meth:`record` for the timeline).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from ringlet import timeline

from .reduction import DenseReduction

if TYPE_CHECKING:
    from .buckets import Bucket, BucketSet
    from .reduction import StepMarks

__all__ = ["FifoLaunch", "EagerLaunch", "finish_each"]


def finish_each(buckets: Iterable[Bucket], finish: Callable[[Bucket], None]) -> None:
    """``finish(b)`` for every bucket (``buckets`` may be consumed as it goes), then the first error
    raised, if any: an error does not stop the others, so no bucket is left in flight."""
    error: BaseException | None = None
    for b in buckets:
        try:
            finish(b)
        except BaseException as exc:  # noqa: BLE001 - keep waiting so no bucket is left in flight
            error = error or exc
    if error is not None:
        raise error


class FifoLaunch:
    """First-in-first-out bucket launches (see the module doc); ``algorithm()``: the all-reduce algorithm
    of the step, read at each launch."""

    spacing = None  # buckets hold their parameters one after the other

    def __init__(self, algorithm: Callable[[], str]):
        self._algorithm = algorithm
        self._buckets: list[Bucket] = []
        self._next = 0

    @staticmethod
    def messages(bucket_set: BucketSet) -> dict[str, int]:
        """The dense all-reduces of a step with ``bucket_set``: ``bucketK`` -> bytes."""
        return {f"bucket{b.index}": b.buffer.numel() * b.buffer.element_size() for b in bucket_set.buckets
                if isinstance(b.reduction, DenseReduction) and b.buffer.numel()}

    def start(self, bucket_set: BucketSet, marks: StepMarks) -> None:
        self._buckets = bucket_set.buckets
        self._next = 0

    def accepted(self, b: Bucket, j: int) -> None:
        self._launch_ready()

    def end_backward(self) -> None:
        self._launch_ready()

    def _launch_ready(self) -> None:
        buckets = self._buckets
        while self._next < len(buckets) and buckets[self._next].pending == 0:
            self._launch(buckets[self._next])
            self._next += 1

    def _launch(self, b: Bucket) -> None:
        timed = timeline.active() is not None
        b.t_launch = timeline.now_us() if timed else 0.0
        b.algo = self._algorithm()
        b.work = b.reduction.launch(b, timed)

    def wait(self) -> None:
        """Wait for every bucket, then raise the first error, if any."""
        finish_each(self._buckets, self._finish)

    @staticmethod
    def _finish(b: Bucket) -> None:
        b.reduction.finish(b, b.work.wait())
        b.validated.add(b.algo)

    def deliver(self, marks: StepMarks) -> None:
        for b in self._buckets:
            b.reduction.deliver(b, marks)

    def record(self, tl: timeline.Timeline) -> None:
        """``QUEUE`` (launch to start) and ``COMMUNICATE`` spans per bucket."""
        for b in self._buckets:
            times = b.work.span()
            if times is None:
                continue
            start, end = times
            track = f"ddp.bucket{b.index}"
            tl.span(track, "QUEUE", b.t_launch, start)
            tl.span(track, "COMMUNICATE", start, end,
                    {"bytes": b.buffer.numel() * b.buffer.element_size(), "params": len(b.params)})


class EagerLaunch(FifoLaunch):
    """Each bucket launched as soon as it is full, whatever the buckets before it: only for a communicator
    whose scheduler matches collectives by name (:class:`ringlet.torch.name_matched.NameMatched`), where
    ranks may fill their buckets in different orders."""

    def accepted(self, b: Bucket, j: int) -> None:
        if b.pending == 0:
            self._launch(b)

    def end_backward(self) -> None:
        for b in self._buckets:
            if b.work is None:
                self._launch(b)
