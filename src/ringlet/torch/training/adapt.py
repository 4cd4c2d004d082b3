"""Dynamic adjustment in :class:`~ringlet.torch.training.ddp.DistributedDataParallel`: the installed cost
model follows the measured all-reduces while training runs (:mod:`ringlet.tuning.adaptive`).

``DistributedDataParallel(module, adapt=Adapt(every=10, policy=Policy(...)))``; the default is
``Adapt()``, ``adapt=None`` turns it off. It applies when a cost model is installed
(the runtime's ``selector.model``: ``ringlet.init`` found a calibration profile), the DDP's
algorithm is ``"auto"`` (not forced by argument or ``RINGLET_ALGORITHM``), its dense buckets are not compressed, and the
group has more than one rank; otherwise it does nothing (:attr:`DistributedDataParallel.adaptive` is None).

Per reduced step, on every rank:

* every dense all-reduce of the gradients (a bucket; a piece with ``priority=``) reports its execution
  span on the communication thread as it completes (what the timeline shows as ``COMMUNICATE``); the
  algorithm and segment size that ran are the installed model's choice for the request
  (:func:`~ringlet.tuning.select.allreduce_choice`), recomputed there: the model changes only at rounds,
  which come after every rank's communication thread has passed the step's all-reduces;
* the backward time (first to last gradient hook) is recorded for bucket size proposals.

A *round* comes every ``every`` reduced steps (at the first forward of a step: the same step on every
rank), once the DDP's step tuner has decided: its trial of ``"auto"`` against the model's best other
algorithms runs first and measures what the model cannot see; the corrector takes over afterwards and
never puts anything on trial. A round sums :meth:`Adaptive.numbers` over the ranks (one small all-reduce)
and applies them; each :class:`~ringlet.tuning.adaptive.Switch` is logged (INFO), marked on the timeline
(instant ``switch`` on track ``tuning``: step, op, old, new, reason) and kept in :attr:`Adjuster.switches`:

* op ``bucketK`` / ``pieceK``: that message's algorithm or segment size changed; the buckets run
  ``"auto"``, which consults the installed model per message, so it takes effect at the next launch;
* op ``bucket_bytes``: the buckets are rebuilt with the new cap at once (the first bucket keeps its cap);
* op ``algorithm``: the step tuner had chosen another algorithm than ``"auto"``; at the model's first
  switch of a message the buckets return to ``"auto"`` (conditions changed since the trial). Also
  reported when a re-trial decides (old: what the buckets ran, new: the trial's choice);
* op ``trial``: the measured all-reduce times moved by more than ``policy.retrial``× against the
  installed model's (:mod:`ringlet.tuning.adaptive`, "Re-trial"): from one algorithm's times the
  corrector cannot tell a slower link from busier processors, so the step tuner puts ``"auto"`` on
  trial again against the best other algorithms if the links had moved
  (:meth:`~ringlet.tuning.adaptive.Adaptive.link_network`), without factors; rounds wait for its
  decision.

With :meth:`~DistributedDataParallel.overlap_optimizer` a round first lands the previous step's
averages, so no measurement and no piece in flight crosses a switch.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ringlet import collectives as _core
from ringlet import steps as step_clock
from ringlet import timeline
from ringlet.algorithms import NATIVE
from ringlet.tuning import select
from ringlet.tuning.adaptive import Adaptive, Policy, Switch

log = logging.getLogger("ringlet.torch.training.ddp")

__all__ = ["Adapt", "Adjuster", "Applied", "adjuster_for", "ddp_policy", "group_hosts", "TRACK"]

TRACK = "tuning"  # timeline track of the switches


def ddp_policy() -> Policy:
    """The default :class:`~ringlet.tuning.adaptive.Policy` of the DDP: :class:`Policy`'s, with a half-life
    of 16 measurements: a step brings one per bucket (or piece), several, and the corrector should average
    over a few steps' noise, not over the last step's buckets; and a re-trial when the measured times move
    by more than 1.4× against the installed model's."""
    return Policy(half_life=16.0, retrial=1.4)


@dataclass(frozen=True, slots=True)
class Adapt:
    """Follow the measured all-reduces with the cost model (see the module doc): a round every ``every``
    reduced steps (a positive int), switching by ``policy`` (:class:`ringlet.tuning.adaptive.Policy`: the
    margin, confirmations, minimum steps between switches, memory in measurements, bucket sizes proposed;
    one bucket size keeps the cap fixed at it; default :func:`ddp_policy`). A lasting change switches
    about ``every * (policy.confirmations + 1)`` steps later, once its measurements outweigh the older
    ones (``policy.half_life``), and not before ``policy.min_steps`` steps after the last switch. ``ValueError`` for ``every`` < 1, ``TypeError`` for another type
    of either."""

    every: int = 10
    policy: Policy = field(default_factory=ddp_policy)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int):
            raise TypeError(f"Adapt: every must be an int, got {type(self.every).__name__}")
        if self.every < 1:
            raise ValueError(f"Adapt: every must be at least 1, got {self.every}")
        if not isinstance(self.policy, Policy):
            raise TypeError(f"Adapt: policy must be a ringlet.tuning.adaptive.Policy, got {type(self.policy).__name__}")


