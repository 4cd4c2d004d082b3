"""Which parameters share a bucket of :class:`~ringlet.torch.training.ddp.DistributedDataParallel`, and
the two moments that changes: the one rebuild in gradient-arrival order after the first reduced
backward, and a new bucket cap (dynamic adjustment, :mod:`~ringlet.torch.training.adapt`).

Both happen between steps, on every rank at the same step, and give every rank the same buckets: the
arrival order is rank 0's, broadcast; a new cap is an agreed decision. The layouts themselves are
:func:`~ringlet.torch.training.buckets.layout_buckets`'.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from .buckets import ArrivalOrder, BucketSet, BucketSets, layout_buckets
from .compressed_reduction import CompressedReduction
from .factor_reduction import FactorLayers, FactorReduction

if TYPE_CHECKING:
    from .options import DDPOptions
    from .reduction import DenseReduction, ReductionContext

log = logging.getLogger("ringlet.torch.training.ddp")

__all__ = ["BucketPlan"]

MIB = 1 << 20


class BucketPlan:
    """The bucketing of ``params`` (the DDP's parameters, in registration order): their order (registration
    order until the rebuild, then rank 0's arrival order), the caps of ``options`` (``cap_bytes`` may
    change later), and the bucket sets built from them. ``spacing``: the launcher's buffer spacing."""

    def __init__(self, params: list[torch.nn.Parameter], options: DDPOptions, ctx: ReductionContext,
                 dense: DenseReduction, spacing):
        self.params = params
        self.cap_bytes = int(options.bucket_cap_mb * MIB)
        self.first_cap_bytes = int(options.first_bucket_cap_mb * MIB)
        self.ordered = list(params)  # the layout fills from the end of this list
        self._compression = options.compression
        self._ctx, self._dense, self._spacing = ctx, dense, spacing

    def layout(self, params: list[torch.nn.Parameter], chosen: dict) -> list[list[torch.nn.Parameter]]:
        return layout_buckets(params, chosen, self.cap_bytes, self.first_cap_bytes)

    def bucket_set(self, layout: list[list[torch.nn.Parameter]], chosen: dict) -> BucketSet:
        """The buckets of ``layout``; the weights in ``chosen`` (id -> factored layer) are reduced from
        factors, one bucket each."""
        def reduction_for(ps: list[torch.nn.Parameter]):
            layer = chosen.get(id(ps[0])) if len(ps) == 1 else None
            if layer is not None:
                return FactorReduction(layer, self._ctx)
            comp = self._compression
            return self._dense if comp is None else CompressedReduction(self._ctx, comp)

        return BucketSet(layout, reduction_for, self._spacing)

    def initial(self) -> BucketSet:
        """The dense buckets in reverse registration order."""
        return self.bucket_set(self.layout(self.ordered, {}), {})

    def rebuild(self, sets: BucketSets, arrivals: ArrivalOrder, factors: FactorLayers, comm, size: int,
                prefix: str) -> dict:
        """Once, at the forward after the first reduced backward: bucket in gradient-arrival order; returns
        the layers chosen for factors (id(weight) -> layer; empty when none).

        Rank 0's order is broadcast so every rank builds the same buckets (they must launch the same
        buffers in the same order). Parameters that got no gradient go last, in reverse registration order.
        Rank 0 also decides which layers reduce from factors (by its row counts): one decision for all.
        A collective: every rank calls it at the same step."""
        n = len(self.params)
        order = torch.tensor(arrivals.take(n) + factors.wanted(size), dtype=torch.int64)
        if size > 1:
            comm.broadcast_(order, f"{prefix}.order").wait()
        values = order.tolist()
        chosen = factors.choose(values[n:])
        if chosen:
            log.info("DistributedDataParallel: weight gradients that may be reduced from factors: %s",
                     ", ".join(f.name for f in chosen.values()))
        # The layout fills from the end of its list, so hand it the arrival order reversed.
        self.ordered = [self.params[i] for i in reversed(values[:n])]
        layout = self.layout(self.ordered, {})
        dense = sets.active
        if not dense.same_layout(layout):
            log.info("DistributedDataParallel: buckets rebuilt in gradient-arrival order (%d buckets)", len(layout))
            dense = self.bucket_set(layout, {})
        factored = self.bucket_set(self.layout(self.ordered, chosen), chosen) if chosen else None
        sets.replace(dense, factored)
        return chosen

    def resize(self, sets: BucketSets, cap_bytes: int, chosen: dict) -> None:
        """New buckets of at most ``cap_bytes`` (the first one keeps its cap) in the current order, for the
        sets still in use (``chosen``: the layers reduced from factors). Every rank at the same step.
        ``ValueError`` for a cap that is not positive."""
        if cap_bytes < 1:
            raise ValueError(f"a bucket cap must be positive, got {cap_bytes}")
        self.cap_bytes = int(cap_bytes)
        dense = self.bucket_set(self.layout(self.ordered, {}), {}) if sets.dense is not None else None
        factored = (self.bucket_set(self.layout(self.ordered, chosen), chosen)
                    if chosen and sets.factored is not None else None)
        sets.replace(dense, factored)
