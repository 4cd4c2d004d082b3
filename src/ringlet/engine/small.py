"""The transport's small-message path: an all-reduce with the metadata check in the same messages.

The op's metadata record (:class:`~ringlet.engine.meta.Meta`, encoded) travels in front of the vector;
every member ends with every member's record, compares them (raising the same
:class:`~ringlet.types.MismatchError` everywhere when they differ, before ``flat`` is written) and holds
the reduction, with the same bits on every member. Up to the transport's ``capabilities.small_bytes``.

Each transport declares at most one path (``capabilities.small_path``), so there is one per transport:

* ``mailbox`` (shared memory): :meth:`~ringlet.transport.shm.ShmTransport.small_round`, world group
  only, one round: each member copies its vector into its own slot, the last to publish wakes the
  others, and every member reduces the ``p`` slots in rank order. A mismatch of sizes is seen in the
  records before any payload is read.
* ``p2p`` (MPI): recursive doubling over ``irecv_upto`` with every member's record carried in band
  (:mod:`._rd_inband`): ``⌈log₂p⌉`` rounds, no round of its own for the check. On the emulated
  1 Gbit/s cluster it beat a one-round exchange, whose ``(p-1)`` incoming messages share one capped
  link and cost more CPU, and MPI's own all-reduce behind a digest round.

:func:`carrier` says which applies to a channel (or ``None``: the schedules), :func:`takes` whether it
takes a message of a given size, :func:`allreduce_` runs it, :func:`records` exchanges the records only
(the check of a collective that moves its data elsewhere, over the same messages).
"""
from __future__ import annotations

import struct

import numpy as np
import torch

from ..types import MismatchError, Reduction
from ._rd_inband import NP_DTYPES, NP_OPS, allreduce_rd
from .channel import Channel
from .meta import Meta, mismatch


def carrier(ch: Channel) -> str | None:
    """The small-message path of ``ch``'s group: ``"mailbox"`` (the transport declares it and the group
    is the runtime's world group: the mailbox is one per process, without tags, and only the world's
    ops run one at a time), ``"p2p"`` (declared; any group), or ``None`` (the schedules; also for a
    group of one). Where there is one, every checked collective agrees through :func:`records` on it,
    so that members calling different ops meet in the same messages.

    Over point-to-point a dead peer can hide behind a live one that stopped on its error (recursive
    doubling's indirect dependencies), as in every schedule; the liveness monitor names it. The mailbox
    watches every peer itself."""
    tr = ch.transport
    path = tr.capabilities.small_path
    if ch.size < 2 or path is None:
        return None
    if path == "mailbox" and not (ch.group.id == 0 and ch.size == tr.size):
        return None
    return path


def takes(ch: Channel, nbytes: int) -> bool:
    """True when ``ch``'s group has a small-message path and it takes ``nbytes`` of payload."""
    return carrier(ch) is not None and nbytes <= ch.transport.capabilities.small_bytes


def allreduce_(ch: Channel, flat: torch.Tensor, red: Reduction, meta: Meta | None,
               src: torch.Tensor | None = None, *, how: str | None = None) -> None:
    """``flat`` (1-D, contiguous) becomes the reduction (not yet averaged) of every member's vector over
    the group's small-message path (:func:`takes` must hold; ``how``: :func:`carrier`'s answer when the
    caller has it). This member's vector is ``src`` (same dtype and size, e.g. a prescaled copy) or
    ``flat`` itself. With ``meta``, every member checks every record first and raises the same
    MismatchError on all members if any differs; without it, only the sizes are compared. ``flat`` is
    written only after the check passed."""
    how = carrier(ch) if how is None else how
    if how is None:
        raise ValueError(f"the {ch.transport.name} transport has no small-message path for this group")
    rec = b"" if meta is None else meta.encode()
    if src is not None and (src.dtype != flat.dtype or src.numel() != flat.numel()):
        raise ValueError("src must have flat's dtype and size")
    if how == "mailbox":
        _mailbox(ch, flat, red, rec, flat if src is None else src)
        return
    entries, acc = allreduce_rd(ch, flat, red, rec, src, ch.transport.capabilities.small_bytes)
    nbytes = flat.numel() * flat.element_size()
    if any(n != nbytes or r != rec for n, r in entries):
        _mismatch(ch, [r for _, r in entries] if rec else [], [n for n, _ in entries])
    if nbytes:
        flat.copy_(acc)