@dataclass(frozen=True, slots=True)
class Applied:
    """A switch made at reduced step ``step``."""

    step: int
    switch: Switch


def group_hosts(comm) -> tuple[int, ...]:
    """The host of each member of ``comm``'s group (what the core queue's algorithm choice sees)."""
    g = comm.group if comm.group is not None else _core.runtime().world
    return tuple(g.host_of)


def adjuster_for(strategy: Adapt | None, comm, algorithm: str, compression, itemsize: int,
                 sum_across_ranks: Callable[[list[float]], list[float]]) -> Adjuster | None:
    """The DDP's :class:`Adjuster`, or None where dynamic adjustment does not apply (see the module doc)."""
    model = _core.runtime().selector.model
    if (strategy is None or model is None or comm.size < 2 or compression is not None
            or _core.resolve_algorithm(algorithm, _core.runtime()) != select.AUTO):
        return None
    caps = select.Capabilities.of(_core.runtime().transport)
    return Adjuster(strategy, model, group_hosts(comm), itemsize, caps, sum_across_ranks)


class Adjuster:
    """One DDP's corrector and its rounds (see the module doc). :meth:`observe` may be called from any
    thread; everything else from the training thread."""

    def __init__(self, strategy: Adapt, model: select.Model, host_of: Sequence[int], itemsize: int,
                 caps: select.Capabilities, sum_across_ranks: Callable[[list[float]], list[float]]):
        self.strategy = strategy
        self.model = model
        self.host_of = tuple(host_of)
        self.itemsize = itemsize
        self.adaptive = Adaptive(model, self.host_of, itemsize=itemsize, policy=strategy.policy)
        self.switches: list[Applied] = []
        self.steps = 0          # reduced steps so far
        self.rounds = 0
        self.released = False   # the step tuner's algorithm gave way to the model
        self._caps = caps
        self._sum = sum_across_ranks
        self._next = strategy.every
        self._inbox: collections.deque = collections.deque()  # (Choice that ran, bytes, seconds)

    # ---- measurements ---------------------------------------------------------------------------------
    def observe(self, algorithm: str, nbytes: int, span: tuple[float, float] | None) -> None:
        """A dense all-reduce of ``nbytes`` requested as ``algorithm`` ran over ``span`` (timeline µs). Called
        on the communication thread as it completes: the installed model is still the one it ran with."""
        if span is not None:
            self._inbox.append((self.ran(algorithm, nbytes), int(nbytes), (span[1] - span[0]) * 1e-6))

    def ran(self, algorithm: str, nbytes: int) -> select.Choice:
        """What a request for ``algorithm`` of ``nbytes`` runs under the installed model now."""
        return select.allreduce_choice(algorithm, len(self.host_of), nbytes, self.host_of, self._caps, self.model,
                                       self.itemsize)

    def backward_done(self, seconds: float) -> None:
        """A reduced step's backward ended after ``seconds`` (counts the step)."""
        self.steps += 1
        self.adaptive.record_backward(seconds)

    def drain(self) -> None:
        """Hand the measurements that arrived to the corrector."""
        while self._inbox:
            choice, nbytes, seconds = self._inbox.popleft()
            if choice.algorithm != NATIVE:
                self.adaptive.record(choice.algorithm, nbytes, seconds, choice.segment_bytes)

    # ---- rounds --------------------------------------------------------------------------------------------
    def due(self, tuner_decided: bool) -> bool:
        """A round is due at this step (identical on every rank)."""
        return tuner_decided and self.steps >= self._next

    def round(self, messages: dict[str, int], gradient_bytes: int, cap_bytes: int, tuner_algorithm: str) -> list[Switch]:
        """Sum the corrector's numbers over the ranks, apply them, report the switches (see the module doc)
        and return them. ``messages``: the dense all-reduces of a step (op key -> bytes); ``gradient_bytes``:
        their gradient bytes; ``cap_bytes``: the bucket cap in use; ``tuner_algorithm``: the step tuner's
        choice. A collective: every rank at the same step."""
        self.drain()
        a = self.adaptive
        a.track(messages)
        if gradient_bytes > 0:
            a.set_gradient(gradient_bytes, cap_bytes)
        events = a.apply(self._sum(a.numbers()), self.steps)
        self.rounds += 1
        self._next = self.steps + self.strategy.every
        if tuner_algorithm != select.AUTO and not self.released and any(e.op in messages for e in events):
            self.released = True
            events.append(Switch("algorithm", tuner_algorithm, select.AUTO,
                                 "the cost model switched; the step tuner's choice was measured before"))
        for e in events:
            self.report(e)
        return events

    def report(self, e: Switch) -> None:
        """Log, mark and keep a switch (a round's, or one made outside a round: a re-trial's decision)."""
        self.switches.append(Applied(self.steps, e))
        step_clock.switched(e.op if e.op in ("bucket_bytes", "trial") else "algorithm")
        log.info("DistributedDataParallel: step %d: %s %s -> %s (%s)", self.steps, e.op, e.old, e.new, e.reason)
        timeline.instant(TRACK, "switch", {"step": self.steps, "op": e.op, "old": e.old, "new": e.new,
                                           "reason": e.reason})
