"""How ZeRO launches its buckets: in one fixed order, with a cap on the working buffers alive.

:class:`BoundedLaunch` is a launcher of the bucket reducer (:mod:`~ringlet.torch.training.reducer`; the
calls of :class:`~ringlet.torch.training.launch_fifo.FifoLaunch`). A bucket filled parameter by parameter
launches when it is full and its turn in ``order`` has come (a bucket full early waits for those before
it; its gradients stay where autograd left them, and no working buffer exists for it yet). A bucket handed
over whole (:meth:`~ringlet.torch.training.reducer.BucketReducer.ready_bucket`) is a working buffer from
the moment it arrives, so it launches at once, out of turn: holding it back for its turn would keep
buffers alive outside the cap (a bucket that arrives early cannot wait for buckets not computed yet).
Every rank must therefore hand its whole buckets over in the same sequence, as ZeRO stage 3's backward
does (its gathers already follow that sequence on every rank).

At most ``limit`` buckets are launched and unfinished at any time: launching one more first waits for
the oldest and finishes it (its reduction's ``finish``), so a strategy that holds one working buffer per
launched bucket holds at most ``limit`` of them. Errors: an error raised while finishing the oldest
during backward propagates there; :meth:`BoundedLaunch.wait` finishes every bucket, then raises the first.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator, Sequence

from .launch_fifo import finish_each

if TYPE_CHECKING:
    from .buckets import Bucket, BucketSet
    from .reduction import StepMarks

__all__ = ["BoundedLaunch"]


class BoundedLaunch:
    """Buckets launched in ``order`` (bucket indices of the bucket set, every index once, the same on every
    rank), whole buckets at once, at most ``limit`` unfinished (see the module doc). ``ValueError`` for a
    ``limit`` below 1; at :meth:`start`, for an ``order`` that is not a permutation of the buckets."""

    spacing = None

    def __init__(self, order: Sequence[int], limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"BoundedLaunch: limit must be an int >= 1, got {limit!r}")
        self.order = list(order)
        self.limit = limit
        self._buckets: list[Bucket] = []
        self._next = 0
        self._flight: deque[Bucket] = deque()

    def start(self, bucket_set: BucketSet, marks: StepMarks) -> None:
        if sorted(self.order) != list(range(len(bucket_set.buckets))):
            raise ValueError(f"BoundedLaunch: order {self.order} is not a permutation of the "
                             f"{len(bucket_set.buckets)} buckets")
        self._buckets = bucket_set.buckets
        self._next = 0
        self._flight = deque()

    def accepted(self, b: Bucket, j: int | None) -> None:
        """Parameter ``j`` of ``b`` was accepted (None: the whole bucket, which launches now)."""
        if j is None and b.work is None:
            self._launch(b)
        self._launch_ready()

    def end_backward(self) -> None:
        self._launch_ready()

    @property
    def in_flight(self) -> int:
        """Buckets launched and not finished yet."""
        return len(self._flight)

    def _launch_ready(self) -> None:
        while self._next < len(self.order):
            b = self._buckets[self.order[self._next]]
            if b.work is None:
                if b.pending:
                    return
                self._launch(b)
            self._next += 1

    def _launch(self, b: Bucket) -> None:
        while len(self._flight) >= self.limit:
            self._finish_oldest()
        b.work = b.reduction.launch(b, False)
        self._flight.append(b)

    def _finish_oldest(self) -> None:
        self._finish(self._flight.popleft())

    def wait(self) -> None:
        """Finish every launched bucket, oldest first, then raise the first error, if any."""
        finish_each(self._oldest_first(), self._finish)

    def _oldest_first(self) -> Iterator[Bucket]:
        while self._flight:
            yield self._flight.popleft()

    @staticmethod
    def _finish(b: Bucket) -> None:
        b.reduction.finish(b, b.work.wait())

    def deliver(self, marks: StepMarks) -> None:
        for b in self._buckets:
            b.reduction.deliver(b, marks)
