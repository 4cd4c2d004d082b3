"""Ring algorithms: reduce-scatter, all-gather and their composition, the bandwidth-optimal all-reduce.

Rank ``r`` only talks to ``r+1`` and ``r-1``. All-reduce of ``n`` elements on ``p`` ranks takes
``2(p-1)`` steps, each moving ``n/p`` elements per rank: ``2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ``.
The executor cuts each chunk into segments, so the reduction of one segment overlaps the transfer
of the next.
"""
from __future__ import annotations

import functools

from .schedule import Schedule, ScheduleBuilder, even_split


def _chunks(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    out, off = [], 0
    for c in counts:
        out.append((off, c))
        off += c
    return out


def reduce_scatter_phase(b: ScheduleBuilder, p: int, chunks: list[tuple[int, int]], *, owner_shift: int) -> None:
    """After ``p-1`` steps rank ``r`` holds the full reduction of chunk ``(r + owner_shift) % p``."""
    for s in range(p - 1):
        b.new_step()
        for r in range(p):
            c = (r + owner_shift - s - 1) % p
            off, cnt = chunks[c]
            b.add(r, (r + 1) % p, off, cnt, reduce=True)


def allgather_phase(b: ScheduleBuilder, p: int, chunks: list[tuple[int, int]], *, owner_shift: int) -> None:
    """Rank ``r`` starts owning chunk ``(r + owner_shift) % p``; after ``p-1`` steps all own all."""
    for s in range(p - 1):
        b.new_step()
        for r in range(p):
            c = (r + owner_shift - s) % p
            off, cnt = chunks[c]
            b.add(r, (r + 1) % p, off, cnt)


@functools.lru_cache(maxsize=256)
def allreduce(p: int, count: int) -> Schedule:
    """Ring all-reduce: reduce-scatter, then all-gather of the reduced chunks."""
    b = ScheduleBuilder("ring", p)
    chunks = even_split(count, p)
    reduce_scatter_phase(b, p, chunks, owner_shift=1)
    allgather_phase(b, p, chunks, owner_shift=1)
    return b.build()


@functools.lru_cache(maxsize=256)
def reduce_scatter(p: int, counts: tuple[int, ...]) -> Schedule:
    """Ring reduce-scatter: rank ``r`` ends with the reduction of the ``r``-th block (``counts[r]`` elements)."""
    b = ScheduleBuilder("ring_reduce_scatter", p)
    reduce_scatter_phase(b, p, _chunks(counts), owner_shift=0)
    return b.build()


@functools.lru_cache(maxsize=256)
def allgather(p: int, counts: tuple[int, ...]) -> Schedule:
    """Ring all-gather of blocks of (possibly ragged) ``counts``; rank ``r`` contributes block ``r``."""
    b = ScheduleBuilder("ring_allgather", p)
    allgather_phase(b, p, _chunks(counts), owner_shift=0)
    return b.build()


@functools.lru_cache(maxsize=256)
def shift(p: int, counts: tuple[int, ...]) -> Schedule:
    """One ring hop: rank ``r`` sends the first ``counts[r]`` elements of buffer 1 to rank ``(r+1) % p``,
    which receives them at the front of its buffer 0. For collectives that compute between hops (the
    compressed ring of :mod:`ringlet.engine.compressed` re-quantises every partial sum)."""
    b = ScheduleBuilder("ring_shift", p)
    b.new_step()
    for r in range(p):
        b.add(r, (r + 1) % p, 0, counts[r], src_buf=1, dst_buf=0)
    return b.build()
