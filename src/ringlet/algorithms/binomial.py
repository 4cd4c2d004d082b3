"""Binomial trees rooted anywhere: broadcast (root fans out) and reduce (leaves fan in).

``ceil(log2 p)`` rounds; each round doubles the set of ranks that hold the data. Latency-optimal
for small messages; the executor's segmentation pipelines large ones down the tree.
"""
from __future__ import annotations

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder


def _rounds(p: int) -> int:
    return max(0, (p - 1).bit_length())


@cached
def broadcast(p: int, count: int, root: int) -> Schedule:
    """Round ``k``: every virtual rank ``v < 2^k`` sends to ``v + 2^k`` (virtual = rank relative to root)."""
    b = ScheduleBuilder("binomial_broadcast", p)
    for k in range(_rounds(p)):
        b.new_step()
        v = np.arange(min(1 << k, p - (1 << k)))  # those whose partner v + 2^k exists
        b.add_many((v + root) % p, (v + (1 << k) + root) % p, 0, count)
    return b.build()


@cached
def reduce(p: int, count: int, root: int) -> Schedule:
    """The broadcast tree run backwards: children reduce into parents, the root ends with the result."""
    b = ScheduleBuilder("binomial_reduce", p)
    for k in reversed(range(_rounds(p))):
        b.new_step()
        v = np.arange(min(1 << k, p - (1 << k)))
        b.add_many((v + (1 << k) + root) % p, (v + root) % p, 0, count, reduce=True)
    return b.build()