def exchange_records(ch: Channel, meta: Meta) -> list[tuple[int, bytes]]:
    """Every member's ``(payload bytes, encoded record)`` in group-rank order over the group's
    small-message path (``mailbox``: one round, no payload; ``p2p``: the in-band rounds without a
    vector). Nothing is compared."""
    how, rec = carrier(ch), meta.encode()
    if how == "mailbox":
        seq = ch.transport.small_round(rec, None, ch.timeout)
        box = ch.transport.mailbox
        return [(box.payload_bytes(q, seq), box.record(q, seq)) for q in range(ch.size)]
    if how == "p2p":
        return allreduce_rd(ch, None, None, rec, None, ch.transport.capabilities.small_bytes)[0]
    raise ValueError(f"the {ch.transport.name} transport has no small-message path for this group")


def records(ch: Channel, meta: Meta, *, check: bool = True) -> list[Meta]:
    """Every member's record, in group-rank order, over the group's small-message path; with
    ``check``, the same MismatchError on every member when the records disagree
    (:func:`ringlet.engine.meta.mismatch`: a ragged all-gather's first dimensions may differ) or a
    member sent a vector (it called the small all-reduce)."""
    entries = exchange_records(ch, meta)
    if check and any(n for n, _ in entries):
        _mismatch(ch, [r for _, r in entries], [n for n, _ in entries])
    metas = [Meta.decode(r)[0] for _, r in entries]
    msg = mismatch({ch.peers[i]: m for i, m in enumerate(metas)}) if check else None
    if msg is not None:
        raise MismatchError(msg)
    return metas


def _mismatch(ch: Channel, recs: list[bytes], sizes: list[int]) -> None:
    """Raise the MismatchError every member raises for the same records and sizes."""
    if recs and all(recs):
        try:
            msg = mismatch({ch.peers[i]: Meta.decode(r)[0] for i, r in enumerate(recs)})
        except (struct.error, UnicodeDecodeError, IndexError, ValueError):
            msg = None  # a record cut short by a receive sized for ours: the sizes say enough
        if msg is not None:
            raise MismatchError(msg)
    raise MismatchError(f"Mismatched all-reduce inputs: ranks {list(ch.peers)} sent {sizes} bytes "
                        "(or a different collective).")


def _reduce_in_order(flat: torch.Tensor, views: list, red: Reduction) -> None:
    """``flat = views[0] op views[1] op ...``: the same order, hence the same bits, on every member.
    ``views`` are numpy arrays when ``flat``'s dtype is in ``NP_DTYPES``, else tensors."""
    if flat.dtype in NP_DTYPES:
        out, fn = flat.numpy(), NP_OPS[red.op]
        with np.errstate(all="ignore"):  # overflow to inf is the caller's business, as with torch
            fn(views[0], views[1], out=out)
            for v in views[2:]:
                fn(out, v, out=out)
        return
    flat.copy_(views[0])
    for v in views[1:]:
        red.combine(flat, v)


def _mailbox(ch: Channel, flat: torch.Tensor, red: Reduction, rec: bytes, src: torch.Tensor) -> None:
    tr = ch.transport
    seq = tr.small_round(rec, src, ch.timeout)
    box = tr.mailbox
    nbytes = flat.numel() * flat.element_size()
    if not box.agree(seq, rec, nbytes):
        sizes = [box.payload_bytes(q, seq) for q in range(ch.size)]
        _mismatch(ch, [box.record(q, seq) for q in range(ch.size)] if rec else [], sizes)
    if not nbytes:
        return
    dt = flat.dtype
    # Our own contribution is read back from our slot: ``flat`` is overwritten with the result.
    _reduce_in_order(flat, box.payloads(seq, dt, flat.numel(), dt in NP_DTYPES), red)
