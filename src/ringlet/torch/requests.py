"""What a rank announces in a negotiation round: op requests (name + metadata) and their wire form.

A request's metadata is everything the ranks must agree on before data moves: kind, process set,
dtype, shape, op, root, scale factors, device, alltoall splits. Encoded once per request as bytes.
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

from ringlet.types import SUPPORTED_DTYPES

# Kinds. Values are part of the wire format.
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN, ADD_PS, REMOVE_PS = range(1, 10)
KIND_NAMES = {ALLREDUCE: "allreduce", ALLGATHER: "allgather", BROADCAST: "broadcast", ALLTOALL: "alltoall",
              REDUCESCATTER: "reducescatter", BARRIER: "barrier", JOIN: "join", ADD_PS: "add_process_set",
              REMOVE_PS: "remove_process_set"}
DATA_KINDS = (ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER)
DTYPE_CODE = {dt: i for i, dt in enumerate(SUPPORTED_DTYPES)}
NO_DTYPE = 255

_HEAD = struct.Struct("<HBBBhidd")  # ps_id kind dtype op device root prescale postscale
_FULL, _CACHED = 0, 1
_REF = struct.Struct("<BI")
_MSG = struct.Struct("<BHI")  # flags, number of entries, bytes still waiting after this round
F_SHUTDOWN = 1
F_ERROR = 2  # with F_SHUTDOWN: the rank stops because an operation failed there
BIT_QUIET, BIT_ACCEPT, BIT_FIRST_POS = 0, 1, 2
CACHEABLE = DATA_KINDS + (BARRIER,)  # control ops (join, process sets) always go through full rounds


@dataclass(frozen=True, slots=True)
class Meta:
    """The cross-rank-checked part of a request."""

    name: str
    kind: int
    ps_id: int = 0
    dtype: int = NO_DTYPE
    shape: tuple[int, ...] = ()
    op: int = 0
    root: int = -1
    pre: float = 1.0
    post: float = 1.0
    device: int = -1
    splits: tuple[int, ...] = ()  # alltoall: rows sent to each member; control ops: their arguments

    def encode(self) -> bytes:
        name = self.name.encode()
        return b"".join((
            _HEAD.pack(self.ps_id, self.kind, self.dtype, self.op, self.device, self.root, self.pre, self.post),
            struct.pack(f"<B{len(self.shape)}q", len(self.shape), *self.shape),
            struct.pack(f"<I{len(self.splits)}q", len(self.splits), *self.splits),
            struct.pack("<H", len(name)), name,
        ))

    @staticmethod
    def decode(buf: bytes, off: int) -> tuple["Meta", int]:
        ps_id, kind, dtype, op, device, root, pre, post = _HEAD.unpack_from(buf, off)
        off += _HEAD.size
        (nd,) = struct.unpack_from("<B", buf, off)
        shape = struct.unpack_from(f"<{nd}q", buf, off + 1)
        off += 1 + 8 * nd
        (ns,) = struct.unpack_from("<I", buf, off)
        splits = struct.unpack_from(f"<{ns}q", buf, off + 4)
        off += 4 + 8 * ns
        (nl,) = struct.unpack_from("<H", buf, off)
        name = bytes(buf[off + 2:off + 2 + nl]).decode()
        return Meta(name, kind, ps_id, dtype, tuple(shape), op, root, pre, post, device, tuple(splits)), off + 2 + nl

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return SUPPORTED_DTYPES[self.dtype] if self.dtype != NO_DTYPE else None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


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
