"""The small-message all-reduce with the metadata check in the same messages (no round of its own).

The metadata record of :mod:`ringlet.collectives` travels in front of the vector; every member ends
with every member's record, compares them (raising the same :class:`~ringlet.types.MismatchError`
everywhere when they differ, before ``flat`` is written) and holds the reduction, with the same bits
on every member. Up to :data:`P2P_MAX_BYTES` / the mailbox's 64 KiB.

Three carriers:

* ``mailbox``: the shm transport's :meth:`~ringlet.transport.shm.ShmTransport.small_round` (world
  groups only), one round: each member copies its vector into its own slot, the last to publish
  wakes the others, and every member reduces the ``p`` slots in rank order. A mismatch of sizes is
  seen in the records before any payload is read.
* ``p2p-rd`` (the default on transports with ``irecv_upto``: MPI, in-process): recursive doubling
  with every member's record carried in band (:mod:`._rd_inband`): ``⌈log₂p⌉`` rounds, no round
  of its own for the check. On the emulated 1 Gbit/s cluster it beat the one-round ``p2p``, whose
  ``(p-1)`` incoming messages share one capped link and cost more CPU.
* ``p2p``: one round, one message per peer, received into a buffer of :data:`P2P_MAX_BYTES` so that a
  peer with another size is named by its record instead of failing the receive; reduced in rank order.

:func:`carrier` says which one applies (or ``None``: use the schedules); :func:`allreduce_` runs it.
"""
from __future__ import annotations

import struct

import numpy as np
import torch

from ..algorithms.executor import reduce_into
from ..types import MismatchError
from ._rd_inband import NP_DTYPES, NP_OPS, allreduce_rd

P2P_MAX_BYTES = 64 << 10  # payload limit of the p2p carrier (one receive buffer per peer of this size)
_HDR = 8  # p2p frame: payload bytes (int64), then the record, then the payload


def carrier(rt, g, nbytes: int, limit: int | None = None) -> str | None:
    """``"mailbox"`` (shm, world group), ``"p2p-rd"`` (transports with ``irecv_upto``) or ``None`` (use
    the schedules) for an all-reduce of ``nbytes`` on group ``g``. ``limit`` caps the payload
    (default: the carrier's own capacity). Every member must get the same answer, so callers pass
    sizes that agree, or route a disagreement through :func:`check_records` on the same carrier."""
    tr = rt.transport
    if g.size < 2:
        return None
    box = getattr(tr, "mailbox", None)
    if box is not None and g.size == tr.size:
        cap = tr.mailbox_payload_max
        return "mailbox" if nbytes <= (cap if limit is None else min(cap, limit)) else None
    if hasattr(tr, "irecv_upto"):
        return "p2p-rd" if nbytes <= (P2P_MAX_BYTES if limit is None else min(P2P_MAX_BYTES, limit)) else None
    return None


_packed: dict[tuple, bytes] = {}


def pack(record: list[int] | None) -> bytes:
    """The record as int64 bytes (cached: a training loop sends the same few records again and again)."""
    if record is None:
        return b""
    key = tuple(record)
    raw = _packed.get(key)
    if raw is None:
        if len(_packed) > 4096:
            _packed.clear()
        raw = _packed[key] = struct.pack(f"<{len(record)}q", *record)
    return raw


def allreduce_(rt, g, grank: int, flat: torch.Tensor, op: int, record: list[int] | None, tag: int,
               how: str, src: torch.Tensor | None = None) -> None:
    """``flat`` (1-D, contiguous) becomes the reduction of every member's vector over carrier ``how``
    (from :func:`carrier`, or ``"p2p"``). This member's vector is ``src`` (same dtype and size, e.g.
    a prescaled copy) or ``flat`` itself. ``op`` is a ReduceOp value (AVG sums; the caller scales).
    With ``record`` (the metadata record of :mod:`ringlet.collectives`), every member checks every
    record first and raises MismatchError on all members if any differs; without it, only the sizes
    are compared. ``flat`` is written only after the check passed. Every member of ``g`` must call it
    with the same ``how``."""
    rec = pack(record)
    if src is not None and (src.dtype != flat.dtype or src.numel() != flat.numel()):
        raise ValueError("src must have flat's dtype and size")
    if how == "mailbox":
        _mailbox(rt, g, grank, flat, op, rec, flat if src is None else src)
    elif how == "p2p":
        _p2p(rt, g, grank, flat, op, rec, tag, flat if src is None else src)
    elif how == "p2p-rd":
        entries, acc = allreduce_rd(rt, g, grank, flat, op, rec, tag, src, P2P_MAX_BYTES)
        nbytes = flat.numel() * flat.element_size()
        if any(n != nbytes or r != rec for n, r in entries):
            _mismatch(g, [r for _, r in entries] if rec else [], [n for n, _ in entries])
        if nbytes:
            flat.copy_(acc)
    else:
        raise ValueError(f"unknown small all-reduce carrier {how!r}")


