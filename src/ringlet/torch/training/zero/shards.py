"""This rank's float32 master shards and the inner optimizer that steps them.

Per bucket ``b`` the rank owns one contiguous block of the flattened parameters (``layout``); its
**master shard** holds those elements in float32. When the parameters already are float32 the master
shard *is* the rank's block of the parameters (stages 1-2: of the flat parameter buffer; stage 3: the
parameter shard) — no copy, no extra memory; for float16/bfloat16 parameters it is a float32 copy, cast
back into the parameters after every step.

The inner optimizer (any ``torch.optim.Optimizer`` class) is built on **piece views** of the master
shards: one tensor per :class:`~.layout.Piece` — the parameter's shape when the piece is a whole
parameter of at least one dimension, else 1-D — each with ``.grad`` the matching view of the float32
gradient shard. The views are grouped into the user's param groups, in order (a group may be empty on
a rank that owns none of its elements), so the inner optimizer's ``param_groups`` stand for the user's.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .layout import Layout, Piece

__all__ = ["Shards"]


class Shards:
    """Masters, piece views and the inner optimizer for rank ``shard_rank`` of ``layout``.

    ``block(b)``: this rank's block of bucket ``b`` in the parameters (model dtype, written in place);
    ``grad_shard(b)``: the float32 gradient shard of bucket ``b`` (``counts[shard_rank]`` elements);
    ``groups``: the user's param groups' options (no ``params``), one dict per group; ``defaults``: keyword
    arguments of ``optimizer_class``."""

    def __init__(self, layout: Layout, shard_rank: int, block: Callable[[int], torch.Tensor],
                 grad_shard: Callable[[int], torch.Tensor], optimizer_class: type, groups: Sequence[dict],
                 defaults: dict):
        self.layout = layout
        self.shard_rank = shard_rank
        self._block = block
        self.masters: list[torch.Tensor] = []
        self.aliased: list[bool] = []
        with torch.no_grad():
            for b in range(len(layout.buckets)):
                blk = block(b).detach()
                alias = blk.dtype == torch.float32
                self.masters.append(blk if alias else blk.detach().to(torch.float32))
                self.aliased.append(alias)
        self.pieces: list[Piece] = layout.pieces(shard_rank)
        self.views: list[torch.Tensor] = []
        members: list[list[torch.Tensor]] = [[] for _ in groups]
        for piece in self.pieces:
            view = _view(self.masters[piece.bucket], piece)
            view.grad = _view(grad_shard(piece.bucket), piece)
            self.views.append(view)
            members[layout.buckets[piece.bucket].group].append(view)
        self.optimizer: torch.optim.Optimizer = optimizer_class(
            [{**g, "params": m} for g, m in zip(groups, members)], **defaults)

    def write_back(self, b: int) -> None:
        """Cast master shard ``b`` into this rank's block of the parameters (nothing when aliased)."""
        if not self.aliased[b]:
            with torch.no_grad():
                self._block(b).copy_(self.masters[b])

    def master_bytes(self) -> int:
        """Bytes of the master shards that are copies (aliased ones are the parameters' own)."""
        return sum(m.numel() * 4 for m, a in zip(self.masters, self.aliased) if not a)

    def state_bytes(self) -> int:
        """Bytes of every tensor in the inner optimizer's state."""
        seen, total = set(), 0
        for st in self.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.data_ptr() not in seen:
                    seen.add(v.data_ptr())
                    total += v.numel() * v.element_size()
        return total


def _view(flat: torch.Tensor, piece: Piece) -> torch.Tensor:
    """Piece ``piece`` of the shard ``flat``: shaped as its parameter when it is the whole parameter (and
    that has a dimension), else 1-D."""
    v = flat[piece.shard_start:piece.shard_start + piece.numel]
    if piece.start == 0 and piece.end == piece.slot.numel and len(piece.slot.shape) >= 1:
        return v.view(piece.slot.shape)
    return v
