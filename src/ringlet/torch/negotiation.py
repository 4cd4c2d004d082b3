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

from ringlet.engine.agree import exchange


class Exchange:
    """Negotiation collectives over ``group`` (all ranks); call from one thread, in the same order everywhere."""

    def __init__(self, rt, group):
        self.rt = rt
        self.group = group
        self.workspace: dict = {}  # executor scratch of the negotiating thread

    def allgather(self, payload: bytes, slot: int) -> list[bytes]:
        """Every rank's ``payload`` (at most ``slot`` bytes, zero-padded to ``slot``), in rank order."""
        return exchange(self.rt.channel(self.group, self.workspace), payload, slot)

    def and_bits(self, bits: np.ndarray) -> np.ndarray:
        """Lane-wise AND of every rank's boolean vector ``bits`` (same length everywhere)."""
        if self.group.size == 1:
            return bits.copy()
        packed = np.packbits(bits)
        raws = self.allgather(packed.tobytes(), len(packed))
        agreed = np.bitwise_and.reduce(np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), -1), axis=0)
        return np.unpackbits(agreed, count=len(bits)).astype(bool)
