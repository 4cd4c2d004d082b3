"""Pairwise all-to-all: in step ``k`` rank ``r`` sends to ``r+k`` and receives from ``r-k``.

Buffer 1 is the input, buffer 0 the output; ``send_counts[r][d]`` elements go from ``r`` to ``d``.
Every rank sends one message per step, so no link carries two at once on a ring-like network.
"""
from __future__ import annotations

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder


@cached
def pairwise(p: int, send_counts: tuple[tuple[int, ...], ...]) -> Schedule:
    b = ScheduleBuilder("pairwise_alltoall", p)
    counts = np.asarray(send_counts, dtype=np.int64).reshape(p, p)
    send_off = np.cumsum(counts, axis=1) - counts  # [r, d]: where r's block for d starts in r's input
    recv_off = np.cumsum(counts, axis=0) - counts  # [s, d]: where s's block lands in d's output
    r = np.arange(p)
    for k in range(1, p):
        d = (r + k) % p
        b.new_step()
        b.add_many(r, d, send_off[r, d], counts[r, d], dst_offset=recv_off[r, d], src_buf=1, dst_buf=0)
    return b.build()
