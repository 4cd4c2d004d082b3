"""What a rank announces in a negotiation round: op requests (name + metadata) and their wire form.

A request's metadata is the one op record, :class:`ringlet.engine.meta.Meta` (kind, process set,
dtype, shape, op, root, scale factors, device, alltoall splits). Encoded once per request as bytes; a
name whose full record was executed before is sent as a 5-byte reference into the response cache
(identical on every rank), so steady-state training announces each gradient in a few bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import torch

from ringlet.engine.meta import KIND_NAMES, NO_DTYPE, Kind, Meta
from ringlet.types import DTYPE_CODE

# The coordinator's names for the op kinds of the one record (ringlet.engine.meta).
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST,
                                                            Kind.ALLTOALL, Kind.REDUCESCATTER)
BARRIER, JOIN, ADD_PS, REMOVE_PS = Kind.BARRIER, Kind.JOIN, Kind.ADD_PS, Kind.REMOVE_PS
DATA_KINDS = (ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER)

_FULL, _CACHED = 0, 1
_REF = struct.Struct("<BI")
_MSG = struct.Struct("<BHI")  # flags, number of entries, bytes still waiting after this round
F_SHUTDOWN = 1

__all__ = ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN", "ADD_PS",
           "REMOVE_PS", "DATA_KINDS", "DTYPE_CODE", "KIND_NAMES", "NO_DTYPE", "F_SHUTDOWN", "Meta", "Request",
           "Cache", "encode_message", "decode_message", "entry_bytes", "MESSAGE_OVERHEAD"]


@dataclass(slots=True)
class Request:
    """A rank's own submission: metadata plus the local tensors and where the outcome goes."""

    meta: Meta
    tensor: torch.Tensor | None
    output: Any  # preallocated output tensor, or None when it depends on other ranks' shapes
    handle: int
    part: int
    submit_us: float = 0.0
    ready_us: float = 0.0
    wire: bytes = field(default=b"", repr=False)


class Cache:
    """Response cache: names whose full record was executed, with ids assigned in execution order.

    Every rank executes the same responses in the same order, so ids agree without communication.
    Bounded LRU (eviction order is also identical everywhere) so ``noname`` ops cannot grow it forever.
    """

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._by_name: dict[str, tuple[int, bytes]] = {}
        self._by_id: dict[int, tuple[str, bytes, Meta]] = {}
        self._next = 0

    def lookup(self, name: str, wire: bytes) -> int | None:
        hit = self._by_name.get(name)
        return hit[0] if hit is not None and hit[1] == wire else None

    def get(self, cid: int) -> tuple[bytes, Meta]:
        _, wire, meta = self._by_id[cid]
        return wire, meta

    def record(self, meta: Meta, wire: bytes) -> None:
        old = self._by_name.pop(meta.name, None)
        if old is not None:
            self._by_id.pop(old[0], None)
        cid = self._next
        self._next += 1
        self._by_name[meta.name] = (cid, wire)  # re-insertion keeps dict order = recency order
        self._by_id[cid] = (meta.name, wire, meta)
        while len(self._by_name) > self.capacity:
            oldest = next(iter(self._by_name))
            self._by_id.pop(self._by_name.pop(oldest)[0], None)


def encode_message(flags: int, entries: list[bytes], waiting: int) -> bytes:
    return _MSG.pack(flags, len(entries), waiting) + b"".join(entries)


def entry_bytes(req: Request, cache: Cache) -> bytes:
    cid = cache.lookup(req.meta.name, req.wire)
    return _REF.pack(_CACHED, cid) if cid is not None else bytes([_FULL]) + req.wire


MESSAGE_OVERHEAD = _MSG.size


def decode_message(buf: bytes, cache: Cache) -> tuple[int, list[tuple[Meta, bytes]], int]:
    """(flags, [(meta, wire)], bytes waiting) of one rank's message."""
    flags, n, waiting = _MSG.unpack_from(buf, 0)
    off = _MSG.size
    out = []
    for _ in range(n):
        if buf[off] == _CACHED:
            _, cid = _REF.unpack_from(buf, off)
            off += _REF.size
            wire, meta = cache.get(cid)
        else:
            start = off + 1
            meta, off = Meta.decode(buf, start)
            wire = bytes(buf[start:off])
        out.append((meta, wire))
    return flags, out, waiting
