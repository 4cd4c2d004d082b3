"""Choosing between algorithms while training runs, by timing the steps they are used in.

An isolated benchmark can rank algorithms wrongly for training: there, communication shares the CPU
(and, in the cluster emulation or a container, a CPU quota) with the backward pass, and an algorithm
with fewer dependent steps can finish sooner even if it is slower alone. Measured on 4 emulated hosts
with 0.5 CPU and 1 Gbit/s each (``benchmarks/allreduce_under_load.py``): on idle hosts a 10 MB
``direct`` all-reduce takes 1.05x the ring's time, beside a busy compute thread 0.8-0.9x. Inside real
training steps the two came out within a few percent of each other, in either order
(``benchmarks/results/e_train_4x1_1gbit_s2/ab_algorithms.txt``, ``.../e_train_4x1_1gbit_s3``), so a
challenger replaces the first candidate (the static choice) only when it is faster by more than
``margin``: a choice made on noise would otherwise flip from run to run.

:class:`OnlineChoice` is the bookkeeping only: after ``warmup`` steps it hands out the candidates in
turn (ABAB..., so drift in machine load hits all of them alike) for ``trials`` steps each, collects one
wall time per step, and, once every candidate has its trials, proposes per-candidate medians that the
caller sums over ranks (one small all-reduce) before :meth:`decide` picks the smallest (keeping the
first candidate unless another beats it by more than ``margin``). Every rank therefore makes the same
choice from the same numbers.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decision:
    """What was chosen, and the per-candidate step times (seconds, summed over ranks) it was chosen on."""

    choice: str
    times: dict[str, float]


class OnlineChoice:
    """Round-robin trials of ``candidates``, one per step, then a fixed choice.

    Protocol per step: :meth:`current` names the candidate to use; :meth:`record` gives that step's wall
    time. When :attr:`ready` turns true, call :meth:`medians`, reduce them (sum over ranks) and pass the
    result to :meth:`decide`. A single candidate is decided from the start.
    """

    __slots__ = ("candidates", "warmup", "trials", "margin", "_steps", "_times", "decision")

    def __init__(self, candidates: list[str] | tuple[str, ...], warmup: int = 2, trials: int = 3,
                 margin: float = 0.0):
        if not candidates:
            raise ValueError("OnlineChoice needs at least one candidate.")
        if warmup < 0 or trials < 1:
            raise ValueError(f"need warmup >= 0 and trials >= 1, got {warmup} and {trials}")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        self.candidates = tuple(dict.fromkeys(candidates))
        self.warmup = warmup
        self.trials = trials
        self._steps = 0
        self._times: dict[str, list[float]] = {c: [] for c in self.candidates}
        self.decision: Decision | None = None
        if len(self.candidates) == 1:
            self.decision = Decision(self.candidates[0], {})

    def current(self) -> str:
        """The candidate the next recorded step must use."""
        if self.decision is not None:
            return self.decision.choice
        k = self._steps - self.warmup
        return self.candidates[0] if k < 0 else self.candidates[k % len(self.candidates)]

    def record(self, seconds: float) -> None:
        """Wall time of a step that used :meth:`current`."""
        if self.decision is not None:
            return
        if self._steps >= self.warmup and not self.ready:
            self._times[self.current()].append(float(seconds))
        self._steps += 1

    def remove(self, candidate: str) -> None:
        """Withdraw ``candidate`` before any trial was timed (it turned out not to apply); with one
        candidate left, that one is the decision."""
        if self.decision is not None or candidate not in self.candidates:
            return
        if any(self._times.values()):
            raise RuntimeError("candidates can only be withdrawn before the trials start")
        self.candidates = tuple(c for c in self.candidates if c != candidate)
        del self._times[candidate]
        if len(self.candidates) == 1:
            self.decision = Decision(self.candidates[0], {})

    @property
    def ready(self) -> bool:
        """Every candidate has its trials; a decision is due."""
        return self.decision is None and all(len(t) >= self.trials for t in self._times.values())

    def medians(self) -> list[float]:
        """Per-candidate median step time, in :attr:`candidates` order (to be summed over ranks)."""
        return [statistics.median(self._times[c]) for c in self.candidates]

    def decide(self, summed: list[float]) -> Decision:
        """Fix the choice: the candidate with the smallest (rank-summed) median, except that the first
        candidate stays unless the best is faster than it by more than ``margin`` (a fraction of its
        time); ties go to the earlier candidate."""
        if len(summed) != len(self.candidates):
            raise ValueError(f"expected {len(self.candidates)} times, got {len(summed)}")
        best = min(range(len(summed)), key=lambda i: (summed[i], i))
        if summed[best] >= summed[0] * (1.0 - self.margin):
            best = 0
        self.decision = Decision(self.candidates[best], dict(zip(self.candidates, map(float, summed))))
        return self.decision
