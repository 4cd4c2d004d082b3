"""Returning memory that has stayed free to the OS, as jemalloc's decay of unused pages does.

``ringlet run`` gives its ranks fixed glibc thresholds (:func:`ringlet.launch.env.allocator_env`) so that
the tensors a training step frees and allocates again keep their pages. glibc then never gives back free
memory inside its heaps by itself: with tensors of varying sizes (a soak, variable-length batches) the
pages a rank has ever touched stay resident, and its resident memory creeps towards the high-water mark
of everything it has done (docs/testing.md, "The soak"). A :class:`HeapDecay` thread gives back what has *stayed* free:

* it samples the heap's free bytes (glibc's ``mallinfo2``) ``SAMPLES`` times per ``interval``;
* at the end of an interval whose smallest sample is at least ``floor`` bytes, memory has been free
  throughout it, and the thread calls ``malloc_trim(0)`` at the next sample that is near that smallest
  one (within a quarter, or 1 MiB): at the moment when the least memory is free, not when a training
  loop has just freed the activations it takes back in its next step.

A loop whose free heap drops below ``floor`` in every interval is never trimmed. One that always keeps
more free, at addresses that change from step to step, pays the page faults of one trim per interval
(what that costs is measured in docs/usage.md).

``RINGLET_MALLOC_DECAY`` sets the interval in seconds (default 10, jemalloc's default decay time; ``0``
switches it off). It is off where glibc's ``malloc_trim`` is missing (another C library or OS) and where a
malloc library is preloaded (``LD_PRELOAD`` naming jemalloc, tcmalloc, mimalloc), which return memory by
their own rules. Where ``mallinfo2`` is missing (glibc before 2.33) every interval ends with a trim.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_INTERVAL = 10.0
FLOOR = 4 << 20  # bytes that must stay free for a whole interval before a trim
SAMPLES = 20  # free-heap samples per interval


def decay_interval(environ=os.environ) -> float:
    """Seconds of the decay interval from ``RINGLET_MALLOC_DECAY`` (default 10); 0 when switched off.
    ``ValueError`` naming the variable for a value that is not a finite number >= 0."""
    raw = environ.get("RINGLET_MALLOC_DECAY", "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"RINGLET_MALLOC_DECAY must be a number of seconds (0: off), got {raw!r}") from None
    if not value >= 0.0 or value == float("inf"):
        raise ValueError(f"RINGLET_MALLOC_DECAY must be a finite number of seconds >= 0, got {raw!r}")
    return value


@functools.lru_cache(maxsize=1)
def _libc():
    """This process's C library when it allocates with glibc's malloc; None otherwise. (The symbols
    already loaded in the process: no library search, which would start a subprocess.)"""
    if not sys.platform.startswith("linux") or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` as a callable, or None where this process does not use glibc's malloc."""
    libc = _libc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@dataclass(frozen=True)
class HeapInfo:
    """glibc's view of this process's heaps (``mallinfo2``): ``used``, bytes in live allocations in the
    arenas; ``free``, free bytes the arenas hold; ``mmapped``, bytes of allocations with their own
    mappings."""

    used: int
    free: int
    mmapped: int


@functools.lru_cache(maxsize=1)
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's ``mallinfo2`` returning its structure, or None where it is missing (glibc before 2.33)."""
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


def heap_info() -> HeapInfo | None:
    """This process's :class:`HeapInfo` now, or None where glibc's ``mallinfo2`` is missing."""
    fn = _mallinfo2()
    if fn is None:
        return None
    mi = fn()
    return HeapInfo(mi.uordblks, mi.fordblks, mi.hblkhd)


def _free_heap() -> Callable[[], int] | None:
    """A callable giving the free bytes of glibc's heaps (``HeapInfo.free``), or None."""
    fn = _mallinfo2()
    return None if fn is None else (lambda: fn().fordblks)


class DecayPolicy:
    """When to trim, from the free-heap samples (pure logic, no clock of its own).

    :meth:`observe` takes each sample's time and free bytes (or None where they cannot be known) and
    says whether to trim now: see the module docstring."""

    def __init__(self, interval: float, floor: int = FLOOR):
        self.interval, self.floor = float(interval), int(floor)
        self._start: float | None = None
        self._low: int | None = None
        self._target: int | None = None  # a trim is due at a sample near this many free bytes
        self._due_until = 0.0

    def observe(self, now: float, free: int | None) -> bool:
        if self._start is None:
            self._start = now
        if self._target is not None:  # a trim is due: at a sample near the interval's low point
            if free is not None and self._near(free, self._target):
                self._target, self._start = None, now
                return True
            if now >= self._due_until:  # none came within an interval: start afresh
                self._target, self._start = None, now
            return False
        if free is not None and (self._low is None or free < self._low):
            self._low = free
        if now - self._start < self.interval:
            return False
        low, self._low, self._start = self._low, None, now
        if free is None:  # nothing is known of the heap: trim once per interval
            return True
        if low is None or low < self.floor:
            return False
        if self._near(free, low):
            return True
        self._target, self._due_until = low, now + self.interval
        return False

    @staticmethod
    def _near(free: int, low: int) -> bool:
        return free <= low + max(low // 4, 1 << 20)


class HeapDecay:
    """A daemon thread that feeds a :class:`DecayPolicy` ``SAMPLES`` times per ``interval`` seconds and
    trims when it says so, until :meth:`stop`. ``trim`` (called with 0) and ``free_bytes`` default to
    glibc's ``malloc_trim`` and ``mallinfo2``; ``trims`` counts the trims."""

    def __init__(self, interval: float, *, trim: Callable[[int], object] | None = None,
                 free_bytes: Callable[[], int | None] | None = None, floor: int = FLOOR):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self._trim = trim if trim is not None else _malloc_trim()
        if self._trim is None:
            raise RuntimeError("malloc_trim is not available in this process")
        self._free = free_bytes if free_bytes is not None else (_free_heap() or (lambda: None))
        self.policy = DecayPolicy(interval, floor)
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ringlet-heap-decay", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        period = self.interval / SAMPLES
        while not self._stop.wait(period):
            if self.policy.observe(time.monotonic(), self._free()):
                self._trim(0)
                self.trims += 1

    def stop(self) -> None:
        """End the thread (returns once it has ended); a second call is a no-op."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def start(interval: float) -> HeapDecay | None:
    """A heap decay with this ``interval`` (see :func:`decay_interval`), started; None when ``interval`` is
    0 or this process does not use glibc's malloc."""
    if interval == 0.0 or _malloc_trim() is None:
        return None
    return HeapDecay(interval)
