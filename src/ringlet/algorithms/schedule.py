"""The plain description every algorithm emits: who sends which element range to whom, per step.

One definition, three uses: the executor runs it over a transport, the simulator replays it on a
modelled network, the cost model counts its messages and bytes.

Semantics of a :class:`Schedule`: steps run in order. A transfer at step ``s`` sends the sender's
buffer range as it is after all steps ``< s``; the receiver reduces (``reduce=True``) or copies it
into its own range once step ``s`` completes. Ranges are in elements of a flat buffer; ``src_buf``
and ``dst_buf`` pick one of the buffers the collective provides (0 is the work buffer; all-to-all
also reads from buffer 1). Executors may pipeline freely as long as the result equals this
step-by-step meaning.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    offset: int
    count: int
    reduce: bool = False
    dst_offset: int = -1  # -1: the same range as the sender's
    src_buf: int = 0
    dst_buf: int = 0

    @property
    def recv_offset(self) -> int:
        return self.offset if self.dst_offset < 0 else self.dst_offset


@dataclass(frozen=True, slots=True)
class StepArrays:
    """One step's transfers as parallel numpy arrays (one entry per transfer, schedule order).

    ``src``/``dst``: schedule ranks; ``offset``/``count``: the sender's element range;
    ``recv_offset``: where the receiver puts it (already resolved, never -1); ``reduce``: bool;
    ``src_buf``/``dst_buf``: buffer indices. Integer arrays may use any integer dtype (the compact
    storage picks the smallest); treat them as read-only. This is the form the simulator and the cost
    model read: whole steps at once, without a Python object per transfer.
    """

    src: np.ndarray
    dst: np.ndarray
    offset: np.ndarray
    count: np.ndarray
    recv_offset: np.ndarray
    reduce: np.ndarray
    src_buf: np.ndarray
    dst_buf: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @staticmethod
    def of(transfers) -> "StepArrays":
        """Arrays of a sequence of :class:`Transfer`."""
        ts = list(transfers)

        def col(get, dtype):
            return np.fromiter((get(t) for t in ts), dtype=dtype, count=len(ts))

        return StepArrays(col(lambda t: t.src, np.int32), col(lambda t: t.dst, np.int32),
                          col(lambda t: t.offset, np.int64), col(lambda t: t.count, np.int64),
                          col(lambda t: t.recv_offset, np.int64), col(lambda t: t.reduce, np.bool_),
                          col(lambda t: t.src_buf, np.int8), col(lambda t: t.dst_buf, np.int8))


@dataclass(frozen=True)
class Schedule:
    name: str
    nranks: int
    steps: tuple[tuple[Transfer, ...], ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __hash__(self) -> int:  # schedules are cache keys; identity is enough and cheap
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def transfers(self):
        for s, step in enumerate(self.steps):
            for t in step:
                yield s, t

    def step_arrays(self, s: int) -> StepArrays:
        """Step ``s`` as arrays (:class:`StepArrays`)."""
        return StepArrays.of(self.steps[s])

    def bytes_sent(self, itemsize: int) -> list[int]:
        """Bytes each rank sends in total: what the cost model and tests count."""
        out = [0] * self.nranks
        for _, t in self.transfers():
            out[t.src] += t.count * itemsize
        return out


class ScheduleBuilder:
    """Accumulates transfers step by step; empty transfers are dropped so count 0 is trivial."""

    def __init__(self, name: str, nranks: int):
        self.name = name
        self.nranks = nranks
        self._steps: list[list[Transfer]] = []

    def new_step(self) -> None:
        self._steps.append([])

    def add(self, src: int, dst: int, offset: int, count: int, *, reduce: bool = False,
            dst_offset: int = -1, src_buf: int = 0, dst_buf: int = 0) -> None:
        if count <= 0 or src == dst:
            return
        if not self._steps:
            self.new_step()
        self._steps[-1].append(Transfer(src, dst, offset, count, reduce, dst_offset, src_buf, dst_buf))

    def extend(self, other: Schedule) -> None:
        """Append another schedule's steps after the current ones (e.g. reduce-scatter + all-gather)."""
        for step in other.steps:
            self._steps.append(list(step))

    def build(self, **meta) -> Schedule:
        steps = tuple(tuple(s) for s in self._steps if s)
        return Schedule(self.name, self.nranks, steps, dict(meta))


def even_split(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` contiguous (offset, length) pieces differing by at most one."""
    return [(i * count // parts, (i + 1) * count // parts - i * count // parts) for i in range(parts)]
