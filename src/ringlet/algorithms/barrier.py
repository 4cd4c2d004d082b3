"""Dissemination barrier: in round ``k`` rank ``r`` signals ``r + 2^k`` and waits for ``r - 2^k``.

After ``ceil(log2 p)`` rounds every rank has transitively heard from every other, for any ``p``.
"""
from __future__ import annotations

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder


@cached
def dissemination(p: int) -> Schedule:
    b = ScheduleBuilder("dissemination_barrier", p)
    r = np.arange(p)
    k = 1
    while k < p:
        b.new_step()
        b.add_many(r, (r + k) % p, 0, 1)
        k <<= 1
    return b.build()
