"""Recursive halving-doubling all-reduce (Rabenseifner; the MPICH algorithm for mid-sized vectors).

Reduce-scatter by recursive halving: in round ``j`` every rank exchanges half of its current range
with the partner at distance ``2^j`` (its ``j``-th bit flipped), keeping and reducing into the half
its ``j``-th bit selects; after ``log₂p'`` rounds rank ``v`` holds one fully reduced block (block
``bitreverse(v)``). All-gather by recursive doubling replays the rounds backwards with copies,
doubling the owned range each round.

Distances grow while the messages shrink: the half-vector exchanges happen between neighbouring
ranks, which usually share a host, and the partners far apart (other hosts) only swap ``n/p'``-sized
pieces. On 2 hosts × 4 ranks a host then sends ``n`` across instead of ``4n`` with the
largest-distance-first order.

Only ``p' = 2^⌊log₂p⌋`` ranks take part in the rounds. With ``r = p - p'`` extra ranks, the first
``2r`` ranks pair up first: rank ``2i`` sends its whole vector to rank ``2i+1``, which reduces it and
takes part for both; at the end ``2i+1`` sends the result back. Neighbouring ranks are paired because
they are most likely to share a host, which keeps the two full-vector messages local.

Cost: ``2log₂p'`` steps moving ``2(p'-1)/p'·n`` elements per rank, ``2log₂p'·α + 2(p'-1)/p'·nβ +
(p'-1)/p'·nγ``; a non-power of two adds two steps of ``α + nβ`` (and ``nγ``) on the paired ranks, in
total ``2⌈log₂p⌉`` steps. Latency-optimal for small and mid-sized vectors. Counts smaller than ``p'``
leave some blocks empty; their transfers are dropped by the builder.
"""
from __future__ import annotations

import functools
from typing import Callable

from .schedule import Schedule, ScheduleBuilder, even_split


def participants(p: int) -> list[int]:
    """Real rank of each of the ``p'`` virtual ranks that take part in the halving/doubling rounds."""
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    return [2 * v + 1 if v < extra else v + extra for v in range(pp)]


def folded(name: str, p: int, count: int, rounds: Callable[[ScheduleBuilder, int, list[int]], None]) -> Schedule:
    """A schedule over any ``p >= 1`` ranks whose ``rounds(builder, p', real)`` need a power of two ``p'``:
    the ``p - p'`` extra ranks first hand their vector to a partner (``real[v]`` is the rank that plays
    virtual rank ``v``) and get the result back at the end."""
    if p < 1:
        raise ValueError(f"{name} needs at least one rank, got p={p}")
    b = ScheduleBuilder(name, p)
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    if extra:
        b.new_step()
        for i in range(extra):
            b.add(2 * i, 2 * i + 1, 0, count, reduce=True)
    rounds(b, pp, participants(p))
    if extra:
        b.new_step()
        for i in range(extra):
            b.add(2 * i + 1, 2 * i, 0, count)
    return b.build()


@functools.lru_cache(maxsize=256)
def allreduce(p: int, count: int) -> Schedule:
    """Rabenseifner all-reduce of ``count`` elements over any ``p >= 1`` ranks (cost in the module doc)."""

    def rounds(b: ScheduleBuilder, pp: int, real: list[int]) -> None:
        blocks = even_split(count, pp)

        def owned(v: int, j: int) -> tuple[int, int]:
            """Element range v owns after j halving rounds: bits 0..j-1 of v pick nested halves."""
            lo, size = 0, pp
            for bit in range(j):
                size >>= 1
                if v >> bit & 1:
                    lo += size
            start = blocks[lo][0]
            last_off, last_cnt = blocks[lo + size - 1]
            return start, last_off + last_cnt - start

        n = pp.bit_length() - 1
        for j in range(n):  # halving: give the partner the half it keeps
            b.new_step()
            for v in range(pp):
                off, cnt = owned(v ^ (1 << j), j + 1)
                b.add(real[v], real[v ^ (1 << j)], off, cnt, reduce=True)
        for j in reversed(range(n)):  # doubling: send what is owned, own twice as much
            b.new_step()
            for v in range(pp):
                off, cnt = owned(v, j + 1)
                b.add(real[v], real[v ^ (1 << j)], off, cnt)

    return folded("halving_doubling", p, count, rounds)
