"""The cost model: predicted time of any schedule on a modelled network, read off the schedule itself.

Inputs: a :class:`~ringlet.algorithms.schedule.Schedule` (through ``Schedule.step_arrays``), a
:class:`~ringlet.tuning.network.Topology` (which link every transfer crosses) and a
:class:`~ringlet.tuning.network.Network` (α, β per link class, γ). Nothing is specific to an
algorithm, so a new builder in :data:`ringlet.algorithms.ALLREDUCE` gets a cost without new code.

Timing model (``docs/cost_model.md``). A transfer of ``b`` bytes over link class ``c`` is cut into
``k = ceil(b/S)`` segments (``S`` = ``segment_bytes``; None: one segment). ``m`` = the most transfers
of its step on a link it crosses. One segment takes ``α_c + (b/k)·m·β_c``, plus ``(b/k)·r·γ`` for a
reducing transfer whose receiver takes ``r`` reducing transfers in the step (one CPU reduces them in
turn). ``τ_s`` = step ``s``'s slowest segment. The schedule takes

    Σ_s τ_s + Σ_G max_r Σ_{s∈G} (k_{r,s} − 1)·u_{r,s}

the first segment through every step (step-synchronously), then per *stage* ``G`` the remaining
segments on its busiest *resource* ``r``. A stage ends where the executor holds a step's sends until
the step before is done (:mod:`ringlet.algorithms.hold`): the pipeline drains there. Resources:
every link (``u`` = ``α_c + m·(b/k)·β_c`` of its largest transfer in step ``s``) and every rank's
reduction (``u`` = its reducing receives × ``(b/k)·γ``). With one segment per transfer
this is ``Σ_s`` (step time), the α-β-γ textbook formulas. Where every step uses other links (a chain
of dependent steps) it is ``Σ_s τ_s + (k−1)·max_s τ_s``; where steps reuse a link (a ring: every step
on the same links) segmentation cannot beat the link's total load and only hides the reduction.

:class:`~ringlet.tuning.signature.Signature` holds a schedule as a few deduplicated rows;
:class:`AllreduceCost` keeps one per (algorithm, topology), built once, and predicts any size with a
few numpy operations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..algorithms import ALLREDUCE
from ..algorithms.schedule import Schedule
from .network import Network, Topology
from .signature import TERMS, Signature

__all__ = ["Prediction", "Signature", "AllreduceCost", "predict", "predict_allreduce", "TERMS"]

EXACT_MESSAGES = 200_000  # below this many transfers, small counts use the real schedule


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one collective. ``seconds`` = ``terms["alpha"] + terms["beta"] + terms["gamma"] +
    terms["op"] + terms["check"]`` (``op``: the network's per-call cost; ``check``: its metadata
    agreement, counted when the call is checked);
    ``terms["alpha.inter"]`` etc. split each part by link class (of the transfers that set the time).
    ``steps``: dependent steps; ``segment_bytes``: as asked (None: unsegmented); ``messages``: transfers
    before segmentation; ``segments``: segments of the largest transfer."""

    seconds: float
    steps: int
    segment_bytes: int | None
    terms: dict
    messages: int = 0
    segments: int = 1


def _check(itemsize: int, segment_bytes: int | None) -> None:
    if not (isinstance(itemsize, (int, np.integer)) and itemsize >= 1):
        raise ValueError(f"itemsize must be a positive integer, got {itemsize!r}")
    if segment_bytes is not None and not segment_bytes >= 1:
        raise ValueError(f"segment_bytes must be >= 1 or None, got {segment_bytes!r}")


def predict(schedule: Schedule, topology: Topology, network: Network, *, itemsize: int = 4,
            segment_bytes: int | None = None, checked: bool = False) -> Prediction:
    """Predicted time of ``schedule`` (any collective's) on ``topology`` with ``network``'s constants.
    ``itemsize``: bytes per element; ``segment_bytes``: the executor's pipeline granularity (None: each
    transfer in one piece); ``checked``: the call agrees on its metadata first (adds ``network.check``).
    ``ValueError`` when the schedule's rank count differs from the topology's, or for a non-positive
    ``itemsize``/``segment_bytes``."""
    _check(itemsize, segment_bytes)
    return _predict(Signature.of(schedule, topology), 1, network, itemsize, segment_bytes, checked)


def _predict(sig: Signature, n: int, network: Network, itemsize: int, segment_bytes: int | None,
             checked: bool = False) -> Prediction:
    seg = math.inf if segment_bytes is None else float(segment_bytes)
    check = network.check if checked and sig.nranks > 1 else 0.0
    seconds = float(sig.seconds(n, network, itemsize, np.array([seg]))[0]) + check
    terms, segments = sig.terms(n, network, itemsize, seg)
    terms["check"] = check
    return Prediction(seconds, sig.steps if n > 0 else 0, segment_bytes, terms, sig.messages if n > 0 else 0,
                      segments)


