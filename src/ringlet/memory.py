"""Returning a rank's free heap to the OS after a while, as jemalloc's decay of unused pages does.

``ringlet run`` gives its ranks fixed glibc thresholds (:func:`ringlet.launch.env.allocator_env`) so that
the tensors a training step frees and allocates again keep their pages. glibc then never gives back
free memory inside its heaps by itself: with tensors of varying sizes the pages a rank has ever touched
stay resident, and its resident memory creeps towards the high-water mark of everything it has done
(the soak in docs/soak.md shows it). A :class:`HeapDecay` calls ``malloc_trim(0)`` every ``interval``
seconds on a background thread: free pages come back to the OS, and a step that needs them again
faults them in once per interval (a few milliseconds for tens of MiB), not every step.

``RINGLET_MALLOC_DECAY`` sets the interval in seconds (default 10, jemalloc's default decay time;
``0`` switches it off). It is off where glibc's ``malloc_trim`` is missing (another C library or OS)
and where a malloc library is preloaded (``LD_PRELOAD`` naming jemalloc, tcmalloc, mimalloc), which
return memory by their own rules.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

DEFAULT_INTERVAL = 10.0


def decay_interval(environ=os.environ) -> float:
    """Seconds between trims from ``RINGLET_MALLOC_DECAY`` (default 10); 0 when switched off.
    ``ValueError`` naming the variable for a value that is not a non-negative number."""
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


def _malloc_trim():
    """glibc's ``malloc_trim`` as a callable, or None where this process does not use glibc's malloc."""
    if not sys.platform.startswith("linux") or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapDecay:
    """A daemon thread that trims glibc's heaps every ``interval`` seconds until :meth:`stop`.

    ``trim``: the function called with 0 (glibc's ``malloc_trim`` by default). ``trims`` counts calls."""

    def __init__(self, interval: float, trim=None):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self._trim = trim if trim is not None else _malloc_trim()
        if self._trim is None:
            raise RuntimeError("malloc_trim is not available in this process")
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ringlet-heap-decay", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._trim(0)
            self.trims += 1

    def stop(self) -> None:
        """End the thread (returns once it has ended); a second call is a no-op."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def start(interval: float) -> HeapDecay | None:
    """A heap decay trimming every ``interval`` seconds (see :func:`decay_interval`), started; None when
    ``interval`` is 0 or this process does not use glibc's malloc."""
    if interval == 0.0 or _malloc_trim() is None:
        return None
    return HeapDecay(interval)
