"""The cost model the runtime holds: a :class:`~ringlet.tuning.network.Network` plus the cached
signatures of every all-reduce algorithm, answering "which algorithm and segment size is fastest for
this message" in microseconds.

Re-exported as :class:`ringlet.tuning.select.Model`; a :class:`ringlet.tuning.select.Selector` holding
one is what the runtime hands the engine. Deterministic: predictions are plain IEEE arithmetic summed
in a fixed order, and ties (within a relative ``1e-9``) go to the earlier algorithm of
:data:`PREFERENCE` and the earlier segment size of :data:`SEGMENTS`, so ranks given the same constants
choose the same.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..algorithms import ALLREDUCE, AUTO
from .cost import AllreduceCost, Prediction
from .network import Network, Topology
from .signature import Stack

__all__ = ["Choice", "Ranked", "Model", "SEGMENTS", "PREFERENCE", "segments_up_to"]

# Segment sizes tried, in order of preference on a tie: unsegmented, then 16 MiB down to 64 KiB.
SEGMENTS: tuple[int | None, ...] = (None,) + tuple((16 << 20) >> i for i in range(9))

# Algorithms in order of preference on a tie (algorithms not named here follow, sorted).
PREFERENCE = ("ring", "hierarchical", "halving_doubling", "recursive_doubling", "tree", "direct", "torus")
TIE = 1e-9
RESOLUTION = 0.02  # predictions closer than this (relative) are a tie, decided by preference


def segments_up_to(cap: int | None) -> tuple[int | None, ...]:
    """:data:`SEGMENTS` that a transport whose ``max_segment_bytes`` is ``cap`` runs as asked (None: all):
    the executor cuts larger ones down to ``cap``, so ``cap`` itself takes their place."""
    if not cap:
        return SEGMENTS
    return (cap,) + tuple(s for s in SEGMENTS if s is not None and s < cap)


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True, slots=True)
class Choice:
    """What an all-reduce runs: ``algorithm`` and the executor's ``segment_bytes`` (None: the channel's
    own; a value at least the message's size: unsegmented)."""

    algorithm: str
    segment_bytes: int | None = None

    def describe(self) -> str:
        return self.algorithm if self.segment_bytes is None else f"{self.algorithm} @ {_size(self.segment_bytes)}"


@dataclass(frozen=True, slots=True)
class Ranked:
    """A choice and its predicted seconds."""

    seconds: float
    choice: Choice


