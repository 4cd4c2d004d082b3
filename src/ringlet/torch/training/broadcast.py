"""Broadcast of a module's state from the group's first rank, coalesced: one flat broadcast per
(dtype, device), issued in the same order on every rank."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["broadcast_coalesced"]


@torch.no_grad()
def broadcast_coalesced(comm: Comm, tensors: list[torch.Tensor], name: str) -> None:
    """Overwrite ``tensors`` with the group's first rank's values (empty ones are skipped). The flat
    buffers are named ``{name}0``, ``{name}1``, ... (names matter in coordinated mode). Every rank must
    pass tensors of the same dtypes, devices and sizes in the same order."""
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_kind.setdefault((t.dtype, t.device), []).append(t)
    works = []
    for i, ts in enumerate(by_kind.values()):
        flat = torch.cat([t.reshape(-1) for t in ts])
        works.append((ts, flat, comm.broadcast_(flat, f"{name}{i}")))
    for ts, flat, w in works:
        w.wait()
        off = 0
        for t in ts:
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()
