"""Direct exchange: every rank talks to every other rank in one step.

``allgather``: every rank sends its block to every other rank. One round of latency, ``p(p-1)``
messages: the right shape for tiny payloads such as the metadata record checked before each
collective and the hostname exchange at start-up.

``allreduce`` (two-shot): a direct reduce-scatter (rank ``r`` receives chunk ``r`` from every peer and
reduces it) followed by a direct all-gather of the reduced chunks. Each rank sends and receives
``2(p-1)/p·n`` elements, like the ring, but in 2 steps instead of ``2(p-1)``, over ``p-1`` connections
at once: ``2α + 2(p-1)/p·nβ + (p-1)/p·nγ`` on a network where a host's link is shared fairly by its
flows. Fewer dependent steps matter when a rank cannot react to each step at once (CPU-starved ranks,
e.g. training that computes beside communication on a CPU quota), and more connections keep more bytes
in flight in the kernel while the process is not running. ``p(p-1)`` messages per step limit it to
small groups.
"""
from __future__ import annotations

import functools

from .schedule import Schedule, ScheduleBuilder, even_split


@functools.lru_cache(maxsize=256)
def allgather(p: int, counts: tuple[int, ...]) -> Schedule:
    b = ScheduleBuilder("direct_allgather", p)
    offs = [sum(counts[:i]) for i in range(p)]
    b.new_step()
    for shift in range(1, p):  # staggered so that no rank is everyone's first target
        for r in range(p):
            b.add(r, (r + shift) % p, offs[r], counts[r])
    return b.build()


@functools.lru_cache(maxsize=256)
def allreduce(p: int, count: int) -> Schedule:
    """Two-shot all-reduce: rank ``c`` reduces chunk ``c`` from all peers, then sends it to all of them."""
    b = ScheduleBuilder("direct", p)
    chunks = even_split(count, p)
    b.new_step()
    for shift in range(1, p):
        for r in range(p):
            c = (r + shift) % p
            b.add(r, c, chunks[c][0], chunks[c][1], reduce=True)
    b.new_step()
    for shift in range(1, p):
        for r in range(p):
            b.add(r, (r + shift) % p, chunks[r][0], chunks[r][1])
    return b.build()
