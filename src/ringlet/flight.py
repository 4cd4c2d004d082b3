"""The flight recorder: each rank's ring buffer of its last collectives, written as JSON when it matters.

The runtime owns one :class:`FlightRecorder`. Every request queued through
:meth:`ringlet.runtime.Runtime.submit_op` adds one :class:`Record` (no tensor is referenced: shape,
dtype and size are copied), stamped when queued, started (with its group's sequence number) and
finished or failed. The buffer keeps the last ``RINGLET_FLIGHT_RECORDER`` records (default 2000;
0 turns the recorder off).

The record is written (atomically: a temporary file, then ``os.replace``) by :func:`dump` to a path
given, or to ``$RINGLET_FLIGHT_DIR/rank-<R>.json`` (default: ``<tmp>/ringlet-flight-<job id>``, the job
id from ``TORCHELASTIC_RUN_ID``, else ``local``). The runtime dumps it by itself once per failure when a
collective fails with ``PeerError``, ``CollectiveTimeout`` or ``MismatchError``, at shutdown and at
exit; :func:`install_signal_handler` adds ``SIGUSR1`` (only from the main thread, and only when no
other handler is installed for it). ``ringlet diagnose DIR`` reads the files.
"""
from __future__ import annotations

import collections
import json
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

DEFAULT_SIZE = 2000
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_KINDS = {"AllreduceRequest": "allreduce", "AllgatherRequest": "allgather", "ReduceScatterRequest": "reduce_scatter",
          "AlltoallRequest": "alltoall", "BarrierRequest": "barrier"}


def configured_size() -> int:
    """``RINGLET_FLIGHT_RECORDER`` as a record count (default 2000, 0 = off); a bad value is an error."""
    raw = os.environ.get("RINGLET_FLIGHT_RECORDER", "")
    if raw == "":
        return DEFAULT_SIZE
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"RINGLET_FLIGHT_RECORDER={raw!r}: expected a record count (0 turns it off)") from None
    if n < 0:
        raise ValueError(f"RINGLET_FLIGHT_RECORDER={raw!r}: expected a count >= 0")
    return n


def default_dir() -> str:
    """``$RINGLET_FLIGHT_DIR``, else a folder under the system temp dir named by the job id."""
    d = os.environ.get("RINGLET_FLIGHT_DIR")
    if d:
        return d
    job = os.environ.get("TORCHELASTIC_RUN_ID") or "local"
    return os.path.join(tempfile.gettempdir(), f"ringlet-flight-{job}")


_INSIDE: dict = {}  # code object -> whether it belongs to the ringlet package (a few hundred at most)


