"""Compressed reduce-scatter: a flat floating buffer cut into ragged blocks, one per member, where each
member ends with the sum (or average) over the group of its own block, and every byte that travels is a
payload of a :class:`~ringlet.compression.base.Compressor`.

:func:`compressed_reduce_scatter_` compresses every other member's block of this member's buffer (block
``j``: ``counts[j]`` elements after the lower members' blocks) with that block's own state (``state[("rs",
j)]``, the same sub-dict every call, where error-feedback residuals live), and an all-to-all hands block
``j``'s payloads to member ``j``. The owner adds them and its own block in float32, in member order, and
averages when asked (one correctly rounded division by ``p``). A member's own block never travels
and is never compressed: it enters the sum exactly. ``(p-1)/p`` of a payload sent per member, one
quantisation of every contribution that travels; nothing is exchanged but the payloads
(``compressor.wire_bytes(counts[j])`` tells every member every payload's size).

Compressors: dense ones (``reduces_by`` ``"scatter"`` or ``"sum"``: ``none``, ``fp16``, ``bf16``,
``int8``) and sparse ones (``"gather"``: ``topk``, which then keeps the largest ``k`` of each block, ``k`` a
fraction of the block's size, and sends only those pairs; the owner adds them with ``accumulate_``, never
densifying them before they travel), with or without
:class:`~ringlet.compression.error_feedback.ErrorFeedback`. Compressors with a schedule of their own
(``"custom"``: PowerSGD) are refused: a low-rank all-reduce approximates whole matrices on every member,
which a reduce-scatter of ragged blocks of a flat buffer does not have.

Tags: one call uses the channel's steps ``[0, p)`` (the all-to-all). Memory: the byte buffers the
payloads travel in are kept in the channel's workspace between calls.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..compression.base import check_input
from . import ops
from .channel import Channel
from .payloads import Blocks, Contexts, put_payload, starts, workspace_bytes

if TYPE_CHECKING:
    from ..compression.base import Compressor

__all__ = ["check_compressor", "describe", "compressed_reduce_scatter_"]

_SUPPORTED = ("scatter", "sum", "gather")


def check_compressor(compressor: Compressor) -> None:
    """``ValueError`` unless a compressed reduce-scatter can use ``compressor`` (not one with its own
    schedule, such as PowerSGD)."""
    if compressor.reduces_by not in _SUPPORTED:
        raise ValueError(f"a compressed reduce-scatter cannot use {compressor.name!r}: it runs its own all-reduce "
                         f"schedule (reduces_by={compressor.reduces_by!r}) over whole matrices, and a reduce-scatter "
                         "hands each rank one block of a flat buffer; use a dense (fp16, bf16, int8) or sparse "
                         "(topk) compressor, with or without +ef")


def describe(compressor: Compressor, counts: Sequence[int]) -> str:
    """What every member must agree on, as a short string for the metadata record: the compressor's name
    and the payload bytes of every block."""
    return f"{compressor.name} rs {sum(compressor.wire_bytes(c) for c in counts if c)}B"


def compressed_reduce_scatter_(ch: Channel, flat: torch.Tensor, counts: Sequence[int], compressor: Compressor,
                               state: dict | None, average: bool) -> torch.Tensor:
    """This member's block of the sum over the group of ``flat``'s compressed approximations (its own
    block exact), divided by the group size when ``average``: a new float32 tensor of ``counts[rank]``
    elements. ``flat`` (contiguous 1-D floating, ``sum(counts)`` elements, ``counts`` in member order) is
    read, not written. ``state``: the caller's dict for this buffer, the same every call (None: a fresh
    one, no memory between calls). ``TypeError`` for a non-floating input; ``ValueError`` for counts that
    do not cut ``flat`` into one block per member, for a compressor with its own schedule and for a
    payload whose size is not ``wire_bytes``. Every member must pass the same counts and compressor."""
    check_input(flat, "compressed reduce-scatter")
    check_compressor(compressor)
    p, me = ch.size, ch.rank
    if len(counts) != p or sum(counts) != flat.numel() or min(counts, default=0) < 0:
        raise ValueError(f"counts {list(counts)} do not cut {flat.numel()} elements into {p} blocks")
    state = {} if state is None else state
    blocks = Blocks.of_counts(counts, compressor)
    acc = blocks.elems(flat, me).to(torch.float32, copy=True)
    if p > 1 and flat.numel() > 0:
        ctxs = Contexts(compressor, flat.device)
        recv = _exchange(ch, flat, blocks, ctxs, state)
        acc = _accumulate(blocks, ctxs, recv, acc, me)
    return acc.div_(p) if average else acc


def _exchange(ch: Channel, flat: torch.Tensor, blocks: Blocks, ctxs: Contexts, state: dict) -> torch.Tensor:
    """Compress every other member's block and hand the payloads to their owners; returns the payloads
    of this member's block from every other member, in member order."""
    p, me, dev = ch.size, ch.rank, flat.device
    # Member s sends wire[d] bytes to every d != s and nothing to itself.
    sends = [[0 if d == s else blocks.wire[d] for d in range(p)] for s in range(p)]
    mine = sends[me]
    offsets = starts(mine)
    send = workspace_bytes(ch, ("engine.compressed_rs", "send", dev), sum(mine), dev)
    for d in range(p):
        if mine[d]:
            block = blocks.elems(flat, d)
            block = block if block.dtype == torch.float32 else block.float()
            payload = ctxs.compress(block, state.setdefault(("rs", d), {}))
            put_payload(send[offsets[d]:offsets[d] + mine[d]], payload, ctxs.comp)
    out = workspace_bytes(ch, ("engine.compressed_rs", "recv", dev), (p - 1) * blocks.wire[me], dev)
    recv, _ = ops.alltoall_rows(ch, send, sends, out)
    return recv


def _accumulate(blocks: Blocks, ctxs: Contexts, recv: torch.Tensor, own: torch.Tensor, me: int) -> torch.Tensor:
    """The float32 sum, in member order, of every member's contribution to block ``me``: the received
    payloads (from every member but this one, in member order) and this member's ``own`` block."""
    n, w = blocks.counts[me], blocks.wire[me]
    if n == 0:
        return own
    ctx = ctxs.of(n)
    acc = torch.zeros(n, dtype=torch.float32, device=own.device)
    at = 0
    for s in range(len(blocks.counts)):
        if s == me:
            acc.add_(own)
        else:
            ctxs.comp.accumulate_(acc, recv[at:at + w], ctx)
            at += w
    return acc
