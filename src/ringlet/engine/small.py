"""The small-message all-reduce with the metadata check in the same messages (no round of its own).

The op's metadata record (:class:`~ringlet.engine.meta.Meta`, encoded) travels in front of the vector; every member ends
with every member's record, compares them (raising the same :class:`~ringlet.types.MismatchError`
everywhere when they differ, before ``flat`` is written) and holds the reduction, with the same bits
on every member. Up to :data:`P2P_MAX_BYTES` / the mailbox's 64 KiB.

Three carriers:

* ``mailbox``: the shm transport's :meth:`~ringlet.transport.shm.ShmTransport.small_round` (world
  groups only), one round: each member copies its vector into its own slot, the last to publish
  wakes the others, and every member reduces the ``p`` slots in rank order. A mismatch of sizes is
  seen in the records before any payload is read.
* ``p2p-rd`` (the collectives' carrier on MPI; on request on any transport with ``irecv_upto``):
  recursive doubling with every member's record carried in band (:mod:`._rd_inband`): ``⌈log₂p⌉``
  rounds, no round of its own for the check. On the emulated 1 Gbit/s cluster it beat the one-round
  ``p2p``, whose ``(p-1)`` incoming messages share one capped link and cost more CPU, and MPI's own
  all-reduce behind a digest round.
* ``p2p``: one round, one message per peer, received into a buffer of :data:`P2P_MAX_BYTES` so that a
  peer with another size is named by its record instead of failing the receive; reduced in rank order.

:func:`carrier` says which one applies (or ``None``: use the schedules); :func:`allreduce_` runs it.
"""
from __future__ import annotations

import struct

import numpy as np
import torch

from ..types import MismatchError, Reduction
from ._rd_inband import NP_DTYPES, NP_OPS, allreduce_rd
from .channel import Channel
from .meta import Meta, mismatch

P2P_MAX_BYTES = 64 << 10  # payload limit of the p2p carriers (one receive buffer per peer of this size)
_HDR = 8  # p2p frame: payload bytes (int64), then the record, then the payload


def carrier(ch: Channel, nbytes: int, limit: int | None = None, *, p2p: bool = False) -> str | None:
    """``"mailbox"`` (shm, the runtime's world group), ``"p2p-rd"`` (transports with ``irecv_upto`` that
    set ``small_p2p``: MPI; any with ``irecv_upto`` when ``p2p``), or ``None`` (use the schedules) for an
    all-reduce of ``nbytes`` on ``ch``'s group. ``limit`` caps the payload (default: the carrier's own
    capacity). ``carrier(ch, 0)`` says whether the group has a small carrier at all: then every checked
    collective must agree through :func:`records` on it, so that members calling different ops meet in
    the same messages.

    Over point-to-point a dead peer can hide behind a live one that stopped on its error (recursive
    doubling's indirect dependencies), as in every schedule; the liveness monitor names it. The mailbox
    watches every peer itself."""
    tr = ch.transport
    if ch.size < 2:
        return None
    box = getattr(tr, "mailbox", None)
    # The mailbox is one per process and has no tags: only the runtime's world group (id 0), whose ops
    # run one at a time, may use it.
    if box is not None and ch.group.id == 0 and ch.size == tr.size:
        cap = tr.mailbox_payload_max
        return "mailbox" if nbytes <= (cap if limit is None else min(cap, limit)) else None
    if (p2p or getattr(tr, "small_p2p", False)) and hasattr(tr, "irecv_upto"):
        return "p2p-rd" if nbytes <= (P2P_MAX_BYTES if limit is None else min(P2P_MAX_BYTES, limit)) else None
    return None


