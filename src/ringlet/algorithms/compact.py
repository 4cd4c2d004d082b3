"""The storage behind a :class:`~ringlet.algorithms.schedule.Schedule`: per-step numpy arrays, no
Python object per transfer.

A schedule keeps one *range table* (``offsets``, ``counts``: the element ranges its transfers send)
and, per step, a :class:`StoredStep` of parallel arrays: ``src``, ``dst``, ``rng`` (each transfer's
row of the range table), ``recv`` (receiver offsets, or ``None`` when every receiver uses the
sender's offsets), ``reduce``, ``src_buf``, ``dst_buf``. Every array has the smallest signed integer
dtype that holds its values; a column with one value throughout a step is a zero-stride broadcast of
a one-element array; and arrays with equal contents are stored once (the ring's ``src`` and ``dst``
are the same two arrays in every step). A regular schedule then costs a few bytes per transfer (the
``rng`` index) plus one table for the whole schedule.

All stored arrays are read-only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_INTS = tuple((np.dtype(dt), int(np.iinfo(dt).min), int(np.iinfo(dt).max))
              for dt in (np.int8, np.int16, np.int32, np.int64))


def smallest_int(lo: int, hi: int) -> np.dtype:
    """The smallest signed integer dtype holding every value of ``[lo, hi]`` (``OverflowError`` beyond int64)."""
    for dt, dmin, dmax in _INTS:
        if dmin <= lo and hi <= dmax:
            return dt
    raise OverflowError(f"values in [{lo}, {hi}] do not fit in 64 bits")


@dataclass(frozen=True, slots=True)
class StepArrays:
    """One step's transfers as parallel numpy arrays (one entry per transfer, schedule order).

    ``src``/``dst``: schedule ranks; ``offset``/``count``: the sender's element range;
    ``recv_offset``: where the receiver puts it (already resolved, never -1); ``reduce``: bool;
    ``src_buf``/``dst_buf``: buffer indices. Integer arrays may use any integer dtype (the compact
    storage picks the smallest signed one: convert before arithmetic that can overflow it); treat
    them as read-only. This is the form the simulator and the cost model read: whole steps at once,
    without a Python object per transfer.
    """

    src: np.ndarray
    dst: np.ndarray
    offset: np.ndarray
    count: np.ndarray
    recv_offset: np.ndarray
    reduce: np.ndarray
    src_buf: np.ndarray
    dst_buf: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @staticmethod
    def of(transfers) -> "StepArrays":
        """Arrays of a sequence of :class:`~ringlet.algorithms.schedule.Transfer`."""
        ts = list(transfers)

        def col(get, dtype):
            return np.fromiter((get(t) for t in ts), dtype=dtype, count=len(ts))

        return StepArrays(col(lambda t: t.src, np.int32), col(lambda t: t.dst, np.int32),
                          col(lambda t: t.offset, np.int64), col(lambda t: t.count, np.int64),
                          col(lambda t: t.recv_offset, np.int64), col(lambda t: t.reduce, np.bool_),
                          col(lambda t: t.src_buf, np.int8), col(lambda t: t.dst_buf, np.int8))


@dataclass(frozen=True, slots=True)
class StoredStep:
    """One step as stored (see the module docstring); all arrays have the step's length."""

    src: np.ndarray
    dst: np.ndarray
    rng: np.ndarray
    recv: np.ndarray | None
    reduce: np.ndarray
    src_buf: np.ndarray
    dst_buf: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    def arrays(self) -> tuple:
        return (self.src, self.dst, self.rng, self.recv, self.reduce, self.src_buf, self.dst_buf)


class Interner:
    """Stores arrays once per distinct contents (and dtype), read-only, during one build."""

    def __init__(self) -> None:
        self._by_content: dict[tuple, list[np.ndarray]] = {}
        self._consts: dict[tuple, np.ndarray] = {}  # (dtype, value) -> one element
        self._views: dict[tuple, np.ndarray] = {}  # (dtype, value, n) -> its broadcast to n
        self._seen: dict[int, tuple[object, np.ndarray]] = {}  # id of an input -> (input, stored)

    def const(self, value, dtype: np.dtype, n: int) -> np.ndarray:
        """``n`` copies of ``value`` as a zero-stride view of one shared element."""
        key = (np.dtype(dtype).str, value)
        view = self._views.get(key + (n,))
        if view is None:
            base = self._consts.get(key)
            if base is None:
                base = self._consts[key] = np.array([value], dtype=dtype)
                base.flags.writeable = False
            view = self._views[key + (n,)] = np.broadcast_to(base.reshape(()), (n,))
        return view

    def ints(self, a, n: int, limit: int | None = None) -> np.ndarray:
        """``a`` (an integer array of length ``n``, or one int for all ``n``) in its smallest dtype, shared.
        With ``limit``, a value outside ``[0, limit)`` raises ``ValueError``."""
        if isinstance(a, np.ndarray):
            hit = self._seen.get(id(a))
            if hit is not None and hit[0] is a:
                return hit[1]
            lo, hi = (int(a.min()), int(a.max())) if n else (0, 0)
        else:
            lo = hi = int(a)
        if limit is not None and (lo < 0 or hi >= limit):
            raise ValueError(f"ranks must lie in [0, {limit}), got values in [{lo}, {hi}]")
        if lo == hi:
            out = self.const(lo, smallest_int(lo, lo), n)
        else:
            out = self.array(a.astype(smallest_int(lo, hi), copy=False))
        if isinstance(a, np.ndarray):
            self._seen[id(a)] = (a, out)
        return out

    def bools(self, a, n: int) -> np.ndarray:
        """``a`` (a bool array of length ``n``, or one bool for all ``n``), shared."""
        if not isinstance(a, np.ndarray):
            return self.const(bool(a), np.bool_, n)
        if a.all():
            return self.const(True, np.bool_, n)
        if not a.any():
            return self.const(False, np.bool_, n)
        return self.array(a.astype(np.bool_, copy=False))

    def array(self, a: np.ndarray) -> np.ndarray:
        key = (a.dtype.str, len(a), hash(a.tobytes()))
        same = self._by_content.setdefault(key, [])
        for b in same:
            if np.array_equal(a, b):
                return b
        a = a.copy()  # never a view of (or a flag on) the caller's array
        a.flags.writeable = False
        same.append(a)
        return a

    def nbytes(self) -> int:
        """Bytes of everything stored so far (shared arrays counted once)."""
        return sum(a.nbytes for group in self._by_content.values() for a in group) + \
            sum(a.nbytes for a in self._consts.values())


class StepStore:
    """The steps of a schedule and its range table (see the module docstring)."""

    __slots__ = ("steps", "offsets", "counts", "_nbytes")

    def __init__(self, steps: tuple[StoredStep, ...], offsets: np.ndarray, counts: np.ndarray, nbytes: int):
        self.steps, self.offsets, self.counts, self._nbytes = steps, offsets, counts, nbytes

    def __len__(self) -> int:
        return len(self.steps)

    def arrays(self, s: int) -> StepArrays:
        st = self.steps[s]
        off, cnt = self.offsets[st.rng], self.counts[st.rng]
        return StepArrays(st.src, st.dst, off, cnt, off if st.recv is None else st.recv, st.reduce,
                          st.src_buf, st.dst_buf)

    def num_transfers(self) -> int:
        return sum(len(st) for st in self.steps)

    def nbytes(self) -> int:
        """Memory of the stored arrays and the range table, shared arrays counted once."""
        return self._nbytes

