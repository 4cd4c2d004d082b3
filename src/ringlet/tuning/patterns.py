"""What calibration measures: the traffic patterns of a link class and the chain schedules that carry
them. Framework-free; the timed runs are the prober's (:class:`ringlet.engine.probe.Prober`).
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from ..algorithms.schedule import Schedule, ScheduleBuilder
from .network import INTER, INTRA, Topology

Pattern = tuple[tuple[int, int], ...]  # (src, dst) pairs: every pair transfers at the same time


def shift_pattern(host_of: Sequence[int], cls: str) -> Pattern:
    """Who sends to whom when measuring link class ``cls``. ``intra``: every rank sends to the next rank
    of its own host (cyclically; hosts with one rank stay idle). ``inter``: every rank sends to the rank
    with the same local index on the next host (cyclically; that index modulo the host's size when the
    next host is smaller). Empty when the class does not occur (one host; one rank per host)."""
    hosts: dict[int, list[int]] = {}
    for r, h in enumerate(host_of):
        hosts.setdefault(h, []).append(r)
    groups = list(hosts.values())
    pairs: list[tuple[int, int]] = []
    if cls == INTRA:
        for ranks in groups:
            if len(ranks) > 1:
                pairs += [(r, ranks[(i + 1) % len(ranks)]) for i, r in enumerate(ranks)]
    elif cls == INTER:
        if len(groups) > 1:
            for g, ranks in enumerate(groups):
                nxt = groups[(g + 1) % len(groups)]
                pairs += [(r, nxt[i % len(nxt)]) for i, r in enumerate(ranks)]
    else:
        raise ValueError(f"unknown link class {cls!r}")
    return tuple(pairs)


def sharing(pattern: Pattern, topology: Topology) -> int:
    """The most transfers of ``pattern`` that cross one link (1 for an empty pattern)."""
    if not pattern:
        return 1
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pattern))
    _, out_link, in_link = topology.links(src, dst)
    return int(np.bincount(np.concatenate([out_link, in_link]), minlength=topology.nlinks).max())


@functools.lru_cache(maxsize=128)
def chain(pattern: Pattern, p: int, count: int, steps: int) -> Schedule:
    """``steps`` dependent steps of ``pattern`` over a buffer of three ``count``-element chunks: in step
    ``s`` every sender forwards chunk ``s mod 3`` and its partner receives it into chunk ``(s+1) mod 3``,
    which it forwards in step ``s+1`` (the data dependency of a ring step; three chunks let every receive
    land in place, as the executor's all-gather steps do)."""
    b = ScheduleBuilder("calibration_chain", p)
    for s in range(steps):
        b.new_step()
        for src, dst in pattern:
            b.add(src, dst, (s % 3) * count, count, dst_offset=((s + 1) % 3) * count)
    return b.build()
