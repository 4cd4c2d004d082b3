"""Pairwise all-to-all: in step ``k`` rank ``r`` sends to ``r+k`` and receives from ``r-k``.

Buffer 1 is the input, buffer 0 the output; ``send_counts[r][d]`` elements go from ``r`` to ``d``.
Every rank sends one message per step, so no link carries two at once on a ring-like network.
"""
from __future__ import annotations

import functools

from .schedule import Schedule, ScheduleBuilder


@functools.lru_cache(maxsize=256)
def pairwise(p: int, send_counts: tuple[tuple[int, ...], ...]) -> Schedule:
    b = ScheduleBuilder("pairwise_alltoall", p)
    send_off = [[sum(send_counts[r][:d]) for d in range(p)] for r in range(p)]
    recv_off = [[sum(send_counts[s][d] for s in range(src)) for src in range(p)] for d in range(p)]
    for k in range(1, p):
        b.new_step()
        for r in range(p):
            d = (r + k) % p
            b.add(r, d, send_off[r][d], send_counts[r][d], dst_offset=recv_off[d][r], src_buf=1, dst_buf=0)
    return b.build()
