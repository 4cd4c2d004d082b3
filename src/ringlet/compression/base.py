"""The compressor protocol: what a flat buffer looks like on the wire.

A compressor turns a contiguous 1-D floating tensor (a bucket, a gradient, a block of one) into a
**payload** — a 1-D ``torch.uint8`` tensor, exactly the bytes that travel — and a **context**, the
local facts :meth:`Compressor.decompress` needs to undo it (element count, dtype; never sent)::

    payload, ctx = comp.compress(flat, state)
    approx = comp.decompress(payload, ctx)      # float32, flat.numel() elements
    comp.wire_bytes(flat.numel()) == payload.numel()

Contract every compressor keeps:

* ``wire_bytes(n)`` depends on ``n`` alone, so every rank knows the size of every other rank's payload
  without exchanging it (top-k's ``k`` is a fixed fraction of ``n``).
* ``decompress`` returns float32 and so does :meth:`Compressor.accumulate_`, which adds a payload's
  values into a float32 accumulator: reductions over compressed payloads sum in float32 (no float16
  overflow, no int8 saturation while summing).
* A compressor object is stateless and may be shared by every bucket. What must persist between steps
  (error-feedback residuals, PowerSGD's warm-started ``Q``, a generator for stochastic rounding) lives in
  the caller's ``state`` dict, passed to every call; stateless compressors ignore it. The caller gives
  the same dict to the same input position every step (a collective that compresses a bucket block by
  block keeps one sub-dict per block and phase inside the bucket's state). A compressor may keep its
  payload's memory in that dict: a payload stays valid until the next ``compress`` with the same state.
* ``reduces_by`` says how a compressed all-reduce moves payloads: ``"scatter"`` (dense payloads: each
  rank reduces one block of everyone's payloads in float32, then the reduced blocks are compressed again
  and all-gathered), ``"gather"`` (sparse payloads: every rank's whole payload is all-gathered and
  accumulated; never densified before sending), ``"sum"`` (payloads that are linear in the input and
  may be all-reduced as float32 tensors themselves: ``none``), or ``"custom"`` (the compressor runs its own
  schedule of collectives through :meth:`Compressor.allreduce_`: PowerSGD).
* ``lossless``: decompress(compress(x)) == x for every float32 ``x`` (``none`` only).
* ``decompress`` and ``accumulate_`` accept a payload at any byte offset (a slice of a larger receive
  buffer); they raise ``ValueError`` when its size is not ``wire_bytes`` of the context's element count
  (``none``, ``fp16`` and ``bf16`` leave that check to the caller).

Errors: ``TypeError`` for a non-floating or non-contiguous input, ``ValueError`` for bad parameters
(at construction).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["Compressor", "check_input"]


def check_input(flat: torch.Tensor, who: str) -> None:
    """``TypeError`` unless ``flat`` is a contiguous 1-D floating tensor."""
    if not isinstance(flat, torch.Tensor):
        raise TypeError(f"{who}: expected a torch.Tensor, got {type(flat).__name__}")
    if not flat.is_floating_point():
        raise TypeError(f"{who}: compresses floating tensors only, got {flat.dtype}")
    if flat.dim() != 1 or not flat.is_contiguous():
        raise TypeError(f"{who}: expects a contiguous 1-D tensor (flatten it first), got shape {tuple(flat.shape)}")


class Compressor:
    """Base of every compressor (see the module doc for the contract). Subclasses set ``name``,
    ``reduces_by`` and ``lossless`` and implement :meth:`compress`, :meth:`decompress` and
    :meth:`wire_bytes`; sparse ones override :meth:`accumulate_`, custom ones :meth:`allreduce_`."""

    name: str = "compressor"
    reduces_by: str = "scatter"
    lossless: bool = False

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        """``(payload, ctx)``: the uint8 bytes to send for ``flat`` and what decompressing needs."""
        raise NotImplementedError

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The float32 approximation of the ``flat`` that :meth:`compress` was given."""
        raise NotImplementedError

    def wire_bytes(self, numel: int) -> int:
        """The payload's size in bytes for an input of ``numel`` elements."""
        raise NotImplementedError

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``acc += decompress(payload, ctx)`` in float32 (``acc``: float32, the input's numel)."""
        return acc.add_(self.decompress(payload, ctx))

    def allreduce_(self, flat: torch.Tensor, state: dict, allreduce: Callable[[torch.Tensor], None],
                   shapes: list[tuple[int, ...]] | None = None) -> torch.Tensor:
        """For ``reduces_by == "custom"``: replace ``flat`` by the sum over ranks of its approximation,
        calling ``allreduce(t)`` (an in-place float32 SUM over the group, the same calls in the same order on
        every rank) as often as the method needs. ``shapes``: the tensors ``flat`` concatenates, in order
        (``None``: one 1-D tensor)."""
        raise NotImplementedError(f"{self.name} has no schedule of its own (reduces_by={self.reduces_by!r})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
