"""The one small exchange, and agreeing on an op's metadata before its data moves.

:func:`exchange` all-gathers one fixed-size byte slot per member: the core API's metadata records,
the Horovod coordinator's negotiation messages and the runtime's hostnames all travel through it.
:func:`agree` is the core API's check. Where the group has a small-message path
(:func:`ringlet.engine.small.carrier`: shared memory's mailbox, or MPI's point-to-point)
the records travel over it, as the small all-reduce carries its own in band, so that members calling
different ops meet in the same messages. Elsewhere, on transports with a cheap native all-reduce
(``capabilities.native_digest``) the members first compare a 62-bit digest of their records in one tiny
all-reduce (:func:`digest_agrees`, which also carries an all-to-all's check of its receive counts), and exchange the records themselves only when the digests differ (to name the
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


#: The primes an all-to-all's count residuals are taken modulo (:mod:`ringlet.engine.a2a_counts`): below
#: 2^31, so that a weight times a count fits an int64, and the sum of the members' residuals too.
MODULI = (2147483647, 2147483629)
_DIGEST_PARTS, _PART_BITS = 3, 21  # a 62-bit digest as three 21-bit parts: sums of squares fit an int64


def digest_agrees(ch: Channel, meta: Meta, residual: tuple[int, int] = (0, 0)) -> bool:
    """True when every member's record has the same digest and the members' ``residual`` pairs sum to
    zero modulo :data:`MODULI` (an all-to-all's check of its receive counts;
    every other op passes zeros), by one native all-reduce (SUM) of 8 int64: the digest's three 21-bit
    parts ``a``, their squares and the residuals. The parts agree exactly when ``p·Σa² = (Σa)²``
    (equality in Cauchy-Schwarz: all equal). False when anything differs or the transport has no
    native all-reduce. Every checked op opens with this same all-reduce, so that members calling
    different ops meet in it. The result is the same on every member."""
    d, mask = meta.digest(), (1 << _PART_BITS) - 1
    parts = [(d >> (_PART_BITS * i)) & mask for i in range(_DIGEST_PARTS)]
    buf = torch.tensor(parts + [a * a for a in parts] + list(residual), dtype=torch.int64)
    if not ch.transport.native_allreduce(buf, ReduceOp.SUM, ch.peers):
        return False
    v, p = buf.tolist(), ch.size
    same = all(p * v[_DIGEST_PARTS + i] == v[i] * v[i] for i in range(_DIGEST_PARTS))
    return same and all(r % q == 0 for r, q in zip(v[2 * _DIGEST_PARTS:], MODULI))


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