class Model:
    """Cost-model selection over ``network`` (see the module doc).

    ``segments``: segment sizes tried (None = unsegmented), in order of preference; ``max_fanout``: an
    algorithm in which one rank sends more transfers than this in one step is not chosen by ``"auto"``
    (forcing the name still works). None: no limit when the network prices message endpoints
    (``epsilon > 0``: a rank's concurrent messages are charged one after another), else 2 (without that
    price the timing model charges them nothing and flatters such schedules). ``resolution``: predicted
    times within this relative difference of the fastest count as equal, and the earlier algorithm in
    :data:`PREFERENCE` is chosen (each at its best segment size): the model is not more accurate than a
    few percent, so a smaller predicted gain is no reason to leave the ring.
    ``cache``: decisions kept (least recently used dropped).
    Thread-safe. ``ValueError`` for bad arguments."""

    def __init__(self, network: Network, *, segments: Sequence[int | None] = SEGMENTS, max_fanout: int | None = None,
                 resolution: float = RESOLUTION, cache: int = 4096):
        if not isinstance(network, Network):
            raise ValueError(f"a Model needs a Network, got {type(network).__name__}")
        if not segments or any(s is not None and (not isinstance(s, int) or s < 1) for s in segments):
            raise ValueError(f"segments must be positive byte counts or None, got {segments!r}")
        if (max_fanout is not None and max_fanout < 1) or cache < 1:
            raise ValueError(f"need max_fanout >= 1 and cache >= 1, got {max_fanout} and {cache}")
        if not 0 <= resolution < 1:
            raise ValueError(f"resolution must be in [0, 1), got {resolution}")
        self.resolution = max(float(resolution), TIE)
        self._network = network
        self.segments = tuple(segments)
        self._seg = np.array([math.inf if s is None else float(s) for s in self.segments])
        self.max_fanout = max_fanout
        self._cache_size = cache
        self._costs: dict[tuple[str, tuple[int, ...]], AllreduceCost] = {}
        self._stacks: dict[tuple, tuple[Stack, int]] = {}
        self._decisions: OrderedDict = OrderedDict()
        self._lock = threading.RLock()

    @property
    def network(self) -> Network:
        return self._network

    @property
    def fanout_limit(self) -> float:
        """The most transfers one rank may send in one step of an algorithm ``"auto"`` chooses."""
        if self.max_fanout is not None:
            return self.max_fanout
        return math.inf if self._network.epsilon > 0 else 2

    def set_network(self, network: Network) -> None:
        """Replace the constants (e.g. corrected while training runs); earlier decisions are dropped."""
        if not isinstance(network, Network):
            raise ValueError(f"a Model needs a Network, got {type(network).__name__}")
        with self._lock:
            self._network = network
            self._decisions.clear()

    def cost(self, algorithm: str, host_of: Sequence[int]) -> AllreduceCost:
        """The (cached) cost of ``algorithm`` on hosts ``host_of``."""
        key = (algorithm, tuple(host_of))
        with self._lock:
            c = self._costs.get(key)
            if c is None:
                c = self._costs[key] = AllreduceCost(algorithm, Topology(key[1]))
            return c

    def algorithms(self, host_of: Sequence[int]) -> tuple[str, ...]:
        """The algorithms ``"auto"`` considers on ``host_of``, in order of preference."""
        names = [a for a in PREFERENCE if a in ALLREDUCE] + sorted(set(ALLREDUCE) - set(PREFERENCE))
        fit = tuple(a for a in names if self.cost(a, host_of).fanout <= self.fanout_limit)
        return fit or tuple(names)

    def _times(self, algorithms: Sequence[str], nbytes: int, host_of, itemsize: int, network: Network | None):
        """Predicted seconds, shape (algorithms, segment sizes)."""
        net = self._network if network is None else network
        key = (tuple(algorithms), tuple(host_of))
        with self._lock:
            stack = self._stacks.get(key)
            if stack is None:
                costs = [self.cost(a, host_of) for a in algorithms]
                sigs = [c.signature for c in costs]
                ok = all(s.steps for s in sigs)
                stack = self._stacks[key] = (Stack(sigs) if ok else None,
                                             max(c.exact_from for c in costs))
        if stack[0] is not None and nbytes // itemsize >= stack[1] and nbytes % itemsize == 0:
            return stack[0].seconds(nbytes // itemsize, net, itemsize, self._seg)
        return np.array([self.cost(a, host_of).seconds(nbytes, net, itemsize, self._seg) for a in algorithms])

    def _choice(self, algorithm: str, k: int, nbytes: int) -> Choice:
        seg = self.segments[k]
        return Choice(algorithm, max(nbytes, 1) if seg is None else seg)

    def ranking(self, nbytes: int, host_of: Sequence[int], itemsize: int = 4,
                network: Network | None = None) -> list[Ranked]:
        """Every ``"auto"`` algorithm at its best segment size, fastest first (ties by preference)."""
        algs = self.algorithms(host_of)
        times = self._times(algs, nbytes, host_of, itemsize, network)
        best = [_first_min(row) for row in times]
        ranked = [Ranked(float(times[i, k]), self._choice(a, k, nbytes)) for i, (a, k) in enumerate(zip(algs, best))]
        order = sorted(range(len(ranked)), key=lambda i: (_bucket(ranked[i].seconds, ranked, self.resolution), i))
        return [ranked[i] for i in order]

    def best(self, nbytes: int, host_of: Sequence[int], itemsize: int = 4, algorithm: str = AUTO,
             network: Network | None = None) -> Ranked:
        """The fastest choice for ``nbytes`` (uncached): among ``"auto"``'s algorithms, or the best
        segment size for a given ``algorithm``; with ``network`` instead of the model's constants."""
        if algorithm != AUTO:
            times = self._times((algorithm,), nbytes, host_of, itemsize, network)[0]
            k = _first_min(times)
            return Ranked(float(times[k]), self._choice(algorithm, k, nbytes))
        algs = self.algorithms(host_of)
        times = self._times(algs, nbytes, host_of, itemsize, network)
        ks = [_first_min(row) for row in times]  # each algorithm at its best segment size
        i = _first_min(np.array([times[j, k] for j, k in enumerate(ks)]), self.resolution)
        return Ranked(float(times[i, ks[i]]), self._choice(algs[i], ks[i], nbytes))

    def choose(self, nbytes: int, host_of: Sequence[int], itemsize: int = 4, algorithm: str = AUTO) -> Choice:
        """:meth:`best`'s choice under the model's constants, from a decision cache (microseconds)."""
        key = (algorithm, nbytes, itemsize, tuple(host_of))
        with self._lock:
            hit = self._decisions.get(key)
            if hit is not None:
                self._decisions.move_to_end(key)
                return hit
            choice = self.best(nbytes, key[3], itemsize, algorithm).choice
            self._decisions[key] = choice
            if len(self._decisions) > self._cache_size:
                self._decisions.popitem(last=False)
            return choice

    def seconds(self, choice: Choice, nbytes: int, host_of: Sequence[int], itemsize: int = 4,
                network: Network | None = None) -> float:
        """Predicted seconds of ``choice`` for ``nbytes`` (the model's constants unless ``network``)."""
        seg = math.inf if choice.segment_bytes is None else float(choice.segment_bytes)
        net = self._network if network is None else network
        return float(self.cost(choice.algorithm, host_of).seconds(nbytes, net, itemsize, np.array([seg]))[0])

    def predict(self, choice: Choice, nbytes: int, host_of: Sequence[int], itemsize: int = 4,
                network: Network | None = None) -> Prediction:
        """The full :class:`~ringlet.tuning.cost.Prediction` of ``choice`` (its terms too)."""
        net = self._network if network is None else network
        return self.cost(choice.algorithm, host_of).predict(nbytes, net, itemsize, choice.segment_bytes)

    def top_algorithms(self, sizes: Sequence[int], host_of: Sequence[int], itemsize: int = 4,
                       count: int = 2, network: Network | None = None) -> tuple[str, ...]:
        """The ``count`` algorithms of least total predicted time over messages of ``sizes`` bytes, each
        at its best segment size per message, leaving out an algorithm that ``"auto"`` would pick for
        every message anyway (it adds nothing beside ``"auto"``). For trials, which measure what the
        model cannot see: ``max_fanout`` does not apply, but on more than 8 ranks an algorithm in which
        a rank sends to every other rank at once is left out. ``network``: predict with these constants
        instead of the model's (what ``"auto"`` picks stays the model's)."""
        if not sizes:
            return ()
        names = [a for a in PREFERENCE if a in ALLREDUCE] + sorted(set(ALLREDUCE) - set(PREFERENCE))
        algs = tuple(a for a in names if len(host_of) <= 8 or self.cost(a, host_of).fanout < len(host_of) - 1)
        total = np.zeros(len(algs))
        for nbytes in sizes:
            total += self._times(algs, nbytes, host_of, itemsize, network).min(axis=1)
        autos = {self.choose(nbytes, host_of, itemsize).algorithm for nbytes in sizes}
        order = sorted(range(len(algs)), key=lambda i: (float(total[i]), i))
        return tuple(algs[i] for i in order if {algs[i]} != autos)[:count]


def _first_min(values: np.ndarray, tie: float = TIE) -> int:
    """Index of the first value within a relative ``tie`` of the minimum."""
    return int(np.flatnonzero(values <= values.min() * (1 + tie))[0])


def _bucket(seconds: float, ranked: list[Ranked], tie: float = TIE) -> float:
    """Seconds, with values within a relative ``tie`` of a smaller one counted as equal to it."""
    for r in sorted(ranked, key=lambda r: r.seconds):
        if seconds <= r.seconds * (1 + tie):
            return r.seconds
    return seconds
