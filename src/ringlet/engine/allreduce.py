"""The engine's one all-reduce entry.

Every front end's all-reduce enters the engine through :func:`allreduce_`: the core API's
(:class:`ringlet.engine.requests.AllreduceRequest`, run by the runtime's queue with the op's channel),
the Horovod executor's (:class:`ringlet.torch.execute.Runner`, on responses already negotiated: no
record to check). It decides the path once and calls down, never back up:

* ``compressed`` given: the record (with the compression described) agreed by
  :func:`ringlet.engine.agree.agree`, then :func:`ringlet.engine.compressed.compressed_allreduce_`
  between the pre- and postscaling;
* else the transport's small-message path (:mod:`ringlet.engine.small`) where ``algorithm`` is
  ``"auto"`` and the path takes the message: the record checked in band;
* else the record agreed (:func:`~ringlet.engine.agree.agree`), then :func:`ringlet.engine.ops.allreduce_`
  (the channel's selector chooses, the schedule runs on the executor over the transport).

With a record (``meta``), a mismatch raises the same :class:`~ringlet.types.MismatchError` on every
member before ``flat`` is written; without one the caller vouches that the members agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import compression as _compression
from ..algorithms import AUTO
from ..types import Reduction
from . import agree, ops, small
from .channel import Channel
from .compressed import compressed_allreduce_
from .meta import Meta

__all__ = ["Compressed", "allreduce_"]


@dataclass(frozen=True, slots=True)
class Compressed:
    """A compressed all-reduce's choices (see :mod:`ringlet.engine.compressed`): the compressor, the
    caller's ``state`` dict for this tensor (kept between calls: error-feedback residuals), the
    ``shapes`` the flat tensor concatenates (for compressors with their own schedule), a ``strategy``
    other than the compressor's own, and the ``name`` that a mismatch error shows."""

    compressor: _compression.Compressor
    state: dict | None = None
    shapes: tuple | None = None
    strategy: str | None = None
    name: str = ""

    @staticmethod
    def of(compression, state: dict | None, shape: tuple = ()) -> "Compressed | None":
        """From the core API's ``compression=`` (None: no compression) and ``compression_state=``; a
        tensor of two or more dimensions is one matrix to a compressor with its own schedule (PowerSGD:
        rows are dim 0), as a DDP bucket's parameters are. ``shape``: the tensor's (callers pass ``()``
        for a non-tensor, which the argument checks then reject)."""
        if compression is None:
            return None
        return Compressed(_compression.get(compression), state, (tuple(shape),) if len(shape) >= 2 else None)


def allreduce_(ch: Channel, flat: torch.Tensor, red: Reduction, algorithm: str = AUTO, pre: float = 1.0,
               post: float = 1.0, meta: Meta | None = None, compressed: Compressed | None = None) -> str:
    """All-reduce ``flat`` (contiguous 1-D) in place over ``ch``: the engine's one entry (see the module
    doc for the paths). Returns what ran: ``"small"`` for the transport's small-message path,
    ``"compressed"``, the algorithm of the schedule (or ``"native"``), ``""`` when nothing moved.
    ``algorithm``: ``"auto"`` or a forced name (:func:`ringlet.tuning.select.requested`); ``meta``: this
    member's record, compared with every member's first (None: no check); ``compressed``: the
    compression (sum and average of floating tensors only; the caller checked that)."""
    if compressed is not None:
        if meta is not None:
            agree.agree(ch, meta)
        ops.scale_(flat, pre)
        compressed_allreduce_(ch, flat, compressed.compressor, compressed.state, red.averages, compressed.shapes,
                              strategy=compressed.strategy, algorithm=algorithm)
        ops.scale_(flat, post)
        return "compressed"
    how = small.carrier(ch) if algorithm == AUTO else None
    if how is not None and flat.numel() * flat.element_size() <= ch.transport.capabilities.small_bytes:
        src = None if pre == 1.0 else ops.scale_(flat.clone(), pre)
        small.allreduce_(ch, flat, red, meta, src, how=how)
        ops.finish_(flat, red, ch.size, post)
        return "small"
    if meta is not None:
        agree.agree(ch, meta)
    return ops.allreduce_(ch, flat, red, algorithm, pre, post)