def allreduce_(ch: Channel, flat: torch.Tensor, red: Reduction, meta: Meta | None, how: str,
               src: torch.Tensor | None = None) -> None:
    """``flat`` (1-D, contiguous) becomes the reduction (not yet averaged) of every member's vector over
    carrier ``how`` (from :func:`carrier`, or ``"p2p"``). This member's vector is ``src`` (same dtype and
    size, e.g. a prescaled copy) or ``flat`` itself. With ``meta``, every member checks every record
    first and raises the same MismatchError on all members if any differs; without it, only the sizes
    are compared. ``flat`` is written only after the check passed. Every member must pass the same
    ``how``."""
    rec = b"" if meta is None else meta.encode()
    if src is not None and (src.dtype != flat.dtype or src.numel() != flat.numel()):
        raise ValueError("src must have flat's dtype and size")
    if how == "mailbox":
        _mailbox(ch, flat, red, rec, flat if src is None else src)
    elif how == "p2p":
        _p2p(ch, flat, red, rec, flat if src is None else src)
    elif how == "p2p-rd":
        entries, acc = allreduce_rd(ch, flat, red, rec, src, P2P_MAX_BYTES)
        nbytes = flat.numel() * flat.element_size()
        if any(n != nbytes or r != rec for n, r in entries):
            _mismatch(ch, [r for _, r in entries] if rec else [], [n for n, _ in entries])
        if nbytes:
            flat.copy_(acc)
    else:
        raise ValueError(f"unknown small all-reduce carrier {how!r}")


def exchange_records(ch: Channel, meta: Meta, how: str) -> list[tuple[int, bytes]]:
    """Every member's ``(payload bytes, encoded record)`` in group-rank order, over carrier ``how``
    (``mailbox``: one round, no payload; ``p2p-rd``: the in-band rounds without a vector). Nothing is
    compared."""
    rec = meta.encode()
    if how == "mailbox":
        seq = ch.transport.small_round(rec, None, ch.timeout)
        box = ch.transport.mailbox
        return [(box.payload_bytes(q, seq), box.record(q, seq)) for q in range(ch.size)]
    if how == "p2p-rd":
        return allreduce_rd(ch, None, None, rec, None, P2P_MAX_BYTES)[0]
    raise ValueError(f"no record exchange over carrier {how!r}")


def records(ch: Channel, meta: Meta, how: str, *, check: bool = True) -> list[Meta]:
    """Every member's record, in group-rank order, over carrier ``how``; with ``check``, the same
    MismatchError on every member when the records disagree (:func:`ringlet.engine.meta.mismatch`: a
    ragged all-gather's first dimensions may differ) or a member sent a vector (it called the small
    all-reduce)."""
    entries = exchange_records(ch, meta, how)
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


def _scratch(ch: Channel, nbytes: int, slots: int) -> torch.Tensor:
    ws = ch.workspace if ch.workspace is not None else {}
    key = ("engine.small", slots)
    buf = ws.get(key)
    if buf is None or buf.numel() < nbytes * slots:
        buf = ws[key] = torch.empty(nbytes * slots, dtype=torch.uint8)
    return buf


def _p2p(ch: Channel, flat: torch.Tensor, red: Reduction, rec: bytes, src: torch.Tensor) -> None:
    tr, p, me = ch.transport, ch.size, ch.rank
    nbytes = flat.numel() * flat.element_size()
    head = -(-(_HDR + len(rec)) // 8) * 8  # the payload 8-byte aligned, whatever the record's length
    frame_cap = head + P2P_MAX_BYTES
    buf = _scratch(ch, frame_cap, p)
    frames = [buf[q * frame_cap:(q + 1) * frame_cap] for q in range(p)]
    mine = frames[me][:head + nbytes]
    frame_head = struct.pack("<q", nbytes) + rec
    mine[:len(frame_head)].copy_(torch.frombuffer(bytearray(frame_head), dtype=torch.uint8))
    if nbytes:
        mine[head:].copy_(src.view(torch.uint8))
    peers = [q for q in range(p) if q != me]
    recvs = [tr.irecv_upto(frames[q], ch.peers[q], ch.tag) for q in peers]
    sends = [tr.isend(mine, ch.peers[q], ch.tag) for q in peers]
    for h in recvs + sends:
        h.wait(ch.timeout)
    sizes = [int(struct.unpack_from("<q", frames[q][:_HDR].numpy().tobytes())[0]) for q in range(p)]
    recs = [bytes(frames[q][_HDR:_HDR + len(rec)].numpy().tobytes()) for q in range(p)] if rec else []
    if not (all(s == nbytes for s in sizes) and all(r == rec for r in recs)):
        _mismatch(ch, recs, sizes)
    if nbytes:
        views = [frames[q][head:head + nbytes].view(flat.dtype) for q in range(p)]
        if flat.dtype in NP_DTYPES:
            views = [v.numpy() for v in views]
        _reduce_in_order(flat, views, red)
