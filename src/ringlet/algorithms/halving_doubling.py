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

from typing import Callable

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder, split_table


def participants(p: int) -> list[int]:
    """Real rank of each of the ``p'`` virtual ranks that take part in the halving/doubling rounds."""
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    return [2 * v + 1 if v < extra else v + extra for v in range(pp)]


def folded(name: str, p: int, count: int, rounds: Callable[[ScheduleBuilder, int, np.ndarray], None]) -> Schedule:
    """A schedule over any ``p >= 1`` ranks whose ``rounds(builder, p', real)`` need a power of two ``p'``:
    the ``p - p'`` extra ranks first hand their vector to a partner (``real[v]`` is the rank that plays
    virtual rank ``v``) and get the result back at the end."""
    if p < 1:
        raise ValueError(f"{name} needs at least one rank, got p={p}")
    b = ScheduleBuilder(name, p)
    pp = 1 << (p.bit_length() - 1)
    extra = 2 * np.arange(p - pp)  # rank 2i folds into 2i + 1
    if len(extra):
        b.new_step()
        b.add_many(extra, extra + 1, 0, count, reduce=True)
    rounds(b, pp, np.array(participants(p)))
    if len(extra):
        b.new_step()
        b.add_many(extra + 1, extra, 0, count)
    return b.build()


def _owned(v: np.ndarray, j: int, pp: int) -> np.ndarray:
    """First block of the range each virtual rank ``v`` owns after ``j`` halving rounds (it owns
    ``pp >> j`` blocks): bits ``0..j-1`` of ``v`` pick nested halves."""
    lo, size = np.zeros_like(v), pp
    for bit in range(j):
        size >>= 1
        lo += (v >> bit & 1) * size
    return lo


@cached
def allreduce(p: int, count: int) -> Schedule:
    """Rabenseifner all-reduce of ``count`` elements over any ``p >= 1`` ranks (cost in the module doc)."""

    def rounds(b: ScheduleBuilder, pp: int, real: np.ndarray) -> None:
        offsets, counts = split_table(count, pp)
        bounds = np.append(offsets, count)
        n = pp.bit_length() - 1
        # levels[j]: the ranges of pp >> j consecutive blocks (what a rank owns after j rounds), by first block
        levels = [None] + [b.ranges(bounds[0:pp:pp >> j], bounds[pp >> j::pp >> j] - bounds[0:pp:pp >> j])
                           for j in range(1, n + 1)]
        v = np.arange(pp)
        for j in range(n):  # halving: give the partner the half it keeps
            w = v ^ (1 << j)
            b.new_step()
            b.add_ranges(real[v], real[w], levels[j + 1], _owned(w, j + 1, pp) // (pp >> (j + 1)), reduce=True)
        for j in reversed(range(n)):  # doubling: send what is owned, own twice as much
            w = v ^ (1 << j)
            b.new_step()
            b.add_ranges(real[v], real[w], levels[j + 1], _owned(v, j + 1, pp) // (pp >> (j + 1)))

    return folded("halving_doubling", p, count, rounds)
