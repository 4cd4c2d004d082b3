"""The job's key-value store: ringlet's own, so that only holders of the job's secret can use it.

torch's ``TCPStore`` accepts anyone who reaches its port: any process can list a job's keys, write
its own, or pose as a rank. ``ringlet run`` hosts this store instead (node 0's launcher, or the
elastic driver): every connection must first prove it holds the job's secret
(:mod:`ringlet.security.handshake`); anything else is refused and logged once with its address.

- :mod:`.protocol`: the framing and the operations.
- :mod:`.server`: :class:`StoreServer`.
- :mod:`.client`: :class:`StoreClient` (standard library only).
- :mod:`.torch_store`: :class:`RingletStore`, the client as a ``torch.distributed.Store`` (process
  groups, torch's elastic agent), and :func:`job_store`, the store of the job this process is in.
"""
from .client import StoreClient, StoreError, StoreTimeout
from .server import StoreServer

__all__ = ["StoreClient", "StoreServer", "StoreError", "StoreTimeout"]
