"""The one metadata record of an op and the one cross-rank check of it.

Every front end describes an op with a :class:`Meta` before any data moves: the core API exchanges it
(or its digest) per collective, the Horovod coordinator announces it by name in negotiation rounds.
:func:`mismatch` compares the members' records identically on every rank; its messages follow
Horovod's wording (scripts and tests match on them) with the ranks involved appended.

Codes: :class:`Kind` numbers op kinds, :data:`ringlet.types.DTYPE_CODE` dtypes and
:class:`ringlet.types.ReduceOp` (Horovod's numbering) reductions. All are part of the wire format.
"""
from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass, field

import torch

from ..types import DTYPE_CODE, SUPPORTED_DTYPES, ReduceOp, dtype_name


class Kind(enum.IntEnum):
    """Op kinds; the values are part of the wire format."""

    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    ALLTOALL = 4
    REDUCESCATTER = 5
    BARRIER = 6
    JOIN = 7
    ADD_PS = 8
    REMOVE_PS = 9
    REDUCE = 10


KIND_NAMES = {Kind.ALLREDUCE: "allreduce", Kind.ALLGATHER: "allgather", Kind.BROADCAST: "broadcast",
              Kind.ALLTOALL: "alltoall", Kind.REDUCESCATTER: "reducescatter", Kind.BARRIER: "barrier",
              Kind.JOIN: "join", Kind.ADD_PS: "add_process_set", Kind.REMOVE_PS: "remove_process_set",
              Kind.REDUCE: "reduce"}
RAGGED_KINDS = (Kind.ALLGATHER, Kind.ALLTOALL)  # the first dimension may differ between members
NO_DTYPE = 255

_HEAD = struct.Struct("<HBBBhidd")  # ps_id kind dtype op device root prescale postscale


@dataclass(frozen=True, slots=True)
class Meta:
    """What every member of an op must agree on before data moves.

    ``ps_id``: the process set (Horovod) or group id; ``splits``: all-to-all rows sent to each member
    (and the residuals of :mod:`ringlet.engine.a2a_counts`), or a control op's arguments; ``root``: a
    rooted op's root, and for an all-to-all 1 when the caller gave its receive counts; ``algorithm``:
    an algorithm the caller forced ("" when chosen for it);
    ``device``: -1 for CPU, else the device index; ``compression``: how a compressed all-reduce travels
    (:func:`ringlet.engine.compressed.describe`: compressor, strategy, payload size), "" for none.
    """

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
    splits: tuple[int, ...] = ()
    algorithm: str = ""
    compression: str = ""
    _encoded: bytes = field(default=b"", init=False, compare=False, repr=False)  # encode()'s, once made

    @staticmethod
    def of(name: str, kind: int, t: torch.Tensor | None, **kw) -> "Meta":
        """The record of ``t`` (dtype, shape, device filled in from the tensor)."""
        if t is None:
            return Meta(name, kind, **kw)
        device = -1 if t.device.type == "cpu" else (t.device.index or 0)
        return Meta(name, kind, dtype=DTYPE_CODE[t.dtype], shape=tuple(t.shape), device=device, **kw)

    def encode(self) -> bytes:
        """The wire form (:meth:`decode` reads it back); made once per record object."""
        if self._encoded:
            return self._encoded
        name, algo, comp = self.name.encode(), self.algorithm.encode(), self.compression.encode()
        raw = b"".join((
            _HEAD.pack(self.ps_id, self.kind, self.dtype, self.op, self.device, self.root, self.pre, self.post),
            struct.pack(f"<B{len(self.shape)}q", len(self.shape), *self.shape),
            struct.pack(f"<I{len(self.splits)}q", len(self.splits), *self.splits),
            struct.pack("<H", len(name)), name, struct.pack("<B", len(algo)), algo,
            struct.pack("<B", len(comp)), comp,
        ))
        object.__setattr__(self, "_encoded", raw)
        return raw

    @staticmethod
    def decode(buf: bytes, off: int = 0) -> tuple["Meta", int]:
        """The record encoded at ``buf[off:]`` and the offset just past it."""
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
        off += 2 + nl
        algo = bytes(buf[off + 1:off + 1 + buf[off]]).decode()
        off += 1 + buf[off]
        comp = bytes(buf[off + 1:off + 1 + buf[off]]).decode()
        return (Meta(name, kind, ps_id, dtype, tuple(shape), op, root, pre, post, device, tuple(splits), algo, comp),
                off + 1 + buf[off])

    def digest(self) -> int:
        """62 bits of a hash of the whole record: equal records give equal digests on every rank, and
        ``-digest`` still fits an int64."""
        d = int.from_bytes(hashlib.blake2b(self.encode(), digest_size=8).digest(), "little")
        return d & ((1 << 62) - 1)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return SUPPORTED_DTYPES[self.dtype] if self.dtype != NO_DTYPE else None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _dev(d: int) -> str:
    return "CPU" if d < 0 else f"GPU {d}"


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in s) + "]"


