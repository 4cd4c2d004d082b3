"""Hierarchical two-level all-reduce: reduce-scatter inside each host, all-reduce across hosts, all-gather
inside each host (the scheme of Horovod's hierarchical all-reduce and of NCCL's 2D rings).

With ``L`` ranks on each of ``H`` hosts, local rank ``i`` ends the intra-host reduce-scatter owning
shard ``i`` (``n/L`` elements) reduced over its host; the ranks with local index ``i`` on every host
then run a ring all-reduce of shard ``i`` across hosts; a ring all-gather inside each host spreads the
shards. All ``L`` inter-host rings run at once, each on ``1/L`` of the data.

Cost: ``2(L-1) + 2(H-1)`` steps. Per rank ``2(L-1)/L·n`` elements move inside the host and
``2(H-1)/H·n/L`` across hosts, so a host's uplink carries ``2(H-1)/H·n`` (``n`` for two hosts) where a
flat ring crossing hosts carries ``2(p-1)/p·n`` on each crossing link (``1.5n`` for 2 hosts × 2 ranks),
and only ``2(H-1)`` of the steps pay the inter-host latency.

Uneven hosts (different numbers of ranks): the data is cut into ``m`` shards, ``m`` = the smallest
number of ranks on any host. Every host still runs its reduce-scatter and all-gather as a ring over all
its ranks (a ring with ragged blocks where local ranks ``>= m`` own empty blocks: they add their data
and forward, but own nothing), and only local ranks ``0..m-1`` take part in the inter-host rings. This
stays correct for any layout and keeps the uplink volume at ``2(H-1)/H·n``; the price is that a
host with more than ``m`` ranks moves ``n/m`` instead of ``n/L`` per intra-host step.

Degenerate layouts: one host → ``H = 1``, a ring over the host's ranks; one rank per host → ``m = 1``,
a ring over the hosts; both equal the flat ring all-reduce.

:func:`two_level` is the composition over any rows of ranks; :mod:`.torus` uses it with a grid.
"""
from __future__ import annotations

from itertools import groupby
from typing import Sequence

import numpy as np

from . import ring
from .cache import cached
from .schedule import Schedule, ScheduleBuilder, split_table


def _scalar_or(a: np.ndarray, reps: int):
    """A stored column repeated for ``reps`` parts: its one value when it has only one."""
    return a[0].item() if a.strides == (0,) else np.tile(a, reps)


def _embed_group(b: ScheduleBuilder, sched: Schedule, bases: np.ndarray) -> list:
    """Range tables of ``b`` for copies of ``sched`` shifted by ``bases``, and each copy's first row."""
    store = sched.store
    if (bases == bases[0]).all():  # one table serves every copy
        return [b.ranges(store.offsets.astype(np.int64) + int(bases[0]), store.counts), np.zeros(len(bases), int)]
    table = b.ranges((store.offsets.astype(np.int64)[None, :] + bases[:, None]).ravel(),
                     np.tile(store.counts, len(bases)))
    return [table, np.arange(len(bases)) * len(store.offsets)]


def embed(b: ScheduleBuilder, parts: Sequence[tuple[Schedule, Sequence[int], int]]) -> None:
    """Append sub-schedules that run side by side: step ``t`` of the result is the union of step ``t``
    of every part, in the order of ``parts``, with part rank ``k`` mapped to ``ranks[k]`` and element
    ranges shifted by ``base``.

    Parts must act on disjoint (rank, range) pairs; shorter parts simply finish early. Consecutive
    parts with the same schedule are added together, as arrays.
    """
    groups = []
    for sched, members in groupby(parts, key=lambda part: part[0]):
        members = list(members)
        ranks = np.array([list(r) for _, r, _ in members], dtype=np.int64).reshape(len(members), sched.nranks)
        bases = np.array([base for _, _, base in members], dtype=np.int64)
        groups.append((sched, ranks, bases, *_embed_group(b, sched, bases)))
    nsteps = max((s.num_steps for s, _, _ in parts), default=0)
    for t in range(nsteps):
        b.new_step()
        for sched, ranks, bases, table, first in groups:
            if t >= sched.num_steps:
                continue
            st = sched.store.steps[t]
            recv = -1 if st.recv is None else (st.recv.astype(np.int64)[None, :] + bases[:, None]).ravel()
            b.add_ranges(ranks[:, st.src].ravel(), ranks[:, st.dst].ravel(), table,
                         (st.rng.astype(np.int64)[None, :] + first[:, None]).ravel(),
                         reduce=_scalar_or(st.reduce, len(bases)), dst_offset=recv,
                         src_buf=_scalar_or(st.src_buf, len(bases)), dst_buf=_scalar_or(st.dst_buf, len(bases)))


def host_rows(host_of: Sequence[int]) -> list[tuple[int, ...]]:
    """Ranks of each host in rank order, hosts in order of their first rank."""
    rows: dict[int, list[int]] = {}
    for r, h in enumerate(host_of):
        rows.setdefault(h, []).append(r)
    return [tuple(v) for v in rows.values()]


def two_level(name: str, p: int, count: int, rows: Sequence[Sequence[int]]) -> Schedule:
    """Row reduce-scatter, column all-reduce, row all-gather over ``rows`` (a partition of ``0..p-1``).

    Column ``i`` is the ``i``-th rank of every row; only the first ``min(len(row))`` columns carry data.
    """
    if sorted(r for row in rows for r in row) != list(range(p)):
        raise ValueError(f"rows {rows} are not a partition of ranks 0..{p - 1}")
    b = ScheduleBuilder(name, p)
    m = min(len(row) for row in rows)
    offsets, counts = split_table(count, m)
    shards = list(zip(offsets.tolist(), counts.tolist()))
    sizes = tuple(c for _, c in shards)

    def blocks(row: Sequence[int]) -> tuple[int, ...]:
        return sizes + (0,) * (len(row) - m)

    embed(b, [(ring.reduce_scatter(len(row), blocks(row)), row, 0) for row in rows])
    embed(b, [(ring.allreduce(len(rows), cnt), [row[i] for row in rows], off)
              for i, (off, cnt) in enumerate(shards)])
    embed(b, [(ring.allgather(len(row), blocks(row)), row, 0) for row in rows])
    return b.build(rows=tuple(tuple(r) for r in rows), shards=m)


@cached
def allreduce(p: int, count: int, host_of: tuple[int, ...]) -> Schedule:
    """Two-level all-reduce of ``count`` elements; ``host_of[r]`` is the host index of rank ``r``.

    Cost in the module docstring; uneven hosts use ``min`` ranks-per-host shards.
    """
    if len(host_of) != p:
        raise ValueError(f"host_of has {len(host_of)} entries for {p} ranks")
    return two_level("hierarchical", p, count, host_rows(host_of))
