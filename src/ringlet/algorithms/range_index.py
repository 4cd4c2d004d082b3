"""Overlap queries over one rank's element ranges, step by step: which of its sends (or receives) of
steps ``[first, last)`` touch a given range of a given buffer. The executor asks this for every
transfer it compiles; a 1,024-rank ring has 2,046 steps, so a query must not walk the Python lists of
all earlier steps.
"""
from __future__ import annotations

import numpy as np

_SCAN = 16  # below this many candidates a Python scan beats numpy's per-call cost


class RangeIndex:
    """``per_step[s]``: the ``(buf, offset, count)`` of the ranges of step ``s``, in order."""

    def __init__(self, per_step: list[list[tuple[int, int, int]]]):
        self.nsteps = len(per_step)
        self.start = [0]
        for items in per_step:
            self.start.append(self.start[-1] + len(items))
        self.items = [item for items in per_step for item in items]
        self.where = [(s, j) for s, items in enumerate(per_step) for j in range(len(items))]
        cols = np.array(self.items, dtype=np.int64).reshape(-1, 3)
        self.buf, self.lo, self.hi = cols[:, 0], cols[:, 1], cols[:, 1] + cols[:, 2]

    def position(self, step: int, j: int) -> int:
        """Flat position of item ``j`` of ``step``."""
        return self.start[step] + j

    def overlapping(self, buf: int, offset: int, count: int, first: int, last: int) -> list[int]:
        """Flat positions, ascending, of the items of steps ``[first, last)`` (clipped to the steps that
        exist) that share an element with ``count`` elements at ``offset`` of ``buf``."""
        a, b = self.start[max(0, min(first, self.nsteps))], self.start[max(0, min(last, self.nsteps))]
        end = offset + count
        if b - a <= _SCAN:
            return [p for p in range(a, b) if self.items[p][0] == buf and self.items[p][1] < end
                    and offset < self.items[p][1] + self.items[p][2]]
        hit = (self.buf[a:b] == buf) & (self.lo[a:b] < end) & (offset < self.hi[a:b])
        return (a + np.flatnonzero(hit)).tolist()
