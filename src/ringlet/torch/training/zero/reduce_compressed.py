"""ZeRO's reduce-scatter with compressed gradients: :class:`CompressedReducer`.

Gradients travel as a compressor's payloads (:meth:`ringlet.torch.comm.Comm.reduce_scatter_compressed_flat_`:
each rank compresses every other rank's block of the bucket, the owner adds them and its own block, exact,
in float32 and averages); the parameters' all-gather stays exact, so every rank's parameters stay
bitwise identical. With :class:`~ringlet.compression.ErrorFeedback` (``"int8+ef"``, ``"topk+ef"``) what a
block's compression dropped is added to that block's next step: the residuals live in the bucket's
``state`` dict, one sub-dict per destination block, so the sum of the reduced blocks over steps approaches
the exact sum.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ringlet import compression as _compression
from ringlet.engine.compressed_rs import check_compressor
from ringlet.types import ReduceOp

from ...comm import Comm, CommFuture
from .reduce import Reducer

__all__ = ["CompressedReducer", "compressor_for_buckets"]


def compressor_for_buckets(compression) -> _compression.Compressor:
    """The compressor of ``compression`` (a name or a :class:`~ringlet.compression.Compressor`) for
    reducing ZeRO buckets: ``ValueError`` for one with its own schedule (PowerSGD: a low-rank all-reduce
    of whole matrices, which a sharded bucket's blocks are not) and for an unknown name, ``TypeError``
    for anything else."""
    comp = _compression.get(compression)
    check_compressor(comp)
    return comp


def needs_state(comp: _compression.Compressor, state: dict | None) -> None:
    """``ValueError`` when ``comp`` keeps error-feedback residuals and ``state`` is not the bucket's dict."""
    if isinstance(comp, _compression.ErrorFeedback) and state is None:
        raise ValueError(f"{comp.name} keeps error-feedback residuals in the bucket's state: pass the bucket's "
                         "own dict (the same one every step) as state")


class CompressedReducer(Reducer):
    """:class:`~ringlet.torch.training.zero.reduce.Reducer` (the whole group shares the shards) whose
    reduce-scatter sends compressed payloads. ``compression``: ``"fp16"``, ``"bf16"``, ``"int8"``,
    ``"topk"`` (the largest ``k`` of each block), ``"none"``, any of them with ``+ef``, or a
    :class:`~ringlet.compression.Compressor` (see :func:`compressor_for_buckets` for what is refused).

    :meth:`reduce_scatter_`'s value is this rank's block of ``flat`` in the bucket's dtype (computed in
    float32 and rounded once); the rest of ``flat`` is left as it was. ``ValueError`` when an
    error-feedback compressor is given no ``state``."""

    def __init__(self, comm: Comm, compression):
        super().__init__(comm)
        self.compressor = compressor_for_buckets(compression)

    def reduce_scatter_(self, flat: torch.Tensor, counts: Sequence[int], name: str, state: dict | None = None,
                        *, check: bool = False) -> CommFuture:
        needs_state(self.compressor, state)
        return self.comm.reduce_scatter_compressed_flat_(flat, counts, self.compressor, state, ReduceOp.AVG, name,
                                                         check=check)

    def __repr__(self) -> str:
        return f"CompressedReducer({self.compressor!r}, world={self.world})"
