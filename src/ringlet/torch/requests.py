"""What a rank announces in a negotiation round: op requests (name + metadata) and their wire form.

A request's metadata is the one op record, :class:`ringlet.engine.meta.Meta` (kind, process set,
dtype, shape, op, root, scale factors, device, alltoall splits). Encoded once per request as bytes.
Once a name was agreed with one identical record everywhere it is in the response cache (identical on
every rank): it is then announced as one bit of the round's bit vector (see :mod:`.negotiation`), or,
in a full round, as a 5-byte reference to its cache position.

The bit vector, AND-ed over the ranks, is ``[no full round wanted, execution queue accepts, cached
position 0, 1, ...]``.
"""
from __future__ import annotations

import struct
import time
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
F_ERROR = 2  # with F_SHUTDOWN: the rank stops because an operation failed there
BIT_QUIET, BIT_ACCEPT, BIT_FIRST_POS = 0, 1, 2
CACHEABLE = DATA_KINDS + (BARRIER,)  # control ops (join, process sets) always go through full rounds

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
    """Response cache: the full records of names that were agreed with one identical record on every rank.

    Each entry owns a *position*: its bit in the steady-state bit vector, and its number in a 5-byte
    reference. Every rank records the same responses in the same order and positions are assigned
    deterministically (a re-recorded name keeps its position, a new one takes the next unused position,
    or the least recently recorded entry's once ``capacity`` are in use), so positions agree on every
    rank without communication. Bounded, so ``noname`` ops cannot grow it forever.
    """

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._by_name: dict[str, int] = {}  # name -> position; dict order = recency order
        self._by_pos: dict[int, tuple[bytes, Meta]] = {}
        self.span = 0  # positions handed out so far: the length of the bit vector

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, name: str, wire: bytes) -> int | None:
        """The position of ``name`` when it is cached with exactly this record, else None."""
        pos = self._by_name.get(name)
        return pos if pos is not None and self._by_pos[pos][0] == wire else None

    def get(self, pos: int) -> tuple[bytes, Meta]:
        return self._by_pos[pos]

    def record(self, meta: Meta, wire: bytes) -> tuple[int | None, int | None]:
        """Cache ``meta`` under its name. Returns (its position, the same position when it was taken from
        another name that had to be evicted, else None); (None, None) when ``capacity`` is 0."""
        if self.capacity <= 0:
            return None, None  # caching disabled: every request goes in full
        pos = self._by_name.pop(meta.name, None)
        evicted = None
        if pos is None:
            if self.span < self.capacity:
                pos = self.span
                self.span += 1
            else:
                pos = evicted = self._by_name.pop(next(iter(self._by_name)))
        self._by_name[meta.name] = pos
        self._by_pos[pos] = (wire, meta)
        return pos, evicted


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


class Entry:
    """A name in the negotiation table: each announcing rank's record (same on every rank)."""

    __slots__ = ("metas", "wires", "first", "warned")

    def __init__(self) -> None:
        self.metas: dict[int, Meta] = {}
        self.wires: dict[int, bytes] = {}
        self.first = time.monotonic()
        self.warned = 0.0