def _builder(algorithm: str):
    try:
        return ALLREDUCE[algorithm]
    except KeyError:
        raise ValueError(f"no schedule for all-reduce algorithm {algorithm!r}; known: {sorted(ALLREDUCE)}") from None


def _elements(nbytes: int, itemsize: int) -> int:
    if nbytes < 0 or nbytes % itemsize:
        raise ValueError(f"nbytes must be a non-negative multiple of itemsize {itemsize}, got {nbytes}")
    return nbytes // itemsize


def predict_allreduce(algorithm: str, nbytes: int, topology: Topology, network: Network, *, itemsize: int = 4,
                      segment_bytes: int | None = None, checked: bool = False) -> Prediction:
    """Predicted time of ``algorithm`` (a name in :data:`ringlet.algorithms.ALLREDUCE`) reducing
    ``nbytes`` bytes, from its real schedule. ``ValueError`` for an unknown name or ``nbytes`` not a
    multiple of ``itemsize``. ``checked``: as in :func:`predict`. Selection uses :class:`AllreduceCost`
    instead (no schedule per size)."""
    _check(itemsize, segment_bytes)
    sig = allreduce_signature(algorithm, nbytes, topology, itemsize=itemsize)
    return _predict(sig, 1, network, itemsize, segment_bytes, checked)


def allreduce_signature(algorithm: str, nbytes: int, topology: Topology, *, itemsize: int = 4) -> Signature:
    """The :class:`Signature` of ``algorithm``'s real schedule for ``nbytes``, to evaluate at one element
    count (``sig.seconds(1, network, itemsize, segments)``) under many networks for the price of one
    schedule: what :func:`predict_allreduce` gives, without its terms. Errors as there."""
    n = _elements(nbytes, itemsize)
    return Signature.of(_builder(algorithm)(topology.size, n, tuple(topology.host_of)), topology)


def reference_count(topology: Topology) -> int:
    """An element count at which the built-in all-reduce schedules split evenly (every block of every
    level the same size), so that their signatures hold exact fractions."""
    p = topology.size
    rows: dict[int, int] = {}
    for h in topology.host_of:
        rows[h] = rows.get(h, 0) + 1
    pp = 1 << (p.bit_length() - 1)
    return math.lcm(p, 2 * pp, len(rows) * min(rows.values())) * 64


class AllreduceCost:
    """The cost of one all-reduce algorithm on one topology, at any size, without a schedule per size.

    Holds the :class:`Signature` of the schedule at :func:`reference_count`. Counts below its
    ``exact_below`` (where blocks can be empty) use the real schedule when it has at most
    ``EXACT_MESSAGES`` transfers (a few of these are kept); larger schedules use the signature there
    too, which then counts empty blocks as one element (an upper bound). ``ValueError`` for an
    unknown algorithm."""

    _KEEP = 64

    def __init__(self, algorithm: str, topology: Topology):
        self.algorithm = algorithm
        self.topology = topology
        self._build = _builder(algorithm)
        p, host_of = topology.size, tuple(topology.host_of)
        self.signature = Signature.of(self._build(p, reference_count(topology), host_of), topology,
                                      reference_count(topology))
        self._small: dict[int, Signature] = {}

    @property
    def exact_from(self) -> int:
        """From this count on, :meth:`at` evaluates the signature itself."""
        sig = self.signature
        return 0 if sig.messages > EXACT_MESSAGES else sig.exact_below

    def at(self, n: int) -> tuple[Signature, int]:
        """The signature to evaluate for ``n`` elements, and the count to evaluate it at."""
        sig = self.signature
        if n >= sig.exact_below or sig.messages > EXACT_MESSAGES:
            return sig, n
        exact = self._small.get(n)
        if exact is None:
            if len(self._small) >= self._KEEP:
                self._small.pop(next(iter(self._small)))
            exact = Signature.of(self._build(self.topology.size, n, tuple(self.topology.host_of)), self.topology)
            self._small[n] = exact
        return exact, 1

    def seconds(self, nbytes: int, network: Network, itemsize: int, segments: np.ndarray) -> np.ndarray:
        """Predicted seconds for ``nbytes`` per segment size in ``segments`` (see :meth:`Signature.seconds`)."""
        sig, n = self.at(_elements(nbytes, itemsize))
        return sig.seconds(n, network, itemsize, segments)

    def predict(self, nbytes: int, network: Network, itemsize: int = 4,
                segment_bytes: int | None = None) -> Prediction:
        _check(itemsize, segment_bytes)
        sig, n = self.at(_elements(nbytes, itemsize))
        return _predict(sig, n, network, itemsize, segment_bytes)

    @property
    def fanout(self) -> int:
        return self.signature.fanout
