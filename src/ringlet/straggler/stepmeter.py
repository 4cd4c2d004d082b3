"""Each rank's step meter: per training step, its compute time and its time blocked in collectives,
kept as trimmed means over the last steps; and its large sends' per-peer timing over the last
heartbeats. What :meth:`StepMeter.summary` returns is what the rank publishes (:mod:`.share`)."""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Iterator

from .. import steps as step_clock
from ..transport.base import LinkCounter
from .options import StragglerOptions

#: Heartbeats of link timing a summary covers.
LINK_BEATS = 10
#: Steps a meter keeps at most (its time window is cut there).
MAX_STEPS = 4096
#: The share of a window's steps left out at each end of its trimmed means.
TRIM = 0.2


def trimmed_mean(xs) -> float:
    """The mean of ``xs`` without its lowest and highest :data:`TRIM` share (one slow step of ten, or a
    CPU quota's throttled steps at one end, moves nothing)."""
    xs = sorted(xs)
    cut = int(len(xs) * TRIM)
    kept = xs[cut:len(xs) - cut]
    return sum(kept) / len(kept)


class StepMeter:
    """The moments one rank's training front end reports, turned into per-step numbers.

    A step runs from :meth:`begin_step` (or the previous :meth:`end_step`: the time between steps —
    the optimizer, the data loader — belongs to the next one) to :meth:`end_step`. Its *compute* time
    is from its start until :meth:`grads_ready` (this rank's gradients are all produced), less the
    time blocked in collectives before that; its *wait* is all the time :meth:`waiting` blocks
    recorded in the step (collectives this rank waited for after its gradients were ready, and
    any before). A step ended without :meth:`grads_ready` counts as ready at its end; a
    :meth:`grads_ready` or :meth:`end_step` with no step open (the very first one) is dropped.

    Called from the training thread; :meth:`summary` and :meth:`mark_links` from the liveness thread.
    ``clock``: the seconds it reads (tests give their own)."""

    def __init__(self, options: StragglerOptions, links: LinkCounter | None = None, clock=time.perf_counter):
        self.options = options
        self._clock = clock  # seconds, monotonic
        self.links = links
        self.steps = 0
        self._lock = threading.Lock()
        self._window: collections.deque = collections.deque(maxlen=MAX_STEPS)  # (end, compute, wait, step)
        self._marks: collections.deque = collections.deque(maxlen=LINK_BEATS + 1)
        self._start: float | None = None
        self._ready: float | None = None
        self._wait = self._wait_before = 0.0
        self.detector = None  # the rank's Detector once its monitor task runs (.share)
        # Ranks compare their compute with the ranks of the same cohort only: "" (the whole job) unless a
        # front end whose ranks do different work says otherwise (a pipeline: its stage).
        self.cohort = ""

    # ---- the front ends' calls -------------------------------------------------------------
    def begin_step(self) -> None:
        """A training step starts now, unless one is already open."""
        if self._start is None:
            self._start = self._clock()
            self._ready, self._wait, self._wait_before = None, 0.0, 0.0

    def grads_ready(self) -> None:
        """This rank's gradients of the open step are all produced (the first call of a step counts)."""
        if self._start is not None and self._ready is None:
            self._ready = self._clock()

    def add_wait(self, seconds: float) -> None:
        """``seconds`` spent blocked in collectives in the open step (also told to the process's step
        tally, :mod:`ringlet.steps`, which the metrics read)."""
        step_clock.waited(seconds)
        self._wait += seconds
        if self._ready is None:
            self._wait_before += seconds

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the body's time as blocked in collectives."""
        t0 = self._clock()
        try:
            yield
        finally:
            self.add_wait(self._clock() - t0)

    def end_step(self) -> None:
        """Close the open step (recording it, and marking it in :mod:`ringlet.steps`) and open the next
        one now."""
        step_clock.mark()
        now = self._clock()
        if self._start is not None:
            ready = self._ready if self._ready is not None else now
            compute = max(0.0, ready - self._start - self._wait_before)
            with self._lock:
                self._window.append((now, compute, self._wait, now - self._start))
                self.steps += 1
        self._start, self._ready, self._wait, self._wait_before = now, None, 0.0, 0.0

    # ---- what is shared ----------------------------------------------------------------------
    def mark_links(self) -> None:
        """Take this heartbeat's snapshot of the link counter (the summary covers the last ones); none
        before the first step has ended, so the set-up's collectives (the model's broadcast, which waits
        for the last rank to start) are not counted."""
        if self.links is not None and self.steps:
            self._marks.append(self.links.snapshot())

    def _recent(self) -> list[tuple]:
        """The window: the last ``options.window`` steps, or every step ended in the last
        ``options.window_s`` seconds when those are more."""
        with self._lock:
            steps = list(self._window)
        since = self._clock() - self.options.window_s
        recent = [x for x in steps if x[0] >= since]
        return recent if len(recent) > self.options.window else steps[-self.options.window:]

    def summary(self) -> dict:
        """``n``: steps so far; ``k``: steps in the window (:meth:`_recent`); ``g``: the cohort (absent for
        the whole job); ``c``, ``w``, ``s``: the window's trimmed mean compute, wait and step seconds
        (:func:`trimmed_mean`; absent with no step); ``l``: per peer, the large sends of the last
        heartbeats as [bytes, seconds from post to the end of their waits, seconds blocked in them]."""
        window = self._recent()
        out: dict = {"n": self.steps, "k": len(window)}
        if self.cohort:
            out["g"] = self.cohort
        if window:
            for key, i in (("c", 1), ("w", 2), ("s", 3)):
                out[key] = trimmed_mean(x[i] for x in window)
        if len(self._marks) >= 2:
            first, last = self._marks[0], self._marks[-1]
            links = {}
            for peer, (b, e, bl, _n) in last.items():
                b0, e0, bl0, _ = first.get(peer, (0, 0.0, 0.0, 0))
                if b > b0:
                    links[str(peer)] = [b - b0, round(e - e0, 6), round(bl - bl0, 6)]
            out["l"] = links
        return out

    def scores(self) -> dict[int, float]:
        """Each rank's straggler score as this rank's detector last saw it (:meth:`Detector.scores`:
        how much slower than the others, 0 for none); empty before the first check."""
        det = self.detector
        return dict(det.scores) if det is not None else {}


class NullMeter:
    """The meter where straggler detection is off (``RINGLET_STRAGGLER=0``, or a one-rank job): nothing is
    kept or shared; steps and waits still reach the process's step tally (:mod:`ringlet.steps`, which
    the metrics read)."""

    steps = 0
    links = None
    detector = None
    cohort = ""

    def begin_step(self) -> None:
        return None

    def grads_ready(self) -> None:
        return None

    def add_wait(self, seconds: float) -> None:
        step_clock.waited(seconds)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            step_clock.waited(time.perf_counter() - t0)

    def end_step(self) -> None:
        step_clock.mark()

    def summary(self) -> dict:
        return {"n": 0, "k": 0}

    def scores(self) -> dict[int, float]:
        return {}
