"""Folding flight records into running totals, lazily: nothing here runs on the collective path.

A :class:`Cursor` follows one :class:`ringlet.flight.FlightRecorder`: each :meth:`Cursor.take` returns the
records finished since the last call, in order, and how many finished records the ring buffer lost
before they could be read (it keeps the last ``RINGLET_FLIGHT_RECORDER`` records; a reader that comes
less often than the ring fills misses some, and says so instead of undercounting silently). Records are
found again by identity (the last one taken), so none is counted twice; what the ring dropped is
counted from the recorder's ``appended`` count (the loss is exact but for the rare scrape that lands
between a record's append and its count: then one record is counted lost one scrape late or early, and
the running total is right again at the next scrape). A record still queued or running stops the take:
it and the ones after it come in a later one (collectives finish in the order they were queued).

:class:`Totals` adds taken records to cumulative counts per (op, algorithm), errors per (op, error type)
and a latency histogram per op (start to end, seconds, :data:`BUCKETS`). The algorithm is the one that
ran for an all-reduce (``small`` for the transport's small-message path, ``compressed``), the one asked
for otherwise (``auto`` where the engine chose), ``default`` for ops that have only one.
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

from .. import flight

__all__ = ["BUCKETS", "Cursor", "Take", "Totals", "OpTotals"]

# Latency buckets (seconds): a 4 KiB all-reduce over shared memory takes tens of microseconds, a large
# one over a slow link seconds; past five minutes a collective is a hang, which the stall inspector names.
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_UNFINISHED = ("queued", "running")


@dataclass
class Take:
    """One :meth:`Cursor.take`: the newly finished ``records`` (oldest first), ``dropped`` (finished or
    not, lost from the ring before they were read), and the records still ``pending`` (queued or
    running) with the monotonic time the oldest of them was queued (None when none is)."""

    records: list
    dropped: int
    pending: int
    oldest_enqueue: float | None


class Cursor:
    """The reader's place in one recorder's ring (see the module doc). Not thread-safe: one reader.

    A recorder whose ring holds raw entries (``_ring``, turned into records by ``flight.Record(entry)``
    when read) is followed by its entries, which stay the same objects while in the ring; one that keeps
    :class:`~ringlet.flight.Record` objects, by its ``records``."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder
        self._raw = getattr(recorder, "_ring", None)
        self._view = flight.Record if self._raw is not None else None
        self._last = None  # the last entry taken
        self._last_index = -1  # its index among all entries ever appended

    def _copy(self) -> tuple[list, int]:
        rec = self.recorder
        for _ in range(8):
            try:
                items = list(self._raw) if self._raw is not None else list(rec.records)
            except RuntimeError:  # mutated while copied (free-threaded builds): try again
                continue
            return items, rec.appended
        raise RuntimeError("the flight recorder's ring kept changing while it was read")

    def take(self) -> Take:
        items, appended = self._copy()
        j = _find(items, self._last)
        if j is None:  # first take, or the last entry taken has left the ring
            first = max(appended - len(items), 0)  # index of items[0]
            dropped = max(first - (self._last_index + 1), 0)
            start = 0
        else:
            first, dropped, start = self._last_index - j, 0, j + 1
        tail = items[start:]
        recs = tail if self._view is None else [self._view(e) for e in tail]
        n = 0
        while n < len(recs) and recs[n].state not in _UNFINISHED:
            n += 1
        if n:
            self._last = tail[n - 1]
            self._last_index = first + start + n - 1
        elif j is None and items and dropped:
            # nothing finished to take, but the ring moved past the last one: remember where it starts
            self._last_index = first - 1
        pending = [r.m_enqueue for r in recs[n:] if r.state in _UNFINISHED]
        return Take(recs[:n], dropped, len(pending), min(pending) if pending else None)


def _find(recs: list, rec) -> int | None:
    """The position of ``rec`` itself in ``recs`` (by identity, whatever ``==`` says), None if absent."""
    if rec is None:
        return None
    for i in range(len(recs) - 1, -1, -1):
        if recs[i] is rec:
            return i
    return None


@dataclass
class OpTotals:
    """Cumulative counts of one (op, algorithm): collectives done, bytes, seconds from start to end."""

    count: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class Totals:
    """Running totals over every :class:`Take` added (see the module doc)."""

    ops: dict = field(default_factory=dict)  # (op, algorithm) -> OpTotals
    errors: dict = field(default_factory=dict)  # (op, error type) -> count
    hist: dict = field(default_factory=dict)  # op -> [bucket counts (len(BUCKETS) + 1), sum, count]
    dropped: int = 0
    pending: int = 0
    oldest_enqueue: float | None = None

    def add(self, take: Take) -> None:
        self.dropped += take.dropped
        self.pending, self.oldest_enqueue = take.pending, take.oldest_enqueue
        ops, hist, errors = self.ops, self.hist, self.errors
        for r in take.records:
            kind = r.kind
            if r.state != "done":
                key = (kind, r.error_type or "error")
                errors[key] = errors.get(key, 0) + 1
                continue
            seconds = (r.m_end - r.m_start) if r.m_start is not None and r.m_end is not None else 0.0
            key = (kind, r.algorithm or "default")  # ops with one algorithm name none
            t = ops.get(key)
            if t is None:
                t = ops[key] = OpTotals()
            t.count += 1
            t.seconds += seconds
            if r.dtype is not None:
                t.bytes += math.prod(r.shape) * r.dtype.itemsize
            h = hist.get(kind)
            if h is None:
                h = hist[kind] = [[0] * (len(BUCKETS) + 1), 0.0, 0]
            h[0][bisect.bisect_left(BUCKETS, seconds)] += 1
            h[1] += seconds
            h[2] += 1

    def oldest_pending_seconds(self, now: float | None = None) -> float:
        """Seconds the oldest collective still queued or running has waited (0 when none is)."""
        if self.oldest_enqueue is None:
            return 0.0
        return max((time.monotonic() if now is None else now) - self.oldest_enqueue, 0.0)


def cumulative(counts: list[int], bounds: tuple = BUCKETS) -> list[tuple[str, int]]:
    """Prometheus histogram buckets (``le`` label, cumulative count) from per-bucket counts (one per bound
    in ``bounds``, then the overflow)."""
    out, acc = [], 0
    for le, c in zip(bounds, counts):
        acc += c
        out.append((_le(le), acc))
    out.append(("+Inf", acc + counts[-1]))
    return out


def _le(v: float) -> str:
    return repr(float(v))
