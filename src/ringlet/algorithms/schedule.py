"""The plain description every algorithm emits: who sends which element range to whom, per step.

One definition, three uses: the executor runs it over a transport, the simulator replays it on a
modelled network, the cost model counts its messages and bytes.

Semantics of a :class:`Schedule`: steps run in order. A transfer at step ``s`` sends the sender's
buffer range as it is after all steps ``< s``; the receiver reduces (``reduce=True``) or copies it
into its own range once step ``s`` completes. Ranges are in elements of a flat buffer; ``src_buf``
and ``dst_buf`` pick one of the buffers the collective provides (0 is the work buffer; all-to-all
also reads from buffer 1). Executors may pipeline freely as long as the result equals this
step-by-step meaning.

Storage: per-step arrays (:mod:`.compact`), not a Python object per transfer; :meth:`Schedule.step_arrays`
is the way to read a large schedule, and :attr:`Schedule.steps` builds :class:`Transfer` objects on
access (for small schedules and tests).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .compact import Interner, StepArrays, StepStore, StoredStep, smallest_int

__all__ = ["Ranges", "Schedule", "ScheduleBuilder", "StepArrays", "Transfer", "even_split", "split_table"]


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    offset: int
    count: int
    reduce: bool = False
    dst_offset: int = -1  # -1: the same range as the sender's
    src_buf: int = 0
    dst_buf: int = 0

    @property
    def recv_offset(self) -> int:
        return self.offset if self.dst_offset < 0 else self.dst_offset


class _StepsView(Sequence):
    """The steps as tuples of :class:`Transfer`, built on each access (nothing is kept)."""

    def __init__(self, store: StepStore):
        self._store = store

    def __len__(self) -> int:
        return len(self._store)

    def __getitem__(self, s):
        if isinstance(s, slice):
            return tuple(self[i] for i in range(*s.indices(len(self))))
        st = self._store.arrays(s)
        cols = zip(st.src.tolist(), st.dst.tolist(), st.offset.tolist(), st.count.tolist(), st.reduce.tolist(),
                   st.recv_offset.tolist(), st.src_buf.tolist(), st.dst_buf.tolist())
        return tuple(Transfer(src, dst, off, cnt, red, -1 if recv == off else recv, sb, db)
                     for src, dst, off, cnt, red, recv, sb, db in cols)

    def __repr__(self) -> str:
        return f"<{len(self)} steps>"


class Schedule:
    """An immutable schedule: ``name``, ``nranks``, the steps (stored as arrays) and ``meta`` (free-form
    facts of the builder, e.g. a tree's parents). Equality and hash are identity: schedules are cache keys.

    ``Schedule(name, nranks, steps, meta)`` also accepts steps as sequences of :class:`Transfer`;
    like :class:`ScheduleBuilder`, it drops empty transfers, self-sends and then empty steps.
    """

    __slots__ = ("_name", "_nranks", "_store", "_meta", "__weakref__")

    def __init__(self, name: str, nranks: int, steps=(), meta: dict | None = None):
        if not isinstance(steps, StepStore):
            steps = _store_of(name, nranks, steps)
        self._name, self._nranks, self._store, self._meta = name, nranks, steps, dict(meta or {})

    name = property(lambda self: self._name)
    nranks = property(lambda self: self._nranks)
    meta = property(lambda self: self._meta)
    store = property(lambda self: self._store, doc="The compact storage (:class:`.compact.StepStore`).")

    def __hash__(self) -> int:  # schedules are cache keys; identity is enough and cheap
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"Schedule({self._name!r}, nranks={self._nranks}, steps={self.num_steps}, " \
               f"transfers={self.num_transfers})"

    @property
    def num_steps(self) -> int:
        return len(self._store)

    @property
    def num_transfers(self) -> int:
        return self._store.num_transfers()

    @property
    def steps(self) -> Sequence[tuple[Transfer, ...]]:
        """The steps as tuples of :class:`Transfer`, built on access: O(transfers) Python objects."""
        return _StepsView(self._store)

    def transfers(self):
        """``(step, Transfer)`` for every transfer in order (builds the objects one step at a time)."""
        view = self.steps
        for s in range(len(view)):
            for t in view[s]:
                yield s, t

    def step_arrays(self, s: int) -> StepArrays:
        """Step ``s`` as arrays (:class:`StepArrays`); ``IndexError`` outside ``0..num_steps-1``."""
        return self._store.arrays(s)

    def nbytes(self) -> int:
        """Memory of the stored arrays (arrays shared between steps counted once)."""
        return self._store.nbytes()

    def bytes_sent(self, itemsize: int) -> list[int]:
        """Bytes each rank sends in total: what the cost model and tests count."""
        total = np.zeros(self._nranks, dtype=np.int64)
        for s in range(self.num_steps):
            st = self._store.arrays(s)
            np.add.at(total, st.src, st.count)
        return [int(b) * itemsize for b in total]


def _store_of(name: str, nranks: int, steps) -> StepStore:
    b = ScheduleBuilder(name, nranks)
    for step in steps:
        b.new_step()
        ts = list(step)
        if ts:
            b.add_many([t.src for t in ts], [t.dst for t in ts], [t.offset for t in ts], [t.count for t in ts],
                       reduce=[t.reduce for t in ts], dst_offset=[t.dst_offset for t in ts],
                       src_buf=[t.src_buf for t in ts], dst_buf=[t.dst_buf for t in ts])
    return b.build().store


@dataclass(frozen=True, slots=True)
class Ranges:
    """A table of element ranges registered with a :class:`ScheduleBuilder` (:meth:`~ScheduleBuilder.ranges`);
    transfers name a row by its index."""

    start: int  # the first row's index in the builder's table
    offsets: np.ndarray  # int64
    counts: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets)


def _vector(name: str, x, dtype) -> np.ndarray | int | bool:
    """``x`` as a 1-D array, or as a Python scalar when it is one; ``TypeError`` for non-integers."""
    if isinstance(x, (int, np.integer, np.bool_)):
        return dtype(x)
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if dtype is bool and a.dtype != np.bool_ or dtype is int and a.dtype.kind not in "iub":
        raise TypeError(f"{name} must hold {dtype.__name__}s, got dtype {a.dtype}")
    if a.ndim == 0:
        return dtype(a.item())
    if a.ndim != 1:
        raise ValueError(f"{name} must be a scalar or 1-D, got shape {a.shape}")
    return a


def _length(named: dict) -> int:
    lengths = {k: len(v) for k, v in named.items() if isinstance(v, np.ndarray)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arguments of different lengths: {lengths}")
    return next(iter(lengths.values()), 1)


def _take(x, keep: np.ndarray):
    return x[keep] if isinstance(x, np.ndarray) else x


_COLS = ("src", "dst", "rng", "recv", "reduce", "src_buf", "dst_buf")


class ScheduleBuilder:
    """Accumulates transfers step by step; empty transfers and self-sends are dropped (so count 0 is
    trivial), and so are steps left empty. Transfers keep the order in which they were added."""

    def __init__(self, name: str, nranks: int):
        self.name = name
        self.nranks = nranks
        self._steps: list[list[tuple]] = []  # per step: pieces (n, src, dst, rng, recv, reduce, src_buf, dst_buf)
        self._tables: list[Ranges] = []
        self._rows = 0

    def new_step(self) -> None:
        self._steps.append([])

    def ranges(self, offsets, counts) -> Ranges:
        """Register a table of element ranges (row ``i``: ``counts[i]`` elements at ``offsets[i]``) for
        :meth:`add_ranges`. ``ValueError`` for tables of different lengths or negative entries."""
        off = np.atleast_1d(np.asarray(offsets, dtype=np.int64))
        cnt = np.atleast_1d(np.asarray(counts, dtype=np.int64))
        if off.ndim != 1 or off.shape != cnt.shape:
            raise ValueError(f"offsets and counts must be 1-D of one length, got {off.shape} and {cnt.shape}")
        if len(off) and (off.min() < 0 or cnt.min() < 0):
            raise ValueError("range offsets and counts must be >= 0")
        table = Ranges(self._rows, off, cnt)
        self._tables.append(table)
        self._rows += len(off)
        return table

    def add(self, src: int, dst: int, offset: int, count: int, *, reduce: bool = False,
            dst_offset: int = -1, src_buf: int = 0, dst_buf: int = 0) -> None:
        """One transfer (see :meth:`add_many`)."""
        if count <= 0 or src == dst:
            return
        self.add_many(src, dst, offset, count, reduce=reduce, dst_offset=dst_offset, src_buf=src_buf,
                      dst_buf=dst_buf)

    def add_many(self, src, dst, offset, count, *, reduce=False, dst_offset=-1, src_buf=0, dst_buf=0) -> None:
        """Append transfers ``i``: ``count[i]`` elements at ``offset[i]`` of ``src[i]``'s buffer ``src_buf[i]``
        to ``dst[i]``'s buffer ``dst_buf[i]`` at ``dst_offset[i]`` (-1: at ``offset[i]``), reducing when
        ``reduce[i]``. Every argument is a scalar (the same for all) or a 1-D array; arrays must have one
        length (``ValueError`` otherwise). Those with count 0 or ``src == dst`` are dropped."""
        offset, count = _vector("offset", offset, int), _vector("count", count, int)
        if isinstance(offset, int) and isinstance(count, int):
            table, index = self.ranges([offset], [count]), 0
        else:
            n = _length({"offset": offset, "count": count})
            table = self.ranges(np.broadcast_to(offset, (n,)), np.broadcast_to(count, (n,)))
            index = np.arange(n)
        self.add_ranges(src, dst, table, index, reduce=reduce, dst_offset=dst_offset, src_buf=src_buf,
                        dst_buf=dst_buf)

    def add_ranges(self, src, dst, table: Ranges, index, *, reduce=False, dst_offset=-1, src_buf=0,
                   dst_buf=0) -> None:
        """Like :meth:`add_many`, with transfer ``i`` sending row ``index[i]`` of ``table`` (from
        :meth:`ranges`): a regular schedule then stores one small index per transfer. ``IndexError`` for
        an index outside the table."""
        cols = {"src": _vector("src", src, int), "dst": _vector("dst", dst, int),
                "index": _vector("index", index, int), "reduce": _vector("reduce", reduce, bool),
                "dst_offset": _vector("dst_offset", dst_offset, int), "src_buf": _vector("src_buf", src_buf, int),
                "dst_buf": _vector("dst_buf", dst_buf, int)}
        n = _length(cols)
        if n == 0:
            return
        idx = cols["index"]
        lo, hi = (int(idx.min()), int(idx.max())) if isinstance(idx, np.ndarray) else (idx, idx)
        if lo < 0 or hi >= len(table):
            raise IndexError(f"range index in [{lo}, {hi}] outside a table of {len(table)} rows")
        keep = (table.counts[idx] > 0) & (np.asarray(cols["src"]) != np.asarray(cols["dst"]))
        if not keep.any():
            return
        if not keep.all():
            keep = np.broadcast_to(keep, (n,))
            cols = {k: _take(v, keep) for k, v in cols.items()}
            n = int(keep.sum())
        idx = cols["index"]
        rng = idx.astype(np.int64) + table.start if isinstance(idx, np.ndarray) else idx + table.start
        recv = _receive_offsets(cols["dst_offset"], table, idx)
        if not self._steps:
            self.new_step()
        self._steps[-1].append((n, cols["src"], cols["dst"], rng, recv, cols["reduce"], cols["src_buf"],
                                cols["dst_buf"]))

    def extend(self, other: Schedule) -> None:
        """Append another schedule's steps after the current ones (e.g. reduce-scatter + all-gather)."""
        store = other.store
        table = self.ranges(store.offsets, store.counts)
        for st in store.steps:
            self.new_step()
            self.add_ranges(st.src, st.dst, table, st.rng, reduce=st.reduce,
                            dst_offset=-1 if st.recv is None else st.recv, src_buf=st.src_buf, dst_buf=st.dst_buf)

    def build(self, **meta) -> Schedule:
        if self._tables:
            offsets = np.concatenate([t.offsets for t in self._tables])
            counts = np.concatenate([t.counts for t in self._tables])
        else:
            offsets = counts = np.zeros(0, dtype=np.int64)
        interner = Interner()
        steps = tuple(self._stored(pieces, offsets, interner) for pieces in self._steps if pieces)
        offsets, counts = _compact_table(offsets), _compact_table(counts)
        store = StepStore(steps, offsets, counts, interner.nbytes() + offsets.nbytes + counts.nbytes)
        return Schedule(self.name, self.nranks, store, meta)

    def _stored(self, pieces: list[tuple], offsets: np.ndarray, it: Interner) -> StoredStep:
        lengths = [piece[0] for piece in pieces]
        n = sum(lengths)
        col = {name: _concat(lengths, [piece[k + 1] for piece in pieces])
               for k, name in enumerate(_COLS) if name != "recv"}
        recv = None  # receivers use the senders' offsets, unless some piece says otherwise
        if any(piece[4] is not None for piece in pieces):
            recv = _concat(lengths, [offsets[piece[3]] if piece[4] is None else piece[4] for piece in pieces])
        return StoredStep(it.ints(col["src"], n, self.nranks), it.ints(col["dst"], n, self.nranks),
                          it.ints(col["rng"], n), None if recv is None else it.ints(recv, n),
                          it.bools(col["reduce"], n), it.ints(col["src_buf"], n), it.ints(col["dst_buf"], n))


def _receive_offsets(dst_offset, table: Ranges, idx):
    """Receiver offsets of a piece: ``None`` (the sender's), one int, or an array."""
    if isinstance(dst_offset, int):
        return None if dst_offset < 0 else dst_offset
    if (dst_offset >= 0).all():
        return dst_offset
    if (dst_offset < 0).all():
        return None
    return np.where(dst_offset >= 0, dst_offset, table.offsets[idx])


def _concat(lengths: list[int], parts: list):
    """One column of a step from its pieces' columns (scalars, arrays or ``None``)."""
    if len(parts) == 1:
        return parts[0]
    if all(not isinstance(p, np.ndarray) for p in parts) and len(set(parts)) == 1:
        return parts[0]
    return np.concatenate([p if isinstance(p, np.ndarray) else np.full(n, p) for n, p in zip(lengths, parts)])


def _compact_table(a: np.ndarray) -> np.ndarray:
    out = a.astype(smallest_int(int(a.min()), int(a.max())) if len(a) else np.int8)
    out.flags.writeable = False
    return out


def split_table(count: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`even_split` as two int64 arrays (offsets, lengths), for :meth:`ScheduleBuilder.ranges`."""
    if count < 0 or parts < 1:
        raise ValueError(f"cannot split {count} elements into {parts} parts")
    if count < (1 << 62) // max(parts, 1):
        bounds = np.arange(parts + 1, dtype=np.int64) * count // parts
    else:  # i * count would overflow int64
        bounds = np.array([i * count // parts for i in range(parts + 1)], dtype=np.int64)
    return bounds[:-1], np.diff(bounds)


def even_split(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` contiguous (offset, length) pieces differing by at most one."""
    return [(i * count // parts, (i + 1) * count // parts - i * count // parts) for i in range(parts)]
