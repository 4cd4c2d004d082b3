"""Broadcast of a module's state from the group's first rank, coalesced: one flat broadcast per
(dtype, device), issued in the same order on every rank; launched at once and finished later where the
caller wants the results to land later (:func:`start_coalesced`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["broadcast_coalesced", "coalesced_", "start_coalesced", "Coalesced"]


class Coalesced:
    """Collectives launched on flat copies of some tensors; :meth:`finish` waits for them and copies the
    results back (once)."""

    __slots__ = ("_works",)

    def __init__(self, works: list):
        self._works = works

    @torch.no_grad()
    def finish(self) -> None:
        works, self._works = self._works, []
        for ts, flat, w in works:
            w.wait()
            off = 0
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()


@torch.no_grad()
def start_coalesced(tensors: list[torch.Tensor], name: str,
                    launch: Callable[[torch.Tensor, str], torch.futures.Future]) -> Coalesced:
    """Launch one in-place collective per (dtype, device) of ``tensors`` (empty ones are skipped) on a
    flat copy of them, ``launch(flat, f"{name}{i}")`` returning its future; the results reach the tensors
    at :meth:`Coalesced.finish`. Every rank must pass tensors of the same dtypes, devices and sizes in the
    same order (names matter in coordinated mode)."""
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_kind.setdefault((t.dtype, t.device), []).append(t)
    works = []
    for i, ts in enumerate(by_kind.values()):
        flat = torch.cat([t.reshape(-1) for t in ts])
        works.append((ts, flat, launch(flat, f"{name}{i}")))
    return Coalesced(works)


def coalesced_(tensors: list[torch.Tensor], name: str,
               launch: Callable[[torch.Tensor, str], torch.futures.Future]) -> None:
    """:func:`start_coalesced`, then :meth:`Coalesced.finish`: every collective launched before any is
    waited for."""
    start_coalesced(tensors, name, launch).finish()


def broadcast_coalesced(comm: Comm, tensors: list[torch.Tensor], name: str) -> None:
    """Overwrite ``tensors`` with the group's first rank's values (:func:`coalesced_`: flat buffers
    named ``{name}0``, ``{name}1``, ...)."""
    coalesced_(tensors, name, comm.broadcast_)
