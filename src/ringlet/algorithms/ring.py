"""Ring algorithms: reduce-scatter, all-gather and their composition, the bandwidth-optimal all-reduce.

Rank ``r`` only talks to ``r+1`` and ``r-1``. All-reduce of ``n`` elements on ``p`` ranks takes
``2(p-1)`` steps, each moving ``n/p`` elements per rank: ``2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ``.
The executor cuts each chunk into segments, so the reduction of one segment overlaps the transfer
of the next.
"""
from __future__ import annotations

import numpy as np

from .cache import cached
from .schedule import Ranges, Schedule, ScheduleBuilder, split_table


def _chunks(b: ScheduleBuilder, counts: tuple[int, ...]) -> Ranges:
    """Blocks of ``counts`` laid end to end, as a range table of ``b``."""
    cnt = np.asarray(counts, dtype=np.int64).reshape(-1)
    return b.ranges(np.cumsum(cnt) - cnt, cnt)


def reduce_scatter_phase(b: ScheduleBuilder, p: int, chunks: Ranges, *, owner_shift: int) -> None:
    """After ``p-1`` steps rank ``r`` holds the full reduction of chunk ``(r + owner_shift) % p``.
    At step ``s`` rank ``r`` sends chunk ``(r + owner_shift - s - 1) % p`` to ``r + 1``."""
    r = np.arange(p)
    nxt = (r + 1) % p
    for s in range(p - 1):
        b.new_step()
        b.add_ranges(r, nxt, chunks, (r + (owner_shift - s - 1)) % p, reduce=True)


def allgather_phase(b: ScheduleBuilder, p: int, chunks: Ranges, *, owner_shift: int) -> None:
    """Rank ``r`` starts owning chunk ``(r + owner_shift) % p``; after ``p-1`` steps all own all.
    At step ``s`` rank ``r`` sends chunk ``(r + owner_shift - s) % p`` to ``r + 1``."""
    r = np.arange(p)
    nxt = (r + 1) % p
    for s in range(p - 1):
        b.new_step()
        b.add_ranges(r, nxt, chunks, (r + (owner_shift - s)) % p)


@cached
def allreduce(p: int, count: int) -> Schedule:
    """Ring all-reduce: reduce-scatter, then all-gather of the reduced chunks."""
    b = ScheduleBuilder("ring", p)
    chunks = b.ranges(*split_table(count, p))
    reduce_scatter_phase(b, p, chunks, owner_shift=1)
    allgather_phase(b, p, chunks, owner_shift=1)
    return b.build()


@cached
def reduce_scatter(p: int, counts: tuple[int, ...]) -> Schedule:
    """Ring reduce-scatter: rank ``r`` ends with the reduction of the ``r``-th block (``counts[r]`` elements)."""
    b = ScheduleBuilder("ring_reduce_scatter", p)
    reduce_scatter_phase(b, p, _chunks(b, counts), owner_shift=0)
    return b.build()


@cached
def allgather(p: int, counts: tuple[int, ...]) -> Schedule:
    """Ring all-gather of blocks of (possibly ragged) ``counts``; rank ``r`` contributes block ``r``."""
    b = ScheduleBuilder("ring_allgather", p)
    allgather_phase(b, p, _chunks(b, counts), owner_shift=0)
    return b.build()


@cached
def shift(p: int, counts: tuple[int, ...]) -> Schedule:
    """One ring hop: rank ``r`` sends the first ``counts[r]`` elements of buffer 1 to rank ``(r+1) % p``,
    which receives them at the front of its buffer 0. For collectives that compute between hops (the
    compressed ring of :mod:`ringlet.engine.compressed` re-quantises every partial sum)."""
    b = ScheduleBuilder("ring_shift", p)
    b.new_step()
    r = np.arange(p)
    b.add_many(r, (r + 1) % p, 0, np.asarray(counts, dtype=np.int64).reshape(-1), src_buf=1, dst_buf=0)
    return b.build()
