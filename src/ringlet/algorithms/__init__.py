"""Algorithms decide what goes where. Each builder returns a :class:`Schedule`; none imports a transport.

Registries map public algorithm names to builders with one signature per collective:
``allreduce(p, count, host_of) -> Schedule`` where ``host_of[r]`` is the host index of group rank ``r``;
``alltoall(p, send_counts, host_of) -> Schedule`` where ``send_counts[r][d]`` elements go from ``r`` to
``d`` (see :mod:`.alltoall` for its buffers, scratch and local copies).
"""
from __future__ import annotations

from typing import Callable

from . import (alltoall, alltoall_hierarchical, barrier, binomial, bruck, direct, halving_doubling, hierarchical,
               recursive_doubling, ring, torus, tree)
from .schedule import Schedule, ScheduleBuilder, Transfer, even_split

AllreduceBuilder = Callable[[int, int, tuple[int, ...]], Schedule]

ALLREDUCE: dict[str, AllreduceBuilder] = {
    "ring": lambda p, n, host_of: ring.allreduce(p, n),
    "tree": lambda p, n, host_of: tree.allreduce(p, n),
    "halving_doubling": lambda p, n, host_of: halving_doubling.allreduce(p, n),
    "recursive_doubling": lambda p, n, host_of: recursive_doubling.allreduce(p, n),
    "direct": lambda p, n, host_of: direct.allreduce(p, n),
    "torus": lambda p, n, host_of: torus.allreduce(p, n, tuple(host_of)),
    "hierarchical": lambda p, n, host_of: hierarchical.allreduce(p, n, tuple(host_of)),
}

AlltoallBuilder = Callable[[int, tuple[tuple[int, ...], ...], tuple[int, ...]], Schedule]

ALLTOALL: dict[str, AlltoallBuilder] = {
    "pairwise": lambda p, counts, host_of: alltoall.pairwise(p, counts),
    "hierarchical": lambda p, counts, host_of: alltoall_hierarchical.hierarchical(p, counts, tuple(host_of)),
    "bruck": lambda p, counts, host_of: bruck.bruck(p, counts),
}

# "native" is the backend's own all-reduce; it has no schedule and is dispatched by the collective.
NATIVE = "native"
# "auto": the caller leaves the choice to the algorithm selector (ringlet.tuning.select.Selector).
AUTO = "auto"
ALIASES = {
    "rabenseifner": "halving_doubling",
    "hd": "halving_doubling",
    "rhd": "halving_doubling",
    "recursive_halving_doubling": "halving_doubling",
    "rd": "recursive_doubling",
    "double_binary_tree": "tree",
    "dbtree": "tree",
    "2d_torus": "torus",
    "hier": "hierarchical",
    "two_shot": "direct",
}


def allreduce_names() -> list[str]:
    return sorted(ALLREDUCE) + [NATIVE]


__all__ = ["ALLREDUCE", "ALLTOALL", "ALIASES", "AUTO", "NATIVE", "Schedule", "ScheduleBuilder", "Transfer",
           "even_split", "allreduce_names", "alltoall", "alltoall_hierarchical", "barrier", "binomial", "bruck",
           "direct", "halving_doubling", "hierarchical", "recursive_doubling", "ring", "torus", "tree"]
