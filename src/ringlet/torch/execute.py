"""Running agreed ops: every rank calls these with the same responses in the same order.

The metadata was checked during negotiation, so the collectives run straight on ringlet's schedules
and executor without the core layer's per-op metadata exchange (one network round less per op).
Ready all-reduces with the same dtype, op, scale factors and process set are packed into one fusion
buffer (up to ``HOROVOD_FUSION_THRESHOLD`` bytes) and reduced in one collective.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ringlet import timeline
from ringlet.engine import allreduce as engine_allreduce
from ringlet.engine import ops
from ringlet.tuning import select
from ringlet.types import reduction

from .requests import Meta, Request

Item = tuple[Meta, Request | None]  # agreed metadata and this rank's request (None: a joined rank)


def _span(track: str, phase: str, start: float, end: float, args: dict | None = None) -> None:
    tl = timeline.active()
    if tl is not None:
        tl.span(track, phase, start, end, args)


class Runner:
    """Runs agreed responses through the engine (:mod:`ringlet.engine.ops`) on the calling thread."""

    def __init__(self, rt, fusion_threshold: int):
        self.rt = rt
        self.workspace: dict = {}  # executor scratch of this thread (the runtime's belongs to its comm thread)
        self.fusion_threshold = fusion_threshold
        self._fusion: dict[torch.dtype, torch.Tensor] = {}

    def _channel(self, g, kind: str, tensor: torch.Tensor, name: str):
        """The channel of the next op on ``g``, the op in the flight recorder under its tensor's name."""
        return self.rt.recorded(g, kind, tensor, name, self.workspace)

    def allreduce_flat(self, g, flat: torch.Tensor, op: int, pre: float, post: float, name: str = "") -> None:
        """All-reduce ``flat`` in place with the algorithm the core would choose (``RINGLET_ALGORITHM``
        or ``auto``), through the engine's one all-reduce entry (:func:`ringlet.engine.allreduce.allreduce_`)
        without a record: negotiation already checked the members' metadata."""
        algo = select.requested(None, self.rt.options.algorithm)
        with self._channel(g, "allreduce", flat, name) as ch:
            engine_allreduce.allreduce_(ch, flat, reduction(op), algo, pre, post)

    # ---- all-reduce with fusion --------------------------------------------------------------
    @staticmethod
    def _target(item: Item) -> torch.Tensor:
        """The tensor the result lands in (zeros for a joined rank)."""
        meta, req = item
        if req is None:
            return torch.zeros(meta.shape, dtype=meta.torch_dtype)
        return req.output

    def allreduce(self, g, items: Sequence[Item]) -> list[torch.Tensor]:
        """Reduce every item (same dtype/op/scales/process set) and return the outputs in order."""
        meta0 = items[0][0]
        esize = torch.empty((), dtype=meta0.torch_dtype).element_size()
        outs = [self._target(it) for it in items]
        batches: list[list[int]] = []
        cur: list[int] = []
        cur_bytes = 0
        for i, (meta, _) in enumerate(items):
            nbytes = meta.numel * esize
            if cur and (self.fusion_threshold <= 0 or cur_bytes + nbytes > self.fusion_threshold):
                batches.append(cur)
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += nbytes
        if cur:
            batches.append(cur)
        for batch in batches:
            if len(batch) == 1:
                self._allreduce_one(g, items[batch[0]], outs[batch[0]])
            else:
                self._allreduce_fused(g, [items[i] for i in batch], [outs[i] for i in batch])
        return outs

    def _allreduce_one(self, g, item: Item, out: torch.Tensor) -> None:
        meta, req = item
        if req is not None and out is not req.tensor:
            out.copy_(req.tensor)
        t0 = timeline.now_us()
        self.allreduce_flat(g, out.view(-1), meta.op, meta.pre, meta.post, meta.name)
        _span(meta.name, "COMMUNICATE", t0, timeline.now_us(), {"bytes": out.numel() * out.element_size()})

    def _buffer(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        buf = self._fusion.get(dtype)
        if buf is None or buf.numel() < n:
            buf = torch.empty(max(n, 1024), dtype=dtype)
            self._fusion[dtype] = buf
        return buf[:n]

    def _allreduce_fused(self, g, items: list[Item], outs: list[torch.Tensor]) -> None:
        meta0 = items[0][0]
        total = sum(m.numel for m, _ in items)
        flat = self._buffer(meta0.torch_dtype, total)
        t0 = timeline.now_us()
        off = 0
        for (meta, req), out in zip(items, outs):
            n = meta.numel
            if req is None:
                flat[off:off + n].zero_()
            else:
                flat[off:off + n].copy_(req.tensor.reshape(-1))
            off += n
        t1 = timeline.now_us()
        self.allreduce_flat(g, flat, meta0.op, meta0.pre, meta0.post, f"{meta0.name} (+{len(items) - 1} fused)")
        t2 = timeline.now_us()
        off = 0
        for (meta, _), out in zip(items, outs):
            out.view(-1).copy_(flat[off:off + meta.numel])
            off += meta.numel
        t3 = timeline.now_us()
        args = {"fused": len(items), "bytes": total * flat.element_size()}
        for meta, _ in items:
            _span(meta.name, "FUSE", t0, t1, args)
            _span(meta.name, "COMMUNICATE", t1, t2, args)
            _span(meta.name, "FUSE", t2, t3, args)

    # ---- the other collectives ---------------------------------------------------------------
    def allgather(self, g, metas: dict[int, Meta], req: Request) -> torch.Tensor:
        dim0s = [metas[r].shape[0] if metas[r].shape else 1 for r in g.ranks]
        with self._channel(g, "allgather", req.tensor, metas[g.ranks[0]].name) as ch:
            return ops.allgather_rows(ch, req.tensor, dim0s)

    def broadcast(self, g, meta: Meta, req: Request) -> torch.Tensor:
        out = req.output
        if out is not req.tensor:
            out.copy_(req.tensor)
        with self._channel(g, "broadcast", out, meta.name) as ch:
            ops.broadcast_(ch, out.view(-1), g.rank_of(meta.root))
        return out

    def alltoall(self, g, metas: dict[int, Meta], req: Request) -> tuple[torch.Tensor, torch.Tensor]:
        with self._channel(g, "alltoall", req.tensor, metas[g.ranks[0]].name) as ch:
            out, recv = ops.alltoall_rows(ch, req.tensor, [metas[r].splits for r in g.ranks])
        return out, torch.tensor(recv, dtype=torch.int32)

    def reducescatter(self, g, meta: Meta, req: Request) -> torch.Tensor:
        with self._channel(g, "reduce_scatter", req.tensor, meta.name) as ch:
            return ops.reduce_scatter_rows(ch, req.tensor.clone(), reduction(meta.op), meta.pre, meta.post)
