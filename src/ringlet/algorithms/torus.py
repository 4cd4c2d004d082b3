"""2D torus all-reduce (as on TPU pods and in Sony's ImageNet-in-minutes run): arrange the ``p`` ranks in
an ``R × C`` grid, reduce-scatter along each row (a ring of ``C``), all-reduce each rank's shard along its
column (a ring of ``R``), all-gather along each row.

Grid choice:

* when the ranks are spread evenly over ``1 < H < p`` hosts, rows are hosts (``C`` = ranks per host):
  the column phase is the only one crossing hosts, with ``1/C`` of the data per rank. This is then the
  same schedule as :mod:`.hierarchical`;
* otherwise the factorisation closest to square, ``R`` = the largest divisor of ``p`` not above
  ``√p``, with consecutive ranks in a row (neighbours are the likeliest to share a host).

A prime ``p`` (or ``p <= 3``) has no proper factorisation: ``R = 1`` and the torus degenerates to the
flat ring all-reduce, which is correct, just not two-dimensional.

Cost: ``2(C-1) + 2(R-1)`` steps instead of the ring's ``2(p-1)`` (``4(√p-1)`` for a square grid), the
same ``2(p-1)/p·n`` elements per rank in total: ``2(C-1)/C·n`` along rows and ``2(R-1)/R·n/C`` along
columns. ``(2(C+R)-4)α + 2(p-1)/p·nβ + (p-1)/p·nγ``.
"""
from __future__ import annotations

import math
from typing import Sequence

from .cache import cached
from .hierarchical import host_rows, two_level
from .schedule import Schedule


def grid(p: int, host_of: Sequence[int]) -> list[tuple[int, ...]]:
    """The rows of the grid (each a tuple of ranks; all rows have the same length)."""
    hosts = host_rows(host_of)
    if 1 < len(hosts) < p and len({len(h) for h in hosts}) == 1:
        return hosts
    rows = max(d for d in range(1, math.isqrt(p) + 1) if p % d == 0)
    cols = p // rows
    return [tuple(range(i * cols, (i + 1) * cols)) for i in range(rows)]


@cached
def allreduce(p: int, count: int, host_of: tuple[int, ...]) -> Schedule:
    """2D torus all-reduce of ``count`` elements over ``p`` ranks (grid and cost in the module docstring)."""
    if p < 1:
        raise ValueError(f"a torus needs at least one rank, got p={p}")
    if len(host_of) != p:
        raise ValueError(f"host_of has {len(host_of)} entries for {p} ranks")
    return two_level("torus", p, count, grid(p, host_of))
