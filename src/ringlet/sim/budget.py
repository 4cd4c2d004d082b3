"""The time budget of a sweep: which rows to replay and which to hand to the cost model.

Before replaying, every algorithm's schedule is built once at the sweep's largest size (the probe):
its build time, step count and transfer count give an upper bound for a row of that algorithm,

    estimate = build + passes · (arrays + PER_STEP · steps + PER_TRANSFER · transfers)

(``arrays``: the probe's time to read all steps as arrays; ``passes``: replays per row, two for
``--segment auto``). The constants are this machine's order of magnitude; the estimate is then scaled
by what the rows replayed so far actually took against their estimates. A row is replayed only while
the time spent plus its scaled estimate stays within the budget.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..tuning.network import Topology
from .collectives import Collective

PER_STEP = 50e-6  # seconds of numpy overhead per replayed step
PER_TRANSFER = 0.15e-6  # seconds per transfer in a step's arrays


@dataclass(frozen=True, slots=True)
class Probe:
    """An algorithm's schedule at the sweep's largest size: ``steps``, ``transfers``, and the seconds it
    took to ``build`` and to read as arrays (``arrays``)."""

    algorithm: str
    steps: int
    transfers: int
    build: float
    arrays: float

    def estimate(self, passes: int = 1) -> float:
        """Seconds one row of this algorithm should take to replay, at most (see the module doc)."""
        return self.build + passes * (self.arrays + PER_STEP * self.steps + PER_TRANSFER * self.transfers)


def probe(coll: Collective, algorithm: str, count: int, topology: Topology,
          clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Build ``algorithm``'s schedule for ``count`` elements on ``topology`` and measure it."""
    t0 = clock()
    schedule = coll.build(algorithm, topology.size, count, topology.host_of)
    t1 = clock()
    transfers = sum(len(schedule.step_arrays(s)) for s in range(schedule.num_steps))
    t2 = clock()
    return Probe(algorithm, schedule.num_steps, transfers, t1 - t0, t2 - t1)


@dataclass
class Budget:
    """``seconds`` for the whole sweep, counted from creation on ``clock``. ``ValueError`` when negative."""

    seconds: float
    clock: Callable[[], float] = time.perf_counter
    start: float = field(init=False, default=0.0)
    _estimated: float = field(init=False, default=0.0)
    _actual: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"the time budget must be >= 0 seconds, got {self.seconds}")
        self.start = self.clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    @property
    def scale(self) -> float:
        """Actual over estimated seconds of the rows replayed so far (1 before any)."""
        return self._actual / self._estimated if self._estimated > 0 and self._actual > 0 else 1.0

    def fits(self, estimate: float) -> bool:
        """Whether a row estimated at ``estimate`` seconds can still be replayed within the budget."""
        return self.elapsed + estimate * self.scale <= self.seconds

    def record(self, estimate: float, actual: float) -> None:
        """A replayed row took ``actual`` seconds against ``estimate``."""
        self._estimated += estimate
        self._actual += actual
