"""Pipeline schedules as explicit action lists per stage, and a check that they cannot deadlock.

A schedule gives each stage the order in which it runs the forward and the backward of every
micro-batch. What travels is implied by the action (the runner, :mod:`.stage`, does it):

* ``forward(i)`` on a stage after the first waits for micro-batch ``i``'s input from the stage before
  (its receive was posted one forward ahead); on a stage before the last it then posts, in this order,
  the receive of the output's gradient and the send of the output: the fused send-forward /
  receive-backward, so the gradient's receive exists before anything downstream can produce it;
* ``backward(i)`` on a stage before the last waits for the gradient of micro-batch ``i``'s output; on a
  stage after the first, the gradient of its input is sent from a hook the moment autograd computes it.

Sends are waited for only where their buffer is needed again or when the step ends, so the only waits
that block are receives: a stage blocks only on a message its neighbour produces by an action that
precedes it in the neighbour's own list. :func:`simulate` runs every stage's list against those data
dependencies and raises when some stage could wait forever; it also gives each stage's peak number of
micro-batches whose activations are held (forwarded, not yet backwarded).

* :func:`gpipe`: every forward, then every backward (micro-batch order): ``M`` held at once, bubble
  ``(S-1)/(M+S-1)``.
* :func:`one_f_one_b`: stage ``s`` runs ``min(S-s-1, M)`` warm-up forwards, then alternates one forward
  and one backward, then drains the backwards: the same bubble, at most ``S - s`` held at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Action", "FORWARD", "BACKWARD", "gpipe", "one_f_one_b", "SCHEDULES", "simulate", "bubble_fraction"]

FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True, slots=True)
class Action:
    """Run the ``op`` (:data:`FORWARD` or :data:`BACKWARD`) of micro-batch ``microbatch``."""

    op: str
    microbatch: int

    def __repr__(self) -> str:
        return f"{self.op[0].upper()}{self.microbatch}"


def gpipe(stage: int, stages: int, microbatches: int) -> tuple[Action, ...]:
    """All forwards, then all backwards, in micro-batch order."""
    m = range(microbatches)
    return tuple(Action(FORWARD, i) for i in m) + tuple(Action(BACKWARD, i) for i in m)


def one_f_one_b(stage: int, stages: int, microbatches: int) -> tuple[Action, ...]:
    """Warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    warm = min(stages - stage - 1, microbatches)
    out = [Action(FORWARD, i) for i in range(warm)]
    for i in range(microbatches - warm):
        out += [Action(FORWARD, warm + i), Action(BACKWARD, i)]
    out += [Action(BACKWARD, i) for i in range(microbatches - warm, microbatches)]
    return tuple(out)


SCHEDULES: dict[str, Callable[[int, int, int], tuple[Action, ...]]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def _ready(a: Action, s: int, stages: int, done: list[set]) -> bool:
    """Whether the message ``a`` waits for on stage ``s`` was produced by a neighbour (and, for a
    backward, whether this stage ran the forward)."""
    if a.op == FORWARD:
        return s == 0 or Action(FORWARD, a.microbatch) in done[s - 1]
    own = Action(FORWARD, a.microbatch) in done[s]
    return own and (s == stages - 1 or Action(BACKWARD, a.microbatch) in done[s + 1])


def simulate(schedule: Callable[[int, int, int], tuple[Action, ...]], stages: int,
             microbatches: int) -> list[int]:
    """Run ``schedule``'s lists of every stage against the data dependencies (module doc), one ready action
    per stage per round; return each stage's peak of held micro-batches. ``ValueError`` when a list does
    not run each forward and backward once, or when no stage can move (a deadlock)."""
    lists = [schedule(s, stages, microbatches) for s in range(stages)]
    want = sorted([(op, i) for op in (FORWARD, BACKWARD) for i in range(microbatches)])
    for s, acts in enumerate(lists):
        if sorted((a.op, a.microbatch) for a in acts) != want:
            raise ValueError(f"stage {s}'s list {list(acts)} does not run every forward and backward once.")
    pos, done = [0] * stages, [set() for _ in range(stages)]
    held, peak = [0] * stages, [0] * stages
    while any(pos[s] < len(lists[s]) for s in range(stages)):
        moved = [s for s in range(stages) if pos[s] < len(lists[s]) and _ready(lists[s][pos[s]], s, stages, done)]
        if not moved:
            stuck = {s: lists[s][pos[s]] for s in range(stages) if pos[s] < len(lists[s])}
            raise ValueError(f"schedule deadlocks: stages wait at {stuck}")
        for s in moved:
            a = lists[s][pos[s]]
            done[s].add(a)
            pos[s] += 1
            held[s] += 1 if a.op == FORWARD else -1
            peak[s] = max(peak[s], held[s])
    return peak


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share of a step with equal forward and backward times per stage: ``(S-1)/(M+S-1)``."""
    return (stages - 1) / (microbatches + stages - 1)
