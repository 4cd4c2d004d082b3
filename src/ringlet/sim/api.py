"""One simulated row: :func:`simulate` replays a collective's schedule; :func:`predicted` asks the cost model.

Both take the collective's size in bytes (nccl-tests' size: see :mod:`.collectives`), a whole number of
elements of ``itemsize`` bytes, and a segment choice (``None``, a byte count, ``"auto"`` or a
:class:`~ringlet.sim.segments.SegmentPolicy`); with several candidate segment sizes the fastest is kept.
"""
from __future__ import annotations

from typing import Callable

from ..tuning.network import Network, Topology
from .collectives import Collective, collective
from .engine import replay
from .model import CostModel
from .result import MODEL, REPLAY, SimResult
from .segments import SegmentPolicy, policy

# evaluate(segment_bytes) -> (seconds, steps, largest transfer in bytes)
_Evaluate = Callable[[int | None], tuple[float, int, int]]


def _fastest(evaluate: _Evaluate, segments: SegmentPolicy, largest_guess: int, network: Network
             ) -> tuple[float, int, int | None]:
    """Evaluate the policy's candidates (asked again once the first evaluation knows the schedule's steps
    and largest transfer) and return the fastest ``(seconds, steps, segment)``."""
    first = segments.candidates(2, largest_guess, network)[0]
    seconds, steps, largest = evaluate(first)
    best = (seconds, steps, first)
    for seg in segments.candidates(steps, largest, network):
        if seg != first:
            sec, st, _ = evaluate(seg)
            if sec < best[0]:
                best = (sec, st, seg)
    return best


def _check(coll: Collective | str, nbytes: int, topology: Topology, itemsize: int) -> Collective:
    coll = collective(coll) if isinstance(coll, str) else coll
    if not isinstance(itemsize, int) or itemsize < 1:
        raise ValueError(f"itemsize must be an integer >= 1, got {itemsize!r}")
    if not isinstance(nbytes, int) or nbytes < 0 or nbytes % itemsize:
        raise ValueError(f"nbytes must be a non-negative multiple of itemsize {itemsize}, got {nbytes!r}")
    if topology.size < 1:
        raise ValueError("the topology has no ranks")
    return coll


def simulate(coll: Collective | str, algorithm: str, nbytes: int, topology: Topology, network: Network,
             segment_bytes: "int | str | SegmentPolicy | None" = None, *, itemsize: int = 4) -> SimResult:
    """Replay ``algorithm`` of collective ``coll`` (``"allreduce"``, ...) for ``nbytes`` on ``topology``
    with ``network``'s constants. ``ValueError`` for an unknown collective or algorithm, a size that is
    negative or not a multiple of ``itemsize``, a bad segment, or a topology whose rank count the schedule
    cannot use."""
    coll = _check(coll, nbytes, topology, itemsize)
    name = coll.resolve(algorithm)
    segments = policy(segment_bytes)
    schedule = coll.build(name, topology.size, nbytes // itemsize, topology.host_of)

    def evaluate(seg: int | None) -> tuple[float, int, int]:
        r = replay(schedule, topology, network, itemsize=itemsize, segment_bytes=seg)
        return r.seconds, r.steps, r.largest

    seconds, steps, seg = _fastest(evaluate, segments, nbytes, network)
    return SimResult(coll.name, name, nbytes, topology.size, seconds, steps, seg, REPLAY, coll.factor(topology.size))


def predicted(coll: Collective | str, algorithm: str, nbytes: int, topology: Topology, network: Network,
              segment_bytes: "int | str | SegmentPolicy | None" = None, *, itemsize: int = 4,
              model: CostModel | None = None) -> SimResult:
    """The same row from the cost model (:mod:`ringlet.tuning.cost`), marked ``source="model"``; pass
    ``model`` (for this topology and network) to reuse its per-algorithm state across rows.
    :class:`~ringlet.sim.model.ModelUnavailable` when there is no cost model; otherwise as :func:`simulate`."""
    coll = _check(coll, nbytes, topology, itemsize)
    name = coll.resolve(algorithm)
    segments = policy(segment_bytes)
    model = model or CostModel(topology, network, itemsize)

    def evaluate(seg: int | None) -> tuple[float, int, int]:
        p = model.predict(coll, name, nbytes, seg)
        return p.seconds, p.steps, nbytes

    seconds, steps, seg = _fastest(evaluate, segments, nbytes, network)
    return SimResult(coll.name, name, nbytes, topology.size, seconds, steps, seg, MODEL, coll.factor(topology.size))
