"""The error ``ringlet.torch`` raises for failed collectives (a leaf: everything in ``ringlet.torch`` may import it)."""
from __future__ import annotations

from ringlet.types import RingletError


class HorovodInternalError(RingletError):
    """A collective failed on the ranks: cross-rank mismatch, dead peer, shutdown of a peer.

    A ``RuntimeError`` subclass as in Horovod (and a :class:`ringlet.RingletError`), so both
    ``except RuntimeError`` and ``except hvd.HorovodInternalError`` catch it.
    """


__all__ = ["HorovodInternalError"]
