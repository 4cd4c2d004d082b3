"""Choosing a training front end's reduction while it trains, by timing its steps.

:class:`TrialPlan` says which candidates go on trial: the configured all-reduce algorithm, beside
``"auto"`` the cost model's best other algorithms for the buckets in use when a model is given (else
``"direct"`` on 3-8 ranks), and each of those ``+factors`` where some layers may be reduced from
sufficient factors. :class:`StepTuner` times the steps (the wall time from one step's
start to the next, counted only for steps that reduced something), hands the candidates out in turn
(:class:`~ringlet.tuning.online.OnlineChoice`: five trial steps each, up to twenty while the medians are
too close to call, a challenger must be faster by more than 3%), and when a decision is due sums the
per-candidate statistics over the ranks with the caller's collective, so every rank decides the same.

Framework-free: the caller gives the collective (``sum_across_ranks``) and applies the choice.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .online import Decision, OnlineChoice

if TYPE_CHECKING:
    from .model import Model
    from .network import Network

__all__ = ["TrialPlan", "StepTuner", "FACTORS"]

FACTORS = "+factors"  # suffix of the candidates that reduce the chosen layers from factors


def _same(algorithm: str) -> str:
    return algorithm


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """What may go on trial. ``algorithm``: the configured all-reduce algorithm; ``size``: ranks in the
    group; ``timing``: steps may be timed at all (tuning on, and the algorithm not picked by a
    coordinator); ``factors``: layers may be reduced from factors if that is faster; ``resolve``: what an
    algorithm name means where it runs (``"auto"`` unless an environment variable forces one)."""

    algorithm: str
    size: int
    timing: bool
    factors: bool
    resolve: Callable[[str], str] = _same
    model: "Model | None" = None
    buckets: tuple[int, ...] = ()
    host_of: tuple[int, ...] = ()
    itemsize: int = 4
    alternatives: int = 2
    network: "Network | None" = None
    native: bool = False

    def candidates(self) -> tuple[str, ...]:
        """The candidates, the static choice first. With a cost ``model`` (and the ``buckets``' sizes in
        bytes, the group's ``host_of`` and the gradients' ``itemsize``), ``"auto"`` is tried against the
        ``alternatives`` algorithms of least predicted time over those buckets
        (:meth:`~ringlet.tuning.model.Model.top_algorithms`): the trial settles what the model cannot
        see, such as computation competing with communication (``network``: the constants to rank the
        alternatives with, instead of the model's). Without one, ``direct`` (it sends
        p(p-1) messages per step) is tried on small groups only. ``native``: the backend's own all-reduce
        can take every bucket; it then goes first, as the incumbent that ringlet's schedules must beat by
        the trial's margin: its compiled loops cost less CPU than the schedules where ranks are starved of
        it, and trials that cannot tell the two apart keep it (benchmarks/training_ddp). An explicit or
        forced algorithm is the user's choice."""
        base: tuple[str, ...] = (self.algorithm,)
        if self.timing and self.algorithm == "auto" and self.resolve(self.algorithm) == "auto":
            if self.model is not None and self.buckets:
                host_of = self.host_of or (0,) * self.size
                base += self.model.top_algorithms(self.buckets, host_of, self.itemsize, self.alternatives,
                                                  self.network)
            elif 3 <= self.size <= 8:
                base = ("auto", "direct")
            if self.native:
                base = ("native",) + base
        if self.timing and self.factors:
            base += (base[0] + FACTORS,)
        return base


class StepTuner:
    """Step timing and the choice between ``candidates`` (see the module doc).

    Per step: :meth:`step_started` at its start, :meth:`mark_reduced` when it launches a reduction;
    :attr:`algorithm` and :meth:`wants_factors` say what the step uses. ``sum_across_ranks`` must sum a
    list of floats over every rank of the group (all ranks call it at the same step); ``clock``: seconds.
    """

    __slots__ = ("choice", "_sum", "_clock", "_t_step", "_reduced")

    def __init__(self, candidates: tuple[str, ...], sum_across_ranks: Callable[[list[float]], list[float]],
                 clock: Callable[[], float] = time.perf_counter):
        self.choice = OnlineChoice(candidates, trials=5, margin=0.03, max_trials=20)
        self._sum = sum_across_ranks
        self._clock = clock
        self._t_step: float | None = None  # clock at the start of the current step
        self._reduced = False

    def step_started(self) -> Decision | None:
        """A step starts: time the previous one (if it reduced); returns the decision when one was
        made now (every rank at the same step), else None."""
        now = self._clock()
        decision = None
        if self._t_step is not None and self._reduced:
            self.choice.record(now - self._t_step)
            if self.choice.ready:
                # Summed over ranks so that every rank picks from the same numbers (a rank choosing
                # differently would run a different schedule than its peers).
                decision = self.choice.decide(self._sum(self.choice.stats()))
        self._t_step = now
        self._reduced = False
        return decision

    def mark_reduced(self) -> None:
        """The current step launched a reduction (only such steps are timed)."""
        self._reduced = True

    @property
    def algorithm(self) -> str:
        """The all-reduce algorithm of the candidate in use."""
        return self.choice.current().split("+")[0]

    @property
    def factors_on_trial(self) -> bool:
        return any(c.endswith(FACTORS) for c in self.choice.candidates)

    def wants_factors(self) -> bool:
        """Whether the current step reduces the chosen layers from factors: the candidate on trial while
        factors are compared with the dense reduction, afterwards the choice; always without a comparison."""
        return self.choice.current().endswith(FACTORS) if self.factors_on_trial else True

    def drop_factors(self) -> None:
        """No layer turned out worth factoring: withdraw the ``+factors`` candidates (before any trial)."""
        for c in self.choice.candidates:
            if c.endswith(FACTORS):
                self.choice.remove(c)

    @staticmethod
    def rejects_factors(decision: Decision) -> bool:
        """Whether ``decision`` put factors on trial and chose the dense reduction."""
        return any(c.endswith(FACTORS) for c in decision.times) and not decision.choice.endswith(FACTORS)

    @staticmethod
    def per_rank_ms(decision: Decision, size: int) -> dict[str, float]:
        """The decision's rank-summed median step times as per-rank milliseconds (for reports)."""
        return {k: round(v / size * 1000, 2) for k, v in decision.times.items()}
