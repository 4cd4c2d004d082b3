"""Recursive doubling all-reduce: the latency-optimal choice for small vectors (MPICH's below 2 KiB).

In round ``j`` every rank swaps its whole vector with the partner at distance ``2^j`` (its ``j``-th
bit flipped) and reduces what it receives: after ``log₂p'`` rounds every rank holds the full result.
Half the rounds of recursive halving-doubling, at the price of sending the whole vector each round:

    ⌈log₂p⌉·(α + nβ + nγ)   against   2⌈log₂p⌉·α + 2(p-1)/p·nβ + (p-1)/p·nγ

so it wins while ``n`` is below a few α/β: the larger a message's fixed cost α, the larger the sizes
it wins.

Non-powers of two fold in exactly as :mod:`halving_doubling` does (``participants`` is shared): with
``r = p - p'`` extra ranks, rank ``2i`` first hands its vector to ``2i+1``, which takes part for both
and returns the result at the end (two extra steps). Every rank reduces its partner's vector into
its own, so ``a + b`` on one side meets ``b + a`` on the other: identical for commutative operations,
which all of ringlet's are.
"""
from __future__ import annotations

import numpy as np

from .cache import cached
from .halving_doubling import folded
from .schedule import Schedule, ScheduleBuilder


@cached
def allreduce(p: int, count: int) -> Schedule:
    """Recursive-doubling all-reduce of ``count`` elements over any ``p >= 1`` ranks."""

    def rounds(b: ScheduleBuilder, pp: int, real: np.ndarray) -> None:
        v = np.arange(pp)
        for j in range(pp.bit_length() - 1):
            b.new_step()
            b.add_many(real, real[v ^ (1 << j)], 0, count, reduce=True)

    return folded("recursive_doubling", p, count, rounds)
