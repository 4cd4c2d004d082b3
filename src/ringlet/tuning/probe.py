"""The measuring instruments of calibration: the traffic patterns, the chain schedules that carry them,
and timed runs of those schedules and of reductions on the live runtime.

Every timing here goes through the engine's own path: a :class:`~ringlet.algorithms.schedule.Schedule`
run by the executor (:meth:`ringlet.engine.channel.Channel.run`) over the transport's ``isend`` /
``irecv``. Every member of the group must make the same calls in the
same order (each takes the next op's tags), like any collective.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import numpy as np
import torch

from ..algorithms import ALLREDUCE
from ..algorithms import barrier as barrier_schedules
from ..algorithms.schedule import Schedule, ScheduleBuilder
from ..engine import ops
from ..engine.agree import agree, exchange
from ..engine.meta import Kind, Meta
from ..types import ReduceOp, reduction
from . import select
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


class Prober:
    """Timed operations on the world group of ``rt``: every call is a collective of the whole world."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.group = rt.world
        self._flag = torch.zeros(1, dtype=torch.uint8)

    def barrier(self) -> None:
        self.rt.channel(self.group).run(barrier_schedules.dissemination(self.group.size), (self._flag,))

    def time_chain(self, schedule: Schedule, buf: torch.Tensor, repeat: int) -> float:
        """Seconds per run of ``schedule`` on ``buf`` over ``repeat`` back-to-back runs after a barrier (this
        rank's clock). Every transfer travels as one message: the channel's segment is the whole buffer."""
        self.barrier()
        whole = max(buf.numel() * buf.element_size(), 1)
        t0 = time.perf_counter()
        for _ in range(repeat):
            dataclasses.replace(self.rt.channel(self.group), segment_bytes=whole).run(schedule, (buf,))
        return (time.perf_counter() - t0) / repeat

    def time_add(self, dsts: Sequence[torch.Tensor], src: torch.Tensor, repeat: int) -> float:
        """Seconds per ``dst.add_(src)`` (the executor's sum reduction) over ``repeat`` calls after a barrier,
        cycling through ``dsts`` (distinct memory, so the destination comes from memory as a collective's
        buffer does, not from cache), all ranks adding at once (they share the host's CPUs as reductions do)."""
        self.barrier()
        t0 = time.perf_counter()
        for i in range(repeat):
            dsts[i % len(dsts)].add_(src)
        return (time.perf_counter() - t0) / repeat

    def time_allreduce(self, algorithm: str, flat: torch.Tensor, repeat: int, checked: bool = False,
                       segment: int | None = None) -> float:
        """Seconds per all-reduce of ``flat`` with ``algorithm`` through the engine's operation
        (:func:`ringlet.engine.ops.allreduce_`: choice, schedule, executor, scaling) over ``repeat``
        back-to-back calls after a barrier (this rank's clock). ``checked``: each call first agrees on
        its metadata record, as a checked collective does. ``segment``: instead, the algorithm's
        schedule straight through the executor, its messages cut at this many bytes (a forced
        algorithm at a forced segment, whatever an installed model would choose)."""
        red = reduction(ReduceOp.SUM)
        ch = self.rt.channel(self.group)
        if segment is not None:
            ch = dataclasses.replace(ch, segment_bytes=segment)
            schedule = ALLREDUCE[algorithm](ch.size, flat.numel(), ch.group.host_of)
        self.barrier()
        t0 = time.perf_counter()
        for _ in range(repeat):
            if checked:
                agree(ch, Meta.of("", Kind.ALLREDUCE, flat, op=ReduceOp.SUM, algorithm=algorithm))
            if segment is None:
                ops.allreduce_(ch, flat, red, algorithm)
            else:
                ch.run(schedule, (flat,), red.combine)
        return (time.perf_counter() - t0) / repeat

    def segment(self, algorithm: str, flat: torch.Tensor) -> int:
        """The segment size (bytes) the executor runs a forced ``algorithm`` on ``flat`` with, chosen as
        :func:`ringlet.engine.ops.allreduce_` chooses it (the installed model's choice, else the
        channel's) and capped by the transport's ``max_segment_bytes``."""
        ch = self.rt.channel(self.group)
        choice = select.allreduce_choice(algorithm, ch.size, flat.numel() * flat.element_size(), ch.group.host_of,
                                         select.Capabilities.of(ch.transport), select.installed(),
                                         flat.element_size())
        return self.capped(choice.segment_bytes or ch.segment_bytes)

    def capped(self, segment: int) -> int:
        """``segment`` capped by the transport's ``max_segment_bytes`` (bytes), as the executor caps it."""
        cap = getattr(self.rt.channel(self.group).transport, "max_segment_bytes", None)
        return min(segment, cap) if cap else segment

    def time_check(self, repeat: int) -> float:
        """Seconds per metadata agreement (what every checked collective does before its data moves:
        :func:`ringlet.engine.agree.agree` on an all-reduce's record) over ``repeat`` back-to-back ones."""
        meta = Meta.of("", Kind.ALLREDUCE, self._flag, op=ReduceOp.SUM, algorithm="ring")
        self.barrier()
        t0 = time.perf_counter()
        for _ in range(repeat):
            agree(self.rt.channel(self.group), meta)
        return (time.perf_counter() - t0) / repeat

    def gather(self, values: Sequence[float]) -> np.ndarray:
        """Every rank's ``values`` (the same length on every rank) as a ``ranks × len`` array, identical
        on every rank."""
        mine = np.asarray(values, dtype=np.float64)
        raws = exchange(self.rt.channel(self.group), mine.tobytes(), mine.nbytes)
        return np.stack([np.frombuffer(raw, dtype=np.float64) for raw in raws]) if mine.size else \
            np.zeros((self.group.size, 0))
