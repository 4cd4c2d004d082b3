"""How much of the DDP's communication ran while the next forward computed, from a timeline
(:mod:`ringlet.timeline`): the measure of :class:`~ringlet.torch.training.priority.Priority` with
:meth:`~ringlet.torch.training.ddp.DistributedDataParallel.overlap_optimizer`.

Per rank, over the steps after the first ``skip`` step marks:

* comm — union of the ``COMMUNICATE`` spans (a piece or bucket on the wire);
* forward — union of the ``FORWARD`` spans less the ``WAIT`` spans inside them (a forward pre-hook
  waiting for its layer's pieces is not computing);
* hidden behind the forward — comm ∩ forward; behind the backward — comm ∩ ``BACKWARD`` spans;
* exposed — comm hidden behind neither;
* waits — union of the ``WAIT`` spans: what the forwards spent waiting for averages.

``share_forward`` = hidden behind the forward / comm: the share of communication time that overlapped
the next forward. ``ringlet report`` counts a forward's waits as compute; this does not.
"""
from __future__ import annotations

from dataclasses import dataclass

from ringlet.timeline import STEP_EVENT, Intervals, intersect, measure, read_events, union

__all__ = ["ForwardOverlap", "forward_overlap", "subtract"]


@dataclass(frozen=True, slots=True)
class ForwardOverlap:
    """Totals in microseconds over ``steps`` steps of rank ``rank`` (see the module doc)."""

    rank: int
    steps: int
    comm_us: float
    forward_us: float
    wait_us: float
    hidden_forward_us: float
    hidden_backward_us: float
    exposed_us: float

    @property
    def share_forward(self) -> float:
        """Share of communication time that overlapped a forward's computation (0..1)."""
        return self.hidden_forward_us / self.comm_us if self.comm_us > 0 else 0.0

    @property
    def share_backward(self) -> float:
        """Share of communication time that overlapped a backward (0..1)."""
        return self.hidden_backward_us / self.comm_us if self.comm_us > 0 else 0.0

    def per_step(self, us: float) -> float:
        """``us`` as milliseconds per step."""
        return us / 1000.0 / self.steps if self.steps else 0.0


def _spans(events: list[dict], rank: int, start: float) -> dict[str, Intervals]:
    out: dict[str, Intervals] = {"COMMUNICATE": [], "FORWARD": [], "BACKWARD": [], "WAIT": []}
    for e in events:
        if e.get("pid") == rank and e.get("ph") == "X" and e.get("name") in out:
            a = float(e["ts"])
            b = a + float(e.get("dur", 0.0))
            if b > start:
                out[e["name"]].append((max(a, start), b))
    return {k: union(v) for k, v in out.items()}


def forward_overlap(path: str, rank: int = 0, skip: int = 1) -> ForwardOverlap:
    """The numbers of the module doc for ``rank`` in the timeline at ``path``, leaving out what precedes
    its ``skip``-th step mark (warm-up). ``ValueError`` when the rank has fewer than ``skip + 1`` marks."""
    events = read_events(path)
    marks = sorted(float(e["ts"]) for e in events
                   if e.get("pid") == rank and e.get("name") == STEP_EVENT and e.get("ph") in ("i", "I"))
    if len(marks) <= skip:
        raise ValueError(f"{path}: rank {rank} has {len(marks)} step marks; need more than skip={skip}")
    s = _spans(events, rank, marks[skip] if skip > 0 else float("-inf"))
    comm = s["COMMUNICATE"]
    busy = subtract(s["FORWARD"], s["WAIT"])
    hidden_any = measure(intersect(union(busy + s["BACKWARD"]), comm))
    total = measure(comm)
    return ForwardOverlap(rank, len(marks) - skip, total, measure(busy), measure(s["WAIT"]),
                          measure(intersect(busy, comm)), measure(intersect(s["BACKWARD"], comm)), total - hidden_any)


def subtract(xs: Intervals, ys: Intervals) -> Intervals:
    """``xs`` less ``ys`` (both sorted and disjoint)."""
    out: Intervals = []
    j = 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > a:
                out.append((a, ys[k][0]))
            a = max(a, ys[k][1])
            k += 1
        if b > a:
            out.append((a, b))
    return out