def call_site(depth: int = 2, limit: int = 16) -> tuple[str, int] | None:
    """``(file, line)`` of the first frame outside the ringlet package, ``depth`` frames above the caller."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    inside = _INSIDE
    for _ in range(limit):
        if f is None:
            return None
        code = f.f_code
        ins = inside.get(code)
        if ins is None:
            ins = inside[code] = code.co_filename.startswith(_PACKAGE_DIR)
        if not ins:
            return code.co_filename, f.f_lineno
        f = f.f_back
    return None


def _site_text(site: tuple[str, int] | None) -> str:
    return "" if site is None else f"{site[0]}:{site[1]}"


class Record:
    """One collective as this rank saw it, kept cheap: the monotonic times (``time.monotonic``; the dump
    adds the wall clock's offset), ``dtype`` as the torch dtype, the shape as its ``torch.Size`` (no
    reference to the tensor); ``seq`` is None until it starts; ``site``: (file, line) of the user's call;
    ``algorithm``: the one requested, replaced by the one that ran once an all-reduce is done."""

    __slots__ = ("group", "ranks", "seq", "kind", "name", "shape", "dtype", "algorithm", "site", "state",
                 "error", "error_type", "peer", "m_enqueue", "m_start", "m_end")

    def __init__(self, op: Any, site: tuple[str, int] | None) -> None:
        g = op.group
        self.group, self.ranks, self.seq, self.site = g.id, g.ranks, None, site
        kind = _KINDS.get(type(op).__name__)
        self.kind = kind if kind is not None else _kind_of(op)
        t = getattr(op, "buf", None)
        if t is None:
            t = getattr(op, "tensor", None)
        self.shape, self.dtype = ((), None) if t is None else (t.shape, t.dtype)
        spec = getattr(op, "compressed", None)
        self.name = "" if spec is None else spec.name
        self.algorithm = getattr(op, "algorithm", "")
        self.state, self.error, self.error_type, self.peer = "queued", "", "", None
        self.m_enqueue = time.monotonic()
        self.m_start = self.m_end = None

    def to_json(self, wall_offset: float) -> dict:
        """The record as JSON-ready values; ``wall_offset``: ``time.time() - time.monotonic()``."""
        dt = self.dtype
        d = {k: getattr(self, k) for k in self.__slots__}
        d["ranks"], d["shape"], d["site"] = list(self.ranks), list(self.shape), _site_text(self.site)
        d["dtype"] = "" if dt is None else str(dt).replace("torch.", "")
        d["bytes"] = 0 if dt is None else math.prod(self.shape) * dt.itemsize
        d["algorithm"] = self.algorithm or ""
        for k in ("enqueue", "start", "end"):
            m = d[f"m_{k}"]
            d[f"t_{k}"] = None if m is None else m + wall_offset
        return d


def _kind_of(op: Any) -> str:
    kind = getattr(op, "kind", None)
    return kind.name.lower() if kind is not None else type(op).__name__


class FlightRecorder:
    """The ring buffer of one rank. ``size`` 0: off (``enqueue`` returns None and nothing is kept)."""

    def __init__(self, rank: int, world_size: int, size: int | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.size = configured_size() if size is None else size
        self.records: collections.deque = collections.deque(maxlen=max(self.size, 1))
        self.hostname = socket.gethostname()
        self.failure: str | None = None  # the first failed collective's error (dumped once, kept in later dumps)
        self.appended = 0  # records ever appended (raised after each append): readers count what the ring lost
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def enqueue(self, op: Any) -> Record | None:
        """Record ``op`` as queued, with the user's call site; None when off."""
        if self.size <= 0:
            return None
        rec = Record(op, call_site(3))
        self.records.append(rec)
        self.appended += 1
        return rec

    def snapshot(self, reason: str, tail: int | None = None) -> dict:
        """This rank's dump as a JSON-ready dict. ``tail``: keep only each group's last ``tail`` records.
        ``complete``: the records hold every collective since the runtime started (none dropped)."""
        with self._lock:
            recs = list(self.records)
        complete = len(recs) < self.records.maxlen
        if tail is not None:
            seen: dict[int, int] = {}
            kept = []
            for r in reversed(recs):
                seen[r.group] = seen.get(r.group, 0) + 1
                if seen[r.group] <= tail:
                    kept.append(r)
            complete = complete and len(kept) == len(recs)
            recs = kept[::-1]
        offset = time.time() - time.monotonic()
        return {"version": 1, "rank": self.rank, "world_size": self.world_size, "hostname": self.hostname,
                "pid": os.getpid(), "time": time.time(), "reason": reason, "failure": self.failure,
                "capacity": self.size, "complete": complete, "records": [r.to_json(offset) for r in recs]}

    def dump(self, path: str | None = None, reason: str = "requested", tail: int | None = None) -> str:
        """Write the snapshot (``tail``: see :meth:`snapshot`) to ``path`` (default
        ``default_dir()/rank-<R>.json``) atomically; return the path."""
        if path is None:
            path = os.path.join(default_dir(), f"rank-{self.rank}.json")
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".rank-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.snapshot(reason, tail), fh)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path


def started(rec: Record, seq: int) -> None:
    rec.seq, rec.state, rec.m_start = seq, "running", time.monotonic()


def finished(rec: Record, error: BaseException | None = None) -> None:
    rec.m_end = time.monotonic()
    if error is None:
        rec.state = "done"
    else:
        rec.state, rec.error_type = "failed", type(error).__name__
        rec.error, rec.peer = str(error)[:500], getattr(error, "rank", None)


def install_signal_handler(get_recorder) -> bool:
    """Dump ``get_recorder()``'s record on SIGUSR1. Installed only from the main thread and only when
    SIGUSR1 has its default handler (a program's own handler is never replaced); returns whether it was."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(sig) not in (signal.SIG_DFL, None):
        return False

    def handler(signum, frame):
        rec = get_recorder()
        if rec is not None and rec.enabled:
            rec.dump(reason="SIGUSR1")

    signal.signal(sig, handler)
    return True
