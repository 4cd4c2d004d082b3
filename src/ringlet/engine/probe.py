"""The measuring instrument of calibration: timed runs of schedules, reductions and whole all-reduces on
the live runtime, and the agreement of their results between ranks.

Calibration itself (:mod:`ringlet.tuning.calibrate`) is framework-free: it is handed a :class:`Prober`
and asks it for buffers, timings and agreed numbers. Every timing here goes through the engine's own
path: a :class:`~ringlet.algorithms.schedule.Schedule` run by the executor
(:meth:`ringlet.engine.channel.Channel.run`) over the transport's ``isend`` / ``irecv``. Every member
of the group must make the same calls in the same order (each takes the next op's tags), like any
collective.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np
import torch

from ..algorithms import ALLREDUCE, binomial
from ..algorithms import barrier as barrier_schedules
from ..algorithms.schedule import Schedule
from ..types import ReduceOp, reduction
from . import ops
from .agree import agree, exchange
from .meta import Kind, Meta


class Prober:
    """Timed operations on the world group of ``rt`` (a :class:`~ringlet.runtime.Runtime`): every call
    is a collective of the whole world."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.group = rt.world
        self._flag = torch.zeros(1, dtype=torch.uint8)

    @staticmethod
    def buffer(count: int, fill: float = 1.0) -> torch.Tensor:
        """A float32 buffer of ``count`` elements set to ``fill``, for the timings below (slices of it
        are buffers too)."""
        return torch.full((count,), fill, dtype=torch.float32)

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
        algorithm at a forced segment, whatever the runtime's cost model would choose)."""
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
        :func:`ringlet.engine.ops.allreduce_` chooses it (the channel's selector, else the channel's
        segment) and capped by the transport's ``max_segment_bytes``."""
        ch = self.rt.channel(self.group)
        choice = ch.selector.allreduce(algorithm, ch.size, flat.numel() * flat.element_size(), ch.group.host_of,
                                       ch.transport.capabilities, flat.element_size())
        return self.capped(choice.segment_bytes or ch.segment_bytes)

    def capped(self, segment: int) -> int:
        """``segment`` capped by the transport's ``max_segment_bytes`` (bytes), as the executor caps it."""
        cap = self.rt.transport.capabilities.max_segment_bytes
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

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's ``payload`` on every rank of the world (other ranks pass ``None`` or anything; it is
        ignored): how calibration and profile loading agree on one result. Two binomial-tree broadcasts
        through the executor: the length, then the bytes."""
        rt, p, root = self.rt, self.group.size, 0
        mine = payload if (rt.rank == root and payload is not None) else b""
        head = torch.tensor([len(mine)], dtype=torch.int64)
        if p > 1:
            rt.channel(self.group).run(binomial.broadcast(p, 1, root), (head,))
        n = int(head.item())
        if n == 0:
            return b""
        buf = (torch.frombuffer(bytearray(mine), dtype=torch.uint8) if rt.rank == root
               else torch.empty(n, dtype=torch.uint8))
        if p > 1:
            rt.channel(self.group).run(binomial.broadcast(p, n, root), (buf,))
        return buf.numpy().tobytes()
