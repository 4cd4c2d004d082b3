"""This rank's side of the steady-state path: requests announced as one bit of the cache bit vector.

A request whose name is in the response cache with exactly the same record waits here at the name's
cache position; every round sets its bit (:meth:`CachedRequests.vector`), and once the AND over the
ranks keeps the bit, the op is agreed with the cached record (:meth:`CachedRequests.agreed`). Positions
of process sets this rank is not a member of are always set, so that only the members decide.
"""
from __future__ import annotations

import numpy as np

from .requests import BIT_ACCEPT, BIT_FIRST_POS, BIT_QUIET, Cache, Entry, Meta, Request


class CachedRequests:
    """The response cache and this rank's requests waiting as bits; used by the coordinator thread only."""

    def __init__(self, rank: int, process_sets, capacity: int = 4096):
        self.rank = rank
        self.process_sets = process_sets
        self.cache = Cache(capacity)
        self.waiting: dict[int, tuple[Request, float]] = {}  # position -> (request, since when)
        self.foreign: set[int] = set()  # positions of process sets this rank is not a member of

    def place(self, req: Request, now: float) -> bool:
        """Wait as a bit when the name is cached with this very record; False when it must go in full."""
        pos = self.cache.lookup(req.meta.name, req.wire)
        if pos is None:
            return False
        self.waiting[pos] = (req, now)
        return True

    def take(self, pos: int) -> Request | None:
        hit = self.waiting.pop(pos, None)
        return hit[0] if hit is not None else None

    def take_if(self, pred) -> list[Request]:
        """Remove and return the waiting requests for which ``pred(request, since)`` holds."""
        out = [pos for pos, (r, t) in self.waiting.items() if pred(r, t)]
        return [self.waiting.pop(pos)[0] for pos in out]

    def vector(self, quiet: bool, accept: bool) -> np.ndarray:
        """This rank's bit vector for the round (its length is the same on every rank)."""
        v = np.zeros(BIT_FIRST_POS + self.cache.span, dtype=bool)
        v[BIT_QUIET] = quiet
        v[BIT_ACCEPT] = accept
        for pos in self.waiting:
            v[BIT_FIRST_POS + pos] = True
        for pos in self.foreign:
            v[BIT_FIRST_POS + pos] = True
        return v

    def agreed(self, positions) -> list[tuple[tuple[int, str], Entry, None]]:
        """(key, entry, None) of the agreed positions, in position order; this rank's requests stop
        waiting. Positions of process sets without this rank are included, so that every rank records
        the same responses (the cache's recency order must stay identical); execution skips them. A
        position agreed but neither waiting here nor foreign is an internal error."""
        out = []
        for pos in positions:
            pos = int(pos)
            if self.waiting.pop(pos, None) is None and pos not in self.foreign:
                raise RuntimeError(f"cache position {pos} agreed but not submitted on rank {self.rank}")
            wire, meta = self.cache.get(pos)
            e = Entry()
            for r in self.process_sets.group(meta.ps_id).ranks:
                e.metas[r] = meta
                e.wires[r] = wire
            out.append(((meta.ps_id, meta.name), e, None))
        return out

    def record(self, meta: Meta, wire: bytes) -> Request | None:
        """Cache a record agreed identically everywhere; returns a request that waited at the position
        with another record (an evicted name's, or this name's in another process set or shape): it
        must now go in full."""
        pos, _ = self.cache.record(meta, wire)
        if pos is None:
            return None
        hit = self.waiting.get(pos)
        displaced = self.take(pos) if hit is not None and hit[0].wire != wire else None
        try:
            member = self.rank in self.process_sets.group(meta.ps_id)
        except ValueError:
            member = False
        if member:
            self.foreign.discard(pos)
        else:
            self.foreign.add(pos)
        return displaced
