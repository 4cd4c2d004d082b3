"""Broadcast of a module's state from the group's first rank, coalesced: one flat broadcast per
(dtype, device), issued in the same order on every rank."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["broadcast_coalesced", "coalesced_"]


@torch.no_grad()
def coalesced_(tensors: list[torch.Tensor], name: str,
               launch: Callable[[torch.Tensor, str], torch.futures.Future]) -> None:
    """Run one in-place collective per (dtype, device) of ``tensors`` (empty ones are skipped) on their
    concatenation, ``launch(flat, f"{name}{i}")`` returning its future, all launched before any is
    waited for; then copy each result back into its tensors. Every rank must pass tensors of the same
    dtypes, devices and sizes in the same order (names matter in coordinated mode)."""
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_kind.setdefault((t.dtype, t.device), []).append(t)
    works = []
    for i, ts in enumerate(by_kind.values()):
        flat = torch.cat([t.reshape(-1) for t in ts])
        works.append((ts, flat, launch(flat, f"{name}{i}")))
    for ts, flat, w in works:
        w.wait()
        off = 0
        for t in ts:
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()


def broadcast_coalesced(comm: Comm, tensors: list[torch.Tensor], name: str) -> None:
    """Overwrite ``tensors`` with the group's first rank's values (:func:`coalesced_`: flat buffers
    named ``{name}0``, ``{name}1``, ...)."""
    coalesced_(tensors, name, comm.broadcast_)
