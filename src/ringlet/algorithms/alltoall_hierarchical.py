"""Two-level all-to-all for groups spread over several hosts: gather by destination inside each host,
then one exchange between hosts straight into the destinations' outputs (the layout of Tutel's 2D
hierarchical all-to-all, with every local rank handling a share of the destinations).

Host ``h`` has ranks ``rows[h]`` (:func:`~ringlet.algorithms.hierarchical.host_rows`). Destination
``d`` on another host is *handled* on host ``h`` by its local rank ``local(d) mod len(rows[h])``.

* Step 0 (inside hosts): rank ``s`` sends each block for a destination on another host to that
  destination's handler on its own host, which keeps them in its scratch (buffer 2), one region per
  destination, the sources in rank order (a handler's own blocks are put there by a local copy
  first: ``meta["copies"]``); blocks for destinations on its own host go straight into their outputs.
* Step 1 (between hosts): a handler sends each destination it handles the region of its host's blocks
  in one message, landing where those sources' blocks belong in the destination's output (one message
  when the host's ranks are consecutive; a piece per run of consecutive ranks otherwise).

Inter-host messages fall from ``L_h · L_h'`` per host pair (pairwise) to ``L_h'`` (one per destination),
each ``L_h`` times larger; inter-host bytes are the same, and every block not staying on its host
crosses its host's fabric once more. Two steps: one intra-host, one inter-host.

Degenerate layouts: one host — step 0 alone, every block sent straight to its destination at once;
one rank per host — every rank handles its own blocks, step 1 alone, the same direct exchange. Both
are correct (a direct one-step all-to-all), so a request on one host is allowed.
"""
from __future__ import annotations

import numpy as np

from .alltoall import Counts, matrix, merge_pieces, offsets
from .cache import cached
from .hierarchical import host_rows
from .schedule import Schedule, ScheduleBuilder


class _Layout:
    """Who handles which destination, and where each handled block lies in its handler's scratch."""

    def __init__(self, p: int, counts: np.ndarray, host_of: tuple[int, ...]):
        self.rows = host_rows(host_of)
        self.host = np.zeros(p, np.int64)
        self.local = np.zeros(p, np.int64)
        for h, row in enumerate(self.rows):
            for i, r in enumerate(row):
                self.host[r], self.local[r] = h, i
        self.scratch = [0] * p
        self.region: dict[tuple[int, int], int] = {}  # (handler, d) -> offset of d's region in its scratch
        self.slot: dict[tuple[int, int], int] = {}  # (s, d) -> offset of block (s, d) in its handler's scratch
        for d in range(p):  # regions in destination order: the handler's scratch fills as d grows
            for h, row in enumerate(self.rows):
                if h == self.host[d]:
                    continue
                a = self.handler(h, d)
                self.region[(a, d)] = self.scratch[a]
                for s in row:
                    self.slot[(s, d)] = self.scratch[a]
                    self.scratch[a] += int(counts[s, d])

    def handler(self, h: int, d: int) -> int:
        row = self.rows[h]
        return row[int(self.local[d]) % len(row)]


def _gather_step(b: ScheduleBuilder, p: int, counts, lay: _Layout, send_off, recv_off) -> list[np.ndarray]:
    """Step 0; returns each rank's local copies of its own handled blocks into its scratch."""
    b.new_step()
    rows: list[tuple] = []
    own: list[list] = [[] for _ in range(p)]
    for s in range(p):
        h = lay.host[s]
        by_peer: dict[int, list] = {}
        for d in range(p):
            if d == s or counts[s, d] == 0:
                continue
            if lay.host[d] == h:
                by_peer.setdefault(d, []).append((1, int(send_off[s, d]), 0, int(recv_off[s, d]), int(counts[s, d])))
                continue
            a = lay.handler(h, d)
            piece = (1, int(send_off[s, d]), 2, lay.slot[(s, d)], int(counts[s, d]))
            (own[s] if a == s else by_peer.setdefault(a, [])).append(piece)
        for peer, pieces in by_peer.items():
            _add(rows, s, peer, merge_pieces(pieces))
    _flush(b, rows)
    return [np.asarray(merge_pieces(c), dtype=np.int64).reshape(-1, 5) for c in own]


def _exchange_step(b: ScheduleBuilder, p: int, counts, lay: _Layout, send_off, recv_off) -> None:
    b.new_step()
    rows: list[tuple] = []
    for d in range(p):
        for h, row in enumerate(lay.rows):
            if h == lay.host[d]:
                continue
            a = lay.handler(h, d)
            pieces = [(2, lay.slot[(s, d)], 0, int(recv_off[s, d]), int(counts[s, d])) for s in row]
            _add(rows, a, d, merge_pieces(pieces))
    _flush(b, rows)


def _add(rows: list, src: int, dst: int, pieces) -> None:
    rows.extend((src, dst, so, c, do, sb, db) for sb, so, db, do, c in pieces)


def _flush(b: ScheduleBuilder, rows: list) -> None:
    """The step's transfers, in the order they were added, by one ``add_many`` (one call per piece cost
    most of the build: about 20 ms at 32 ranks)."""
    if rows:
        a = np.asarray(rows, dtype=np.int64)
        b.add_many(a[:, 0], a[:, 1], a[:, 2], a[:, 3], dst_offset=a[:, 4], src_buf=a[:, 5], dst_buf=a[:, 6])


@cached
def hierarchical(p: int, send_counts: Counts, host_of: tuple[int, ...]) -> Schedule:
    """The two-level all-to-all of the module doc. ``ValueError`` when ``host_of`` has not ``p`` entries."""
    if len(host_of) != p:
        raise ValueError(f"host_of has {len(host_of)} entries for {p} ranks")
    counts = matrix(p, send_counts)
    send_off, recv_off = offsets(counts)
    lay = _Layout(p, counts, tuple(host_of))
    b = ScheduleBuilder("hierarchical_alltoall", p)
    own = _gather_step(b, p, counts, lay, send_off, recv_off)
    _exchange_step(b, p, counts, lay, send_off, recv_off)
    none = tuple(np.zeros((0, 5), np.int64) for _ in range(p))
    return b.build(scratch=tuple(lay.scratch), rows=tuple(lay.rows), copies=(tuple(own), none))
