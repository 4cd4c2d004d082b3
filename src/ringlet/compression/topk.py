"""``topk``: only the ``k`` largest magnitudes travel, as (index, value) pairs.

For an input of ``n > 0`` elements ``k = max(1, ceil(fraction * n))`` (``k = 0`` for ``n = 0``), a function
of ``n`` alone, so every rank knows every payload's size. Decompression puts the ``k`` values back at
their indices and zeros elsewhere; the others are dropped (wrap it in
:class:`~ringlet.compression.error_feedback.ErrorFeedback` to carry them over to the next step).

Payload layout (``wire_bytes(n) = 8 * k`` bytes)::

    [ indices: k int32 | values: k float32 ]

Indices are distinct, in no particular order; ties between equal magnitudes are broken as
``torch.topk`` breaks them (not necessarily the same way on every device). Inputs of at least
:data:`SAMPLED_FROM` elements find the same set faster (``torch.topk`` over millions of elements costs
hundreds of milliseconds on a CPU): a threshold read off a strided sample admits about ``1.25 k``
candidates in one pass, and ``torch.topk`` runs over those; when fewer than ``k`` pass (a misleading
sample) it falls back to the whole input. Everything not admitted is below every candidate, so the
result is the exact top ``k`` either way. With a ``state`` the magnitudes are computed into a buffer kept
there (``state["abs"]``), not a new bucket-sized tensor each step. NaN ranks above every number
(``torch.topk``'s order) and Inf above every finite value, so non-finite inputs are always among the
values sent. ``reduces_by = "gather"``: payloads are gathered whole and summed with
:meth:`TopK.accumulate_` (``index_add_``); compressing never builds a dense tensor.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ._common import check_payload, typed
from .base import Compressor, check_input

__all__ = ["TopK"]

_MAX_NUMEL = 2 ** 31 - 1  # indices travel as int32
SAMPLED_FROM = 1 << 20
_SAMPLE = 1 << 16  # about this many elements in the sample
_MARGIN = 1.25


def _magnitudes(flat: torch.Tensor, state: dict | None) -> torch.Tensor:
    if state is None:
        return flat.abs()
    buf = state.get("abs")
    if buf is None or buf.shape != flat.shape or buf.dtype != flat.dtype or buf.device != flat.device:
        buf = state["abs"] = torch.empty_like(flat)
    return torch.abs(flat, out=buf)


def top_indices(mag: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest entries of ``mag`` (magnitudes; NaN counts as largest), in no
    particular order: ``torch.topk`` on small inputs, a sampled threshold first on large ones."""
    n = mag.numel()
    if n < SAMPLED_FROM or _MARGIN * k * 4 > n:
        return torch.topk(mag, k, sorted=False).indices
    sample = mag[::max(1, n // _SAMPLE)]
    keep = min(sample.numel(), max(1, math.ceil(_MARGIN * k * sample.numel() / n)))
    threshold = torch.topk(sample, keep, sorted=False).values.min()
    cand = torch.nonzero(~(mag < threshold)).squeeze(1)  # NaN compares False: always a candidate
    if cand.numel() < k:
        return torch.topk(mag, k, sorted=False).indices
    return cand[torch.topk(mag[cand], k, sorted=False).indices]


class TopK(Compressor):
    """Top-``k`` sparsification (see the module doc). ``fraction``: the share of elements sent, in
    ``(0, 1]``; ``ValueError`` otherwise, and for inputs of more than ``2**31 - 1`` elements."""

    reduces_by = "gather"

    def __init__(self, fraction: float = 0.01):
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"TopK fraction must be in (0, 1], got {fraction!r}")
        self.fraction = float(fraction)
        self.name = "topk" if self.fraction == 0.01 else f"topk:{self.fraction:g}"

    def k(self, numel: int) -> int:
        """How many elements an input of ``numel`` elements sends."""
        return 0 if numel <= 0 else max(1, min(numel, math.ceil(self.fraction * numel)))

    def wire_bytes(self, numel: int) -> int:
        return 8 * self.k(numel)

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        n = flat.numel()
        if n > _MAX_NUMEL:
            raise ValueError(f"{self.name}: {n} elements exceed what int32 indices address ({_MAX_NUMEL})")
        k = self.k(n)
        index = top_indices(_magnitudes(flat, state), k) if k else torch.empty(0, dtype=torch.long)
        payload = torch.empty(8 * k, dtype=torch.uint8, device=flat.device)
        payload[:4 * k].view(torch.int32).copy_(index)
        payload[4 * k:].view(torch.float32).copy_(flat[index])
        return payload, n

    def _split(self, payload: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        n = int(ctx)
        k = self.k(n)
        check_payload(payload, 8 * k, self.name)
        return typed(payload[:4 * k], torch.int32), typed(payload[4 * k:], torch.float32), n

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        index, values, n = self._split(payload, ctx)
        out = torch.zeros(n, dtype=torch.float32, device=payload.device)
        return out.index_put_((index.long(),), values)

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        index, values, _ = self._split(payload, ctx)
        return acc.index_add_(0, index, values)

    def __repr__(self) -> str:
        return f"TopK(fraction={self.fraction:g})"
