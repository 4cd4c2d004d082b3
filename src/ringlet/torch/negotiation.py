"""The two collectives of a negotiation round, on the coordinator's own group.

:class:`Exchange` runs them over a group of its own (its own tag sequence), so rounds may go on while
the execution thread moves data on the process sets' groups: the two never share a tag.

* :meth:`Exchange.and_bits` — every round: a bit vector AND-ed over the ranks. It travels packed
  (8 lanes a byte) in one all-gather step and is AND-ed locally, which for the world sizes this is
  used at costs fewer network steps than a reduction tree.
* :meth:`Exchange.allgather` — only in rounds where some rank asked for it: every rank's message,
  each in a slot of the same size.
"""
from __future__ import annotations

import numpy as np
import torch

from ringlet.algorithms import direct, executor, ring


class Exchange:
    """Negotiation collectives over ``group`` (all ranks); call from one thread, in the same order everywhere."""

    def __init__(self, rt, group):
        self.rt = rt
        self.group = group
        self.workspace: dict = {}  # executor scratch of the negotiating thread

    def _allgather_raw(self, buf: torch.Tensor, slot: int) -> None:
        g, rt = self.group, self.rt
        p = g.size
        tag = rt.next_tag(g)
        if p > 1:
            sizes = tuple([slot] * p)
            sched = direct.allgather(p, sizes) if p <= 16 else ring.allgather(p, sizes)
            executor.execute(sched, g.rank_of(rt.rank), rt.transport, (buf,), 0, peers=g.ranks, tag=tag,
                             timeout=rt.options.timeout, workspace=self.workspace)

    def allgather(self, payload: bytes, slot: int) -> list[bytes]:
        """Every rank's ``payload`` (at most ``slot`` bytes, zero-padded to ``slot``), in rank order."""
        p, me = self.group.size, self.group.rank_of(self.rt.rank)
        buf = torch.zeros(p * slot, dtype=torch.uint8)
        if payload:
            buf[me * slot:me * slot + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        self._allgather_raw(buf, slot)
        raw = buf.numpy().tobytes()
        return [raw[r * slot:(r + 1) * slot] for r in range(p)]

    def and_bits(self, bits: np.ndarray) -> np.ndarray:
        """Lane-wise AND of every rank's boolean vector ``bits`` (same length everywhere)."""
        n = len(bits)
        packed = np.packbits(bits)
        slot = len(packed)
        p, me = self.group.size, self.group.rank_of(self.rt.rank)
        if p == 1:
            return bits.copy()
        buf = torch.zeros(p * slot, dtype=torch.uint8)
        buf.numpy()[me * slot:(me + 1) * slot] = packed
        self._allgather_raw(buf, slot)
        agreed = np.bitwise_and.reduce(buf.numpy().reshape(p, slot), axis=0)
        return np.unpackbits(agreed, count=n).astype(bool)
