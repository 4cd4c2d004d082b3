"""Direct exchange: every rank sends its block to every other rank in one step.

One round of latency, ``p(p-1)`` messages: the right shape for tiny payloads such as the metadata
record checked before each collective and the hostname exchange at start-up.
"""
from __future__ import annotations

import functools

from .schedule import Schedule, ScheduleBuilder


@functools.lru_cache(maxsize=256)
def allgather(p: int, counts: tuple[int, ...]) -> Schedule:
    b = ScheduleBuilder("direct_allgather", p)
    offs = [sum(counts[:i]) for i in range(p)]
    b.new_step()
    for shift in range(1, p):  # staggered so that no rank is everyone's first target
        for r in range(p):
            b.add(r, (r + shift) % p, offs[r], counts[r])
    return b.build()
