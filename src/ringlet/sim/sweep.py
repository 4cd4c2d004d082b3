"""A sweep: every (size, algorithm) of one collective on one topology and network, within a time budget.

Rows are replayed cheapest algorithm first (:mod:`.budget`); rows that would not fit the budget are
predicted by the cost model instead and marked ``source="model"``, and one notice says so. Results come
back sorted by size, then algorithm in the order asked.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..tuning.network import Network, Topology
from .api import predicted, simulate
from .budget import Budget, Probe, probe
from .collectives import collective
from .model import CostModel, ModelUnavailable
from .result import MODEL, SimResult
from .segments import WHOLE, Auto, SegmentPolicy
from .sizes import fmt_size


@dataclass(frozen=True)
class SweepOptions:
    """What to simulate: ``algorithms`` (canonical or alias names) of ``collective`` at ``sizes`` (bytes)
    on ``topology`` with ``network``; ``segments`` the pipelining policy; ``budget`` seconds for the
    whole sweep; ``itemsize`` bytes per element."""

    topology: Topology
    network: Network
    algorithms: tuple[str, ...]
    sizes: tuple[int, ...]
    collective: str = "allreduce"
    segments: SegmentPolicy = WHOLE
    budget: float = 60.0
    itemsize: int = 4


@dataclass
class SweepResult:
    rows: list[SimResult]
    notices: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def modelled(self) -> list[SimResult]:
        return [r for r in self.rows if r.source == MODEL]


Progress = Callable[[SimResult], None]


def _check(opts: SweepOptions) -> None:
    if not opts.sizes:
        raise ValueError("no sizes to simulate")
    bad = [n for n in opts.sizes if n < 0 or n % opts.itemsize]
    if bad:
        raise ValueError(f"sizes must be non-negative multiples of the item size {opts.itemsize}, got {bad[:3]}")
    if not opts.algorithms:
        raise ValueError("no algorithms to simulate")


def run_sweep(opts: SweepOptions, progress: Progress | None = None,
              clock: Callable[[], float] = time.perf_counter) -> SweepResult:
    """Simulate every row of ``opts``; ``progress`` is called with each replayed row. ``ValueError`` for an
    unknown collective or algorithm, no sizes, sizes that are not whole elements, or no algorithms. Rows
    beyond the budget come from the cost model; without one they are replayed anyway, and a notice says so."""
    _check(opts)
    coll = collective(opts.collective)
    names = tuple(dict.fromkeys(coll.resolve(a) for a in opts.algorithms))
    budget = Budget(opts.budget, clock)
    passes = 2 if isinstance(opts.segments, Auto) else 1
    count = max(opts.sizes) // opts.itemsize
    probes = {a: probe(coll, a, count, opts.topology, clock) for a in names}
    order = sorted(names, key=lambda a: probes[a].estimate(passes))
    done: dict[tuple[int, str], SimResult] = {}
    deferred: list[tuple[int, str]] = []
    for a in order:
        for size in opts.sizes:
            est = probes[a].estimate(passes)
            if not budget.fits(est):
                deferred.append((size, a))
                continue
            t0 = clock()
            done[size, a] = simulate(coll, a, size, opts.topology, opts.network, opts.segments,
                                     itemsize=opts.itemsize)
            budget.record(est, clock() - t0)
            if progress:
                progress(done[size, a])
    notices = _fallback(opts, deferred, done, probes, passes)
    rows = [done[size, a] for size in opts.sizes for a in names]
    return SweepResult(rows, notices, budget.elapsed)


def _fallback(opts: SweepOptions, deferred: list[tuple[int, str]], done: dict[tuple[int, str], SimResult],
              probes: dict[str, Probe], passes: int) -> list[str]:
    """Fill the deferred rows from the cost model (or, without one, by replay) and say so in one line."""
    if not deferred:
        return []
    coll = collective(opts.collective)
    algos = ", ".join(dict.fromkeys(a for _, a in deferred))
    est = sum(probes[a].estimate(passes) for _, a in deferred)
    try:
        model = CostModel(opts.topology, opts.network, opts.itemsize)
        for size, a in deferred:
            done[size, a] = predicted(coll, a, size, opts.topology, opts.network, opts.segments,
                                      itemsize=opts.itemsize, model=model)
    except ModelUnavailable as exc:
        for size, a in deferred:
            done[size, a] = simulate(coll, a, size, opts.topology, opts.network, opts.segments,
                                     itemsize=opts.itemsize)
        return [f"notice: {len(deferred)} rows ({algos}) exceed the {opts.budget:g} s budget, but {exc}; "
                "replayed them anyway"]
    sizes = sorted({s for s, _ in deferred})
    return [f"notice: {len(deferred)} of {len(opts.sizes) * len(probes)} rows ({algos}; {fmt_size(sizes[0])} to "
            f"{fmt_size(sizes[-1])}) did not fit the {opts.budget:g} s budget (replaying them: ~{est:.2g} s more); "
            "predicted by the cost model (source 'model')"]
