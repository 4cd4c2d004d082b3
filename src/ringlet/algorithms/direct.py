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

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder, split_table


def _all_pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Sender and receiver of every ordered pair, staggered so that no rank is everyone's first target:
    for shift ``1..p-1``, every rank ``r`` sends to ``(r + shift) % p``."""
    src = np.tile(np.arange(p), max(p - 1, 0))
    return src, (src + np.repeat(np.arange(1, p), p)) % p


@cached
def allgather(p: int, counts: tuple[int, ...]) -> Schedule:
    b = ScheduleBuilder("direct_allgather", p)
    cnt = np.asarray(counts, dtype=np.int64).reshape(-1)
    blocks = b.ranges(np.cumsum(cnt) - cnt, cnt)
    src, dst = _all_pairs(p)
    b.new_step()
    b.add_ranges(src, dst, blocks, src)
    return b.build()


@cached
def allreduce(p: int, count: int) -> Schedule:
    """Two-shot all-reduce: rank ``c`` reduces chunk ``c`` from all peers, then sends it to all of them."""
    b = ScheduleBuilder("direct", p)
    chunks = b.ranges(*split_table(count, p))
    src, dst = _all_pairs(p)
    b.new_step()
    b.add_ranges(src, dst, chunks, dst, reduce=True)
    b.new_step()
    b.add_ranges(src, dst, chunks, src)
    return b.build()
