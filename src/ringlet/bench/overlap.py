"""How much communication hid behind compute, step by step (the engine of ``ringlet report trace.json``).

Reads a timeline (:mod:`ringlet.timeline`) and cuts it into steps at the ``"step"`` instants of
:func:`ringlet.timeline.mark_step`. Per step:

* compute  — union of the ``BACKWARD`` and ``FORWARD`` spans,
* comm     — union of the ``COMMUNICATE`` spans (overlapping collectives count once),
* hidden   — the measure of compute ∩ comm: communication that ran while compute ran,
* exposed  — comm − hidden, also given as a share of the step's wall time.

Spans are clipped to their step's window. Spans after the last mark form a final step that ends with the
last of them (a trace marked at the start of every forward has its last iteration there). A stretch
between marks without any of these spans is not a training step (the timeline was paused, see
:func:`ringlet.timeline.paused`, or the script did something else) and is left out. The summary averages
the steps after the first (warm-up). :func:`analyze` returns the same numbers as a dataclass.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..timeline import STEP_EVENT, Intervals, intersect, measure, read_events, union

COMPUTE_PHASES = frozenset({"BACKWARD", "FORWARD"})
COMM_PHASES = frozenset({"COMMUNICATE"})


@dataclass(frozen=True, slots=True)
class Times:
    """Compute, communication and overlap in microseconds; ``exposed_share`` = exposed / step (0..1)."""

    step_us: float
    compute_us: float
    comm_us: float
    hidden_us: float
    exposed_us: float
    exposed_share: float


@dataclass(frozen=True, slots=True)
class StepStats(Times):
    """One step, starting at ``start_us``."""

    index: int = 0
    start_us: float = 0.0


@dataclass(frozen=True, slots=True)
class Summary(Times):
    """Means over ``steps`` summarised steps; ``hidden_fraction`` = hidden / comm (of the totals, 0..1)."""

    steps: int = 0
    hidden_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class Report:
    path: str
    rank: int
    steps: tuple[StepStats, ...]
    summary: Summary


def _clip(intervals: Intervals, lo: float, hi: float) -> Intervals:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def step_stats(index: int, lo: float, hi: float, compute: Intervals, comm: Intervals) -> StepStats:
    """Numbers of the step ``[lo, hi)`` from (possibly overlapping) compute and comm spans."""
    cu, mu = union(_clip(compute, lo, hi)), union(_clip(comm, lo, hi))
    c, m = measure(cu), measure(mu)
    hidden = measure(intersect(cu, mu))
    wall = hi - lo
    exposed = m - hidden
    return StepStats(wall, c, m, hidden, exposed, exposed / wall if wall > 0 else 0.0, index=index, start_us=lo)


def summarize(steps: tuple[StepStats, ...] | list[StepStats], skip: int = 1) -> Summary:
    """Means over ``steps[skip:]`` (all of them if fewer remain than one)."""
    use = list(steps[skip:]) or list(steps)
    n = len(use)
    if n == 0:
        return Summary(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    tot = {k: sum(getattr(s, k) for s in use) for k in ("step_us", "compute_us", "comm_us", "hidden_us",
                                                        "exposed_us")}
    return Summary(tot["step_us"] / n, tot["compute_us"] / n, tot["comm_us"] / n, tot["hidden_us"] / n,
                   tot["exposed_us"] / n, tot["exposed_us"] / tot["step_us"] if tot["step_us"] > 0 else 0.0,
                   steps=n, hidden_fraction=tot["hidden_us"] / tot["comm_us"] if tot["comm_us"] > 0 else 0.0)


def analyze(path: str, rank: int | None = None, skip: int = 1) -> Report:
    """Per-step compute / communication / overlap of the timeline at ``path``.

    ``rank``: whose events to use in a trace with several (default: the lowest rank with step marks,
    else the lowest rank; ``ValueError`` when that rank has no events).
    A trace without step marks is one step spanning all its events.
    """
    events = read_events(path)
    pids = sorted({e["pid"] for e in events if "pid" in e and e.get("ph") in ("X", "i", "I")})
    marked = sorted({e["pid"] for e in events if e.get("name") == STEP_EVENT and e.get("ph") in ("i", "I")})
    if rank is None:
        rank = marked[0] if marked else (pids[0] if pids else 0)
    elif rank not in pids:
        raise ValueError(f"{path}: no events of rank {rank} (ranks present: {pids})")
    compute: Intervals = []
    comm: Intervals = []
    marks: list[float] = []
    for e in events:
        if e.get("pid") != rank:
            continue
        ph = e.get("ph")
        if ph == "X":
            iv = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            if e.get("name") in COMPUTE_PHASES:
                compute.append(iv)
            elif e.get("name") in COMM_PHASES:
                comm.append(iv)
        elif ph in ("i", "I") and e.get("name") == STEP_EVENT:
            marks.append(float(e["ts"]))
    marks.sort()
    last_end = max((b for _, b in compute + comm), default=None)
    first_start = min((a for a, _ in compute + comm), default=None)
    bounds = list(marks)
    if not bounds and first_start is not None:
        bounds = [first_start]
    if bounds and last_end is not None and last_end > bounds[-1]:
        bounds.append(last_end)
    windows = [(lo, hi) for lo, hi in zip(bounds, bounds[1:])
               if _clip(compute, lo, hi) or _clip(comm, lo, hi)]
    steps = tuple(step_stats(i, lo, hi, compute, comm) for i, (lo, hi) in enumerate(windows))
    return Report(path, rank, steps, summarize(steps, skip))