def exchange_records(rt, g, grank: int, record: list[int], tag: int, how: str) -> list[tuple[int, bytes]]:
    """Every member's ``(payload bytes, packed record)`` in group-rank order, over carrier ``how``
    (``mailbox``: one round, no payload; ``p2p-rd``: the in-band rounds without a vector, messages
    of step ``s`` on tag ``tag + s``). Nothing is compared: the ragged all-gather reads the first
    dimensions from the records (``struct.unpack`` them, or :func:`unpack`)."""
    rec = pack(record)
    if how == "mailbox":
        seq = rt.transport.small_round(rec, None, rt.options.timeout)
        box = rt.transport.mailbox
        return [(box.payload_bytes(q, seq), box.record(q, seq)) for q in range(g.size)]
    if how == "p2p-rd":
        return allreduce_rd(rt, g, grank, None, 0, rec, tag, None, P2P_MAX_BYTES)[0]
    raise ValueError(f"no record exchange over carrier {how!r}")


def unpack(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


def check_records(rt, g, grank: int, record: list[int], tag: int, how: str) -> None:
    """The metadata check alone (:func:`exchange_records`, then MismatchError on every member if any
    record differs or a member sent a vector). Every checked collective should check through here on
    transports where small all-reduces take :func:`allreduce_`, so that a member calling another
    collective, or an all-reduce of another size, meets the small all-reduce in the same exchange
    (and both raise) instead of waiting on another channel."""
    entries = exchange_records(rt, g, grank, record, tag, how)
    rec = pack(record)
    if any(r != rec or n for n, r in entries):
        _mismatch(g, [r for _, r in entries], [n for n, _ in entries])


def _mismatch(g, recs: list[bytes], sizes: list[int]) -> None:
    """Raise the MismatchError every member raises for the same records (the collectives' wording)."""
    from .. import collectives

    if all(recs) and len({len(r) for r in recs}) == 1:
        metas = torch.tensor([list(struct.unpack(f"<{len(r) // 8}q", r)) for r in recs], dtype=torch.int64)
        collectives._verify(metas, g)
    raise MismatchError(f"Mismatched all-reduce inputs: ranks {list(g.ranks)} sent {sizes} bytes "
                        "(or different metadata records).")


_NP_OPS, _NP_DTYPES = NP_OPS, NP_DTYPES


def _reduce_in_order(flat: torch.Tensor, views: list, op: int) -> None:
    """``flat = views[0] op views[1] op ...``: the same order, hence the same bits, on every member.
    ``views`` are numpy arrays when ``flat``'s dtype is in ``_NP_DTYPES``, else tensors."""
    if flat.dtype in _NP_DTYPES:
        out, fn = flat.numpy(), _NP_OPS[op]
        with np.errstate(all="ignore"):  # overflow to inf is the caller's business, as with torch
            fn(views[0], views[1], out=out)
            for v in views[2:]:
                fn(out, v, out=out)
        return
    flat.copy_(views[0])
    for v in views[1:]:
        reduce_into(flat, v, op)


def _mailbox(rt, g, grank: int, flat: torch.Tensor, op: int, rec: bytes, src: torch.Tensor) -> None:
    tr = rt.transport
    seq = tr.small_round(rec, src, rt.options.timeout)
    box = tr.mailbox
    nbytes = flat.numel() * flat.element_size()
    if not box.agree(seq, rec, nbytes):
        sizes = [box.payload_bytes(q, seq) for q in range(g.size)]
        _mismatch(g, [box.record(q, seq) for q in range(g.size)] if rec else [], sizes)
    if not nbytes:
        return
    dt = flat.dtype
    # Our own contribution is read back from our slot: ``flat`` is overwritten with the result.
    _reduce_in_order(flat, box.payloads(seq, dt, flat.numel(), dt in _NP_DTYPES), op)


def _scratch(rt, nbytes: int, slots: int) -> torch.Tensor:
    key = ("engine.small", slots)
    buf = rt.workspace.get(key)
    if buf is None or buf.numel() < nbytes * slots:
        buf = torch.empty(nbytes * slots, dtype=torch.uint8)
        rt.workspace[key] = buf
    return buf


def _p2p(rt, g, grank: int, flat: torch.Tensor, op: int, rec: bytes, tag: int, src: torch.Tensor) -> None:
    tr, p = rt.transport, g.size
    nbytes = flat.numel() * flat.element_size()
    head = _HDR + len(rec)
    frame_cap = head + P2P_MAX_BYTES
    buf = _scratch(rt, frame_cap, p)
    frames = [buf[q * frame_cap:(q + 1) * frame_cap] for q in range(p)]
    mine = frames[grank][:head + nbytes]
    mine[:head].copy_(torch.frombuffer(bytearray(struct.pack("<q", nbytes) + rec), dtype=torch.uint8))
    if nbytes:
        mine[head:].copy_(src.view(torch.uint8))
    timeout = rt.options.timeout
    peers = [q for q in range(p) if q != grank]
    recvs = [tr.irecv_upto(frames[q], g.ranks[q], tag) for q in peers]
    sends = [tr.isend(mine, g.ranks[q], tag) for q in peers]
    wait_all = getattr(tr, "wait_all", None)
    if wait_all is not None:
        wait_all(recvs + sends, timeout)
    else:
        for h in recvs:
            h.wait(timeout)
    sizes = [int(struct.unpack_from("<q", frames[q][:_HDR].numpy().tobytes())[0]) for q in range(p)]
    recs = [bytes(frames[q][_HDR:head].numpy().tobytes()) for q in range(p)] if rec else []
    ok = all(s == nbytes for s in sizes) and all(r == rec for r in recs)
    if wait_all is None:
        for h in sends:
            h.wait(timeout)
    if not ok:
        _mismatch(g, recs, sizes)
    if nbytes:
        views = [frames[q][head:head + nbytes].view(flat.dtype) for q in range(p)]
        if flat.dtype in _NP_DTYPES:
            views = [v.numpy() for v in views]
        _reduce_in_order(flat, views, op)


def benchmark_runner(name: str, rt, t: torch.Tensor):
    """A callable for benchmarks/small_profile.py. ``small``/``small-nocheck``: what ``ringlet.allreduce_(t)``
    would do with this path wired in (validation, tag, record, the one round, through the runtime's
    submit); ``small-raw``: the rounds alone with a prepared record (the engine's own cost);
    ``small-raw:<carrier>``: the same on a given carrier (``p2p``: one round over point-to-point);
    ``small-lean``: :func:`_lean_runner`, a sketch of a lean per-call path for the collective layer."""
    from .. import collectives as C
    from ..types import ReduceOp

    check = not name.endswith("nocheck")
    g = rt.world
    if name.startswith("small-raw"):  # small-raw or small-raw:<carrier>
        rec = C._meta_record(C.ALLREDUCE, t, ReduceOp.SUM, -1, "auto", 1.0, 1.0)
        flat = t.view(-1)
        how = name.partition(":")[2] or carrier(rt, g, flat.numel() * flat.element_size())
        grank = g.rank_of(rt.rank)
        return lambda: allreduce_(rt, g, grank, flat, int(ReduceOp.SUM), rec, rt.next_tag(g), how)
    if name == "small-lean":
        return _lean_runner(rt, t)

    def run() -> torch.Tensor:
        C._check_tensor(t)
        op = ReduceOp.parse("sum")
        g, grank = C._group(rt, None)
        algo = C.resolve_algorithm("auto", rt)

        def body():
            tag = rt.next_tag(g)
            flat = t.view(-1)
            how = carrier(rt, g, flat.numel() * flat.element_size())
            rec = C._meta_record(C.ALLREDUCE, t, op, -1, algo, 1.0, 1.0) if check else None
            allreduce_(rt, g, grank, flat, int(op), rec, tag, how)
            return t

        return rt.submit(body, sync=True).wait()

    return run


def _lean_runner(rt, t: torch.Tensor):
    """What a lean synchronous ``allreduce_(t)`` could cost: the local checks, the record and carrier
    looked up by (dtype, shape, op) instead of rebuilt, and the call run inline under the runtime's
    execution lock instead of through ``submit`` (a ``Work`` with a ``threading.Event`` per call).
    A real one must fall back to ``submit`` while asynchronous work is queued. Benchmarks only."""
    from .. import collectives as C
    from ..types import DTYPE_CODE, ReduceOp

    g = rt.world
    grank = g.rank_of(rt.rank)
    cache: dict = {}

    def run() -> torch.Tensor:
        if t.dtype not in DTYPE_CODE or not t.is_contiguous():
            raise ValueError("unsupported tensor")
        key = (t.dtype, t.shape, 1)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = (C._meta_record(C.ALLREDUCE, t, ReduceOp.SUM, -1, "auto", 1.0, 1.0),
                                carrier(rt, g, t.numel() * t.element_size()))
        with rt._exec_lock:
            allreduce_(rt, g, grank, t.view(-1), 1, hit[0], rt.next_tag(g), hit[1])
        return t

    return run
