"""Step times and exposed communication, folded from :data:`ringlet.steps.CLOCK` when scraped.

A step's time is the interval between two consecutive step marks; the exposed communication is the
time the front ends report waiting on their reductions (:func:`ringlet.steps.waited`). Both are
cumulative (a histogram of step seconds, a counter of waiting seconds); :attr:`StepTotals.share` is the
exposed share of the steps completed since the previous fold (kept when none completed).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["STEP_BUCKETS", "StepTotals"]

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 600.0)


@dataclass
class StepTotals:
    """Cumulative step counts and times of one :class:`ringlet.steps.StepClock`."""

    steps: int = 0  # step marks seen
    buckets: list = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    seconds: float = 0.0  # sum of step times (between consecutive marks)
    timed: int = 0  # step times measured (marks after the first)
    wait_seconds: float = 0.0
    switches: dict = field(default_factory=dict)
    share: float = 0.0  # exposed share of the steps since the previous fold
    lost: int = 0  # marks the clock no longer held when read (more than its KEEP between two folds)
    _last_mark: float | None = None
    _wait_at_fold: float = 0.0

    def fold(self, clock) -> None:
        """Add what ``clock`` recorded since the previous fold."""
        count, marks, wait_seconds, switches = clock.read()
        new = count - self.steps
        if new <= 0:
            self._take_wait(wait_seconds, 0.0)
            self.switches = switches
            return
        held = marks[-new:] if new <= len(marks) else marks
        if new > len(marks):
            self.lost += new - len(marks)
            self._last_mark = None  # the interval across the lost marks is not a step
        prev, window = self._last_mark, 0.0
        for t in held:
            if prev is not None:
                dt = max(t - prev, 0.0)
                self.buckets[bisect.bisect_left(STEP_BUCKETS, dt)] += 1
                self.seconds += dt
                self.timed += 1
                window += dt
            prev = t
        self._last_mark = prev
        self.steps = count
        self.switches = switches
        self._take_wait(wait_seconds, window)

    def _take_wait(self, wait_seconds: float, window: float) -> None:
        self.wait_seconds = wait_seconds
        if window > 0:  # waits between folds without a finished step count toward the next step window
            self.share = min(max((wait_seconds - self._wait_at_fold) / window, 0.0), 1.0)
            self._wait_at_fold = wait_seconds
