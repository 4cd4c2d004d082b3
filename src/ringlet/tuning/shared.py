"""Making every rank hold rank 0's bytes: how calibration and profile loading agree on one result."""
from __future__ import annotations

import torch

from ..algorithms import binomial


def broadcast_bytes(rt, payload: bytes | None) -> bytes:
    """Rank 0's ``payload`` on every rank of ``rt``'s world (other ranks pass ``None`` or anything; it is
    ignored). Two binomial-tree broadcasts through the executor: the length, then the bytes. A collective:
    every rank calls it in the same order."""
    p, root = rt.world.size, 0
    mine = payload if (rt.rank == root and payload is not None) else b""
    head = torch.tensor([len(mine)], dtype=torch.int64)
    if p > 1:
        rt.channel(rt.world).run(binomial.broadcast(p, 1, root), (head,))
    n = int(head.item())
    if n == 0:
        return b""
    buf = torch.frombuffer(bytearray(mine), dtype=torch.uint8) if rt.rank == root else torch.empty(n, dtype=torch.uint8)
    if p > 1:
        rt.channel(rt.world).run(binomial.broadcast(p, n, root), (buf,))
    return buf.numpy().tobytes()