def _shape_mismatch(kind: str, first: Meta, m: Meta) -> str | None:
    if first.kind in RAGGED_KINDS:
        if len(m.shape) != len(first.shape):
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank {len(first.shape)}, but "
                    f"another rank sent a tensor of rank {len(m.shape)}.")
        if m.shape[1:] != first.shape[1:]:
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor with dimensions beyond the first "
                    f"{_shape(first.shape[1:])}, but another rank sent {_shape(m.shape[1:])}.")
    elif m.shape != first.shape:
        return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {_shape(first.shape)}, but "
                f"another rank sent a tensor of shape {_shape(m.shape)}.")
    return None


# The fields compared after kind, dtype and shape, in order: (field, the kinds it matters for or None
# for all, how a value is shown, the message with {kind}, {a} and {b}).
_FIELD_CHECKS = (
    # Names differ only where all-reduces are matched by order, not by name (compressed ones in Comm).
    ("name", (Kind.ALLREDUCE,), repr,
     "Mismatched {kind} tensor names: One rank sent {a}, but another rank sent {b} (submitted in another order?)."),
    ("op", (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.REDUCE), lambda v: ReduceOp(v).name,
     "Mismatched {kind} reduction ops: One rank used {a}, but another rank used {b}."),
    ("compression", (Kind.ALLREDUCE, Kind.REDUCESCATTER), lambda v: repr(v) if v else "no compression",
     "Mismatched {kind} compression: One rank used {a}, but another rank used {b}."),
    ("root", (Kind.BROADCAST, Kind.REDUCE), str,
     "Mismatched {kind} root ranks: One rank specified root rank {a}, but another rank specified root rank {b}."),
    ("root", (Kind.ALLTOALL,), lambda v: "given" if v > 0 else "not given",
     "Mismatched {kind} receive counts: One rank's recv_splits were {a}, but another rank's were {b} "
     "(give them on every rank or on none)."),
    ("algorithm", None, lambda v: repr(v or "auto"),
     "Mismatched {kind} algorithms: One rank forced {a}, but another rank forced {b} "
     "(check RINGLET_ALGORITHM on every rank)."),
    ("pre", None, str, "Mismatched prescale factors: One rank sent factor {a}, but another rank sent factor {b}."),
    ("post", None, str, "Mismatched postscale factors: One rank sent factor {a}, but another rank sent factor {b}."),
    ("device", None, _dev, "Mismatched {kind} CPU/GPU device selection: One rank specified device {a}, but "
                           "another rank specified device {b}."),
    ("splits", (Kind.ADD_PS,), list,
     "Mismatched add_process_set: One rank registered ranks {a}, but another rank registered ranks {b}."),
    ("splits", (Kind.REDUCESCATTER,), list,
     "Mismatched {kind} blocks: One rank cut the buffer into {a}, but another rank into {b}."),
)


def _pair_mismatch(first: Meta, m: Meta) -> str | None:
    """The first difference between two members' records, in Horovod's words; None when they agree."""
    kind = KIND_NAMES.get(first.kind, str(first.kind))
    if m.kind != first.kind:
        return (f"Mismatched operations: One rank did a {kind}, but another rank did a "
                f"{KIND_NAMES.get(m.kind, m.kind)}.")
    if m.dtype != first.dtype:
        return (f"Mismatched data types: One rank had type {dtype_name(first.torch_dtype)}, but another rank "
                f"had type {dtype_name(m.torch_dtype)}.")
    shape = _shape_mismatch(kind, first, m)
    if shape is not None:
        return shape
    for field, kinds, show, message in _FIELD_CHECKS:
        a, b = getattr(first, field), getattr(m, field)
        if a != b and not (a != a and b != b) and (kinds is None or first.kind in kinds):  # NaN matches NaN
            return message.format(kind=kind, a=show(a), b=show(b))
    return None


def mismatch(metas: dict[int, Meta]) -> str | None:
    """None when every member's record (``{global rank: Meta}``) agrees; otherwise the message every
    rank raises, naming the tensor (when named) and the first two ranks that disagree."""
    ranks = sorted(metas)
    first = metas[ranks[0]]
    for b in ranks[1:]:
        msg = _pair_mismatch(first, metas[b])
        if msg is not None:
            name = f"tensor {first.name!r}, " if first.name else ""
            return f"{msg} ({name}rank {ranks[0]} vs rank {b})"
    return None
