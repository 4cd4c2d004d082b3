"""Which all-to-all schedule runs (:data:`ringlet.algorithms.ALLTOALL`): the request's name, or for
``"auto"`` pairwise (without a cost model) or the cost model's least predicted time. Re-exported by
:mod:`ringlet.tuning.select`, the one place where algorithms are chosen.

Every member knows the whole count matrix (the splits are exchanged before data moves) and the same
host layout and model constants, so every member chooses the same schedule without communicating.
The choice looks at one number of the matrix, the mean bytes per peer (off the diagonal: a rank's own
block never travels), so ragged calls with similar volumes choose alike and a decision is cached.
"""
from __future__ import annotations

import math

import numpy as np

from ..algorithms import ALLTOALL, AUTO

__all__ = ["ALLTOALL_ALGORITHMS", "alltoall", "alltoall_rule", "alltoall_choice", "mean_peer_bytes"]

ALLTOALL_ALGORITHMS = ("pairwise", "hierarchical", "bruck")  # also the order of preference on a tie


def alltoall(name: str | None) -> str:
    """The canonical all-to-all request: ``"auto"`` (also for None) or a name of
    :data:`ALLTOALL_ALGORITHMS`. ``ValueError`` naming the choices for anything else."""
    if name is not None and not isinstance(name, str):
        raise ValueError(f"all-to-all algorithm must be a name (str), got {name!r}.")
    key = (name or AUTO).strip().lower()
    if key != AUTO and key not in ALLTOALL:
        raise ValueError(f"unknown all-to-all algorithm {name!r}; choose auto or one of "
                         + ", ".join(ALLTOALL_ALGORITHMS) + ".")
    return key


def mean_peer_bytes(send_counts, itemsize: int) -> float:
    """Mean bytes of the off-diagonal blocks of ``send_counts`` (elements); 0 for fewer than two ranks."""
    counts = np.asarray(send_counts, dtype=np.int64)
    p = counts.shape[0]
    if p < 2:
        return 0.0
    return float(counts.sum() - np.trace(counts)) * itemsize / (p * (p - 1))


def alltoall_rule(p: int, peer_bytes: float, host_of: tuple[int, ...]) -> str:
    """The choice without a cost model: pairwise, whatever the size and layout. Measured on the emulated
    cluster (benchmarks/alltoall: 4 hosts x 1 and x 2 ranks, 1 Gbit/s, 1 KiB-16 MiB per rank), neither Bruck
    on small blocks nor the two-level schedule on several ranks per host beat it: pairwise keeps all its
    messages in flight at once, so Bruck's dependent rounds and the two-level gather only add steps there.
    They remain for a calibrated cost model to pick, or to be named."""
    return "pairwise"


def alltoall_choice(name: str | None, send_counts, itemsize: int, host_of: tuple[int, ...], model=None) -> str:
    """What runs for request ``name`` over the count matrix ``send_counts`` (elements of ``itemsize``
    bytes) on hosts ``host_of``: a forced name as it is; ``"auto"`` the :func:`alltoall_rule` without
    ``model``, else the schedule of least predicted time under ``model``'s network, predicted for an even
    matrix of the mean block rounded up to a power of two, among those whose ranks send at most
    ``model.fanout_limit`` messages in one step (ties within ``model.resolution`` go to the earlier of
    :data:`ALLTOALL_ALGORITHMS`). ``ValueError`` for an unknown name."""
    key = alltoall(name)
    if key != AUTO:
        return key
    p = len(host_of)
    peer_bytes = mean_peer_bytes(send_counts, itemsize)
    if model is None or p < 2 or peer_bytes == 0:
        return alltoall_rule(p, peer_bytes, tuple(host_of))
    per_peer = 1 << max(0, math.ceil(math.log2(max(peer_bytes / itemsize, 1.0))))
    return _fastest(p, per_peer, int(itemsize), tuple(host_of), model)


_CACHE: dict[tuple, tuple[object, str]] = {}  # (p, per_peer, itemsize, host_of, id(model)) -> (network, name)


def _fastest(p: int, per_peer: int, itemsize: int, host_of: tuple[int, ...], model) -> str:
    network = model.network
    key = (p, per_peer, itemsize, host_of, id(model))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is network:
        return hit[1]
    times = predicted_times(p, per_peer, itemsize, host_of, network, model.fanout_limit)
    best = min(times.values())
    name = next(n for n in ALLTOALL_ALGORITHMS if n in times and times[n] <= best * (1 + model.resolution))
    if len(_CACHE) >= 256:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (network, name)
    return name


def predicted_times(p: int, per_peer: int, itemsize: int, host_of: tuple[int, ...], network,
                    fanout_limit: float = math.inf) -> dict[str, float]:
    """Predicted seconds of every all-to-all schedule for an even matrix of ``per_peer`` elements per
    block, leaving out those whose ranks send more than ``fanout_limit`` messages in one step (all of
    them when none is left)."""
    from .network import Topology
    from .signature import Signature

    topology = Topology(host_of)
    counts = ((per_peer,) * p,) * p
    sigs = {name: Signature.of(ALLTOALL[name](p, counts, host_of), topology) for name in ALLTOALL_ALGORITHMS}
    fit = {n: s for n, s in sigs.items() if s.fanout <= fanout_limit} or sigs
    unsegmented = np.array([math.inf])
    return {n: float(s.seconds(1, network, itemsize, unsegmented)[0]) for n, s in fit.items()}
