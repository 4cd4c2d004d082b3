"""The one small exchange, and agreeing on an op's metadata before its data moves.

:func:`exchange` all-gathers one fixed-size byte slot per member: the core API's metadata records,
the Horovod coordinator's negotiation messages and the runtime's hostnames all travel through it.
:func:`agree` is the core API's check. Where the group has a small-message path
(:func:`ringlet.engine.small.carrier`: shared memory's mailbox, or MPI's point-to-point)
the records travel over it, as the small all-reduce carries its own in band, so that members calling
different ops meet in the same messages. Elsewhere, on transports with a cheap native all-reduce
(``capabilities.native_digest``) the members first compare a 62-bit digest of their records in one tiny
all-reduce, and exchange the records themselves only when the digests differ (to name the
mismatch); elsewhere they exchange the records at once. A disagreement raises the same
:class:`~ringlet.types.MismatchError` on every member, and nothing else has moved.
"""
from __future__ import annotations

import dataclasses
import zlib

import torch

from ..algorithms import direct, ring
from ..types import MismatchError, ReduceOp
from . import small
from .channel import Channel
from .meta import Meta, mismatch

_DIRECT_UP_TO = 16  # members; beyond that the all-gather of slots goes round the ring
_RECORD_SLOT = 320  # bytes of a record without splits: header, up to 16 dims, a name of up to 64 bytes, a
                   # forced algorithm name, a compression
_MAX_DIMS = 16
_MAX_NAME = 64


def exchange(ch: Channel, payload: bytes, slot: int) -> list[bytes]:
    """Every member's ``payload`` (at most ``slot`` bytes, zero-padded), in group-rank order. Every
    member must pass the same ``slot``; ``ValueError`` when this one's payload does not fit."""
    if len(payload) > slot:
        raise ValueError(f"exchange: {len(payload)} bytes do not fit a slot of {slot}")
    p = ch.size
    buf = torch.zeros(p * slot, dtype=torch.uint8)
    if payload:
        buf[ch.rank * slot:ch.rank * slot + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    if p > 1:
        sizes = tuple([slot] * p)
        sched = direct.allgather(p, sizes) if p <= _DIRECT_UP_TO else ring.allgather(p, sizes)
        ch.run(sched, (buf,))
    raw = buf.numpy().tobytes()
    return [raw[r * slot:(r + 1) * slot] for r in range(p)]


def digest_agrees(ch: Channel, meta: Meta) -> bool:
    """True when every member's record has the same digest, by one native all-reduce (MAX) of
    ``[d, -d]``; False when they differ or the transport has no native all-reduce. The result is the
    same on every member."""
    d = meta.digest()
    buf = torch.tensor([d, -d], dtype=torch.int64)
    if not ch.transport.native_allreduce(buf, ReduceOp.MAX, ch.peers):
        return False
    return int(buf[0]) == -int(buf[1])


def _clipped(meta: Meta) -> Meta:
    """The record with at most 16 dimensions and a name of at most 64 bytes, so that it fits a slot.
    What is cut keeps a fingerprint, so that records which differ only there still differ: dimensions
    from the 15th on become their product followed by a negative entry (a crc of them), a long name
    its first bytes followed by a crc of the whole."""
    if len(meta.shape) <= _MAX_DIMS and len(meta.name.encode()) <= _MAX_NAME:
        return meta
    shape = meta.shape
    if len(shape) > _MAX_DIMS:
        tail = 1
        for s in shape[_MAX_DIMS - 2:]:
            tail *= s
        shape = shape[:_MAX_DIMS - 2] + (tail, -1 - zlib.crc32(repr(shape[_MAX_DIMS - 2:]).encode()))
    name = meta.name.encode()
    if len(name) > _MAX_NAME:
        name = name[:_MAX_NAME - 9] + b"~" + b"%08x" % zlib.crc32(name)
    return dataclasses.replace(meta, name=name.decode(errors="ignore"), shape=shape)


def exchange_records(ch: Channel, meta: Meta) -> list[Meta]:
    """Every member's record, in group-rank order (on the channel's metadata tags)."""
    # Sized by the group, not by this record, so that members calling different ops still agree on it.
    slot = _RECORD_SLOT + 8 * ch.size
    meta = _clipped(meta)
    raws = exchange(ch.meta(), meta.encode(), slot)
    return [Meta.decode(raw)[0] for raw in raws]


def verify(ch: Channel, metas: list[Meta]) -> None:
    """Raise :class:`MismatchError` (the same on every member) unless the records agree."""
    msg = mismatch({ch.peers[i]: m for i, m in enumerate(metas)})
    if msg is not None:
        raise MismatchError(msg)


def agree(ch: Channel, meta: Meta, *, check: bool = True) -> list[Meta] | None:
    """Make sure every member called the same op: ``None`` when the digests agree (nothing exchanged),
    else every member's record in group-rank order, verified when ``check`` (a ragged all-gather needs
    the records for its sizes even unchecked). Single-member groups return None."""
    if ch.size == 1:
        return None
    if small.carrier(ch) is not None:  # where small all-reduces check in band, every op agrees there too
        return small.records(ch, meta, check=check)
    if ch.transport.capabilities.native_digest and digest_agrees(ch, meta):
        return None
    # The digest result is the same everywhere, so every member gets here or none does.
    metas = exchange_records(ch, meta)
    if check:
        verify(ch, metas)
    return metas


def records(ch: Channel, meta: Meta, *, check: bool = True) -> list[Meta]:
    """Every member's record, always exchanged (all-to-all needs everyone's splits). On ``native_digest``
    transports it still takes part in the digest all-reduce every checked op opens with, so that a
    member calling another op meets it there and both reach the record exchange, where the mismatch is
    named, instead of waiting in different channels."""
    if ch.size == 1:
        return [meta]
    if small.carrier(ch) is not None:
        return small.records(ch, meta, check=check)
    if check and ch.transport.capabilities.native_digest:
        digest_agrees(ch, meta)
    metas = exchange_records(ch, meta)
    if check:
        verify(ch, metas)
    return metas
