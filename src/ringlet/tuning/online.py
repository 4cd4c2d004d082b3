"""Choosing between algorithms while training runs, by timing the steps they are used in.

An isolated benchmark can rank algorithms wrongly for training: there, communication shares the CPU
(and, in the cluster emulation or a container, a CPU quota) with the backward pass, and an algorithm
with fewer dependent steps can finish sooner even if it is slower alone. Measured on 4 emulated hosts
with 0.5 CPU and 1 Gbit/s each (``benchmarks/allreduce_cluster/allreduce_under_load.py``): on idle
hosts a 10 MB ``direct`` all-reduce takes 1.05x the ring's time, beside a busy compute thread
0.8-0.9x. Inside real training steps the two came out within a few percent of each other, in either
order, so a challenger replaces the first candidate (the static choice) only when it is faster by more than
``margin``: a choice made on noise would otherwise flip from run to run.

:class:`OnlineChoice` is the bookkeeping only: after ``warmup`` steps it hands out the candidates in
turn (ABAB..., so drift in machine load hits all of them alike) for ``trials`` steps each, collects one
wall time per step, and, once every candidate has its trials, proposes per-candidate medians that the
caller sums over ranks (one small all-reduce) before :meth:`decide` picks the smallest (keeping the
first candidate unless another beats it by more than ``margin``). Every rank therefore makes the same
choice from the same numbers.

Five steps per candidate are not always enough: on the emulated cluster, step times spread by ±10% from
CPU-quota periods, and at a batch size where sufficient factors save 10-13% of the step the tuner kept
the dense reduction in 1 of 6 runs and in 3 of 3 short runs (``benchmarks/training_ddp/``). So
:meth:`stats` also gives each candidate's spread (the median absolute deviation, scaled to a standard
deviation), and :meth:`decide` asks for
``trials`` more steps each, up to ``max_trials``, while the best candidate's median is within two
standard errors of the line it must cross (the first candidate's time less the margin): the trials
stop as soon as the numbers separate, and cost steps only where the candidates are close.
"""
from __future__ import annotations

import math
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

    __slots__ = ("candidates", "warmup", "trials", "max_trials", "margin", "_target", "_steps", "_times",
                 "decision")

    def __init__(self, candidates: list[str] | tuple[str, ...], warmup: int = 2, trials: int = 3,
                 margin: float = 0.0, max_trials: int | None = None):
        if not candidates:
            raise ValueError("OnlineChoice needs at least one candidate.")
        if warmup < 0 or trials < 1:
            raise ValueError(f"need warmup >= 0 and trials >= 1, got {warmup} and {trials}")
        max_trials = trials if max_trials is None else max_trials
        if max_trials < trials:
            raise ValueError(f"max_trials ({max_trials}) must be at least trials ({trials})")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        self.candidates = tuple(dict.fromkeys(candidates))
        self.warmup = warmup
        self.trials = trials
        self.max_trials = max_trials
        self._target = trials  # steps per candidate before the next decision is due
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
        return self.decision is None and all(len(t) >= self._target for t in self._times.values())

    @property
    def trials_done(self) -> int:
        """Timed steps per candidate so far (the fewest of any candidate)."""
        return min(len(t) for t in self._times.values())

    def medians(self) -> list[float]:
        """Per-candidate median step time, in :attr:`candidates` order (to be summed over ranks)."""
        return [statistics.median(self._times[c]) for c in self.candidates]

    def stats(self) -> list[float]:
        """Per-candidate medians, then per-candidate spreads (1.4826 × the median absolute deviation: a
        standard deviation that one slow step does not inflate), in :attr:`candidates` order: the numbers
        to sum over ranks and pass to :meth:`decide`."""
        medians = self.medians()
        spreads = [1.4826 * statistics.median(abs(x - m) for x in self._times[c])
                   for c, m in zip(self.candidates, medians)]
        return medians + spreads

    def decide(self, summed: list[float]) -> Decision | None:
        """Fix the choice, or ask for more trials (returns None; :attr:`ready` turns false until every
        candidate has ``trials`` more steps).

        ``summed``: :meth:`medians` or :meth:`stats`, summed over ranks. The choice is the candidate with
        the smallest median, except that the first candidate stays unless the best is faster than it by
        more than ``margin`` (a fraction of its time); ties go to the earlier candidate. With spreads
        and fewer than ``max_trials`` steps per candidate, the decision waits while the best median lies
        within two standard errors of that line (standard error of a median: 1.2533 σ/√n; ranks step in
        lockstep, so rank-summed spreads are those of the rank-summed medians)."""
        k = len(self.candidates)
        if len(summed) not in (k, 2 * k):
            raise ValueError(f"expected {k} or {2 * k} numbers, got {len(summed)}")
        medians = [float(x) for x in summed[:k]]
        best = min(range(k), key=lambda i: (medians[i], i))
        line = medians[0] * (1.0 - self.margin)
        if len(summed) == 2 * k and best != 0 and self.trials_done < self.max_trials:
            def se(i: int) -> float:
                return 1.2533 * float(summed[k + i]) / math.sqrt(len(self._times[self.candidates[i]]))

            if abs(medians[best] - line) < 2.0 * math.hypot(se(0), se(best)):
                self._target = min(self._target + self.trials, self.max_trials)
                return None
        if medians[best] >= line:
            best = 0
        self.decision = Decision(self.candidates[best], dict(zip(self.candidates, medians)))
        return self.decision
