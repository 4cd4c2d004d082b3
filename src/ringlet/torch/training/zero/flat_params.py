"""Stages 1 and 2: the model's parameters live in one persistent flat buffer per bucket (model dtype), each
parameter's ``.data`` a view of its slot, so the all-gather that follows a step writes the parameters with
no copy."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .layout import Layout

__all__ = ["FlatParameters"]


class FlatParameters:
    """The flat parameter buffers of ``layout`` for ``params`` (``params[i]`` is the tensor of the layout's
    slot index ``i``); this rank (``shard_rank``) owns block ``buckets[b].shard(shard_rank)`` of each.

    Construction copies the parameters' values into the buffers and rebinds every ``param.data`` to its
    slot (the Parameter objects stay the module's)."""

    def __init__(self, layout: Layout, params: Sequence[torch.Tensor], shard_rank: int):
        self.layout = layout
        self.shard_rank = shard_rank
        self.flats: list[torch.Tensor] = []
        with torch.no_grad():
            for b in layout.buckets:
                device = params[b.slots[0].index].device
                flat = torch.empty(b.numel, dtype=b.dtype, device=device)
                for s in b.slots:
                    p = params[s.index]
                    view = flat[s.offset:s.offset + s.numel]
                    view.copy_(p.detach().reshape(-1))
                    p.data = view.view(s.shape)
                self.flats.append(flat)

    def block(self, b: int) -> torch.Tensor:
        """This rank's block of bucket ``b`` (a view: writing it writes the parameters)."""
        lo, hi = self.layout.buckets[b].shard(self.shard_rank)
        return self.flats[b][lo:hi]

    def broadcast(self, comm, prefix: str) -> None:
        """Overwrite every buffer with the group's first rank's values (launched all, then waited)."""
        futs = [comm.broadcast_(flat, f"{prefix}.param{b}") for b, flat in enumerate(self.flats) if flat.numel()]
        for f in futs:
            f.wait()

    def gather(self, reducer, prefix: str, before: Callable[[int], None]) -> None:
        """Rebuild every bucket from the ranks' blocks: per bucket ``before(b)`` (write this rank's block),
        then its all-gather is launched; every gather is waited for at the end, so the communication of
        earlier buckets overlaps the writes of later ones."""
        futs = []
        for b, flat in enumerate(self.flats):
            before(b)
            futs.append(reducer.allgather_(flat, self.layout.buckets[b].counts, f"{prefix}.ag{b}"))
        for f in futs:
            f.wait()

    def nbytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.flats)
