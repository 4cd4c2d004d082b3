"""Training steps as the front ends see them: a process-wide tally that costs a few hundred nanoseconds
per step and that readers (:mod:`ringlet.metrics`) fold when they are asked.

The training front ends report their steps to their step meter (:mod:`ringlet.straggler`), which passes
them on here: :func:`mark` once per step, and :func:`waited` with the seconds the training thread spent
blocked in collectives (DDP's wait for every bucket, ``DistributedOptimizer.synchronize``, ZeRO's
gathers and end of backward): communication not hidden behind compute, the *exposed* communication.
:func:`switched` counts the changes the tuners make while training runs (an all-reduce algorithm chosen
or re-chosen, a bucket size, a model's re-trial).

A script with its own training loop may call :func:`mark` itself. Nothing here imports the rest of
ringlet; every function is thread-safe.
"""
from __future__ import annotations

import collections
import threading
import time

__all__ = ["StepClock", "CLOCK", "mark", "waited", "switched"]

KEEP = 4096  # step boundaries kept for readers that fold less often than every 4096 steps


class StepClock:
    """Step boundaries (``time.monotonic`` seconds; the last :data:`KEEP`), how many there were
    (``count``), the seconds spent waiting on reductions (``wait_seconds``) and the tuners' switches by
    kind (``switches``)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.count = 0
        self.marks: collections.deque = collections.deque(maxlen=keep)
        self.wait_seconds = 0.0
        self.switches: dict[str, int] = {}
        self._lock = threading.Lock()

    def mark(self, now: float | None = None) -> None:
        """A step begins (or the last one ended) at ``now`` (default: the monotonic clock now)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            self.marks.append(t)
            self.count += 1

    def waited(self, seconds: float) -> None:
        """The training thread waited ``seconds`` for communication it could not hide."""
        if seconds > 0:
            with self._lock:
                self.wait_seconds += seconds

    def switched(self, kind: str) -> None:
        """A tuner switched ``kind`` (``"algorithm"``, ``"bucket_bytes"``, ``"trial"``, ...)."""
        with self._lock:
            self.switches[kind] = self.switches.get(kind, 0) + 1

    def read(self) -> tuple[int, list[float], float, dict[str, int]]:
        """``(count, marks, wait_seconds, switches)`` as one consistent copy."""
        with self._lock:
            return self.count, list(self.marks), self.wait_seconds, dict(self.switches)


CLOCK = StepClock()


def mark(now: float | None = None) -> None:
    """:meth:`StepClock.mark` on the process's clock."""
    CLOCK.mark(now)


def waited(seconds: float) -> None:
    """:meth:`StepClock.waited` on the process's clock."""
    CLOCK.waited(seconds)


def switched(kind: str) -> None:
    """:meth:`StepClock.switched` on the process's clock."""
    CLOCK.switched(kind)
