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
exit; :func:`install_signal_handler` adds ``SIGUSR1`` and ``SIGTERM`` (only from the main thread, and
only where no other handler is installed for the signal; after its dump, SIGTERM still ends the
process). ``ringlet diagnose DIR`` reads the files.
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


_INSIDE: dict = {}  # code object -> whether it belongs to ringlet or torch (a few hundred at most): the
# user's call site is the first frame outside them (FlightRecorder.enqueue)


def _library_dirs() -> tuple[str, ...]:
    """The folders whose frames are not the user's: ringlet's, and torch's (autograd runs DDP's hooks
    from ``backward()``)."""
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return (_PACKAGE_DIR,) if not path else (_PACKAGE_DIR, os.path.dirname(os.path.abspath(path)) + os.sep)


def _site_text(site: tuple[str, int] | None) -> str:
    return "" if site is None else f"{site[0]}:{site[1]}"


# An entry of the ring is a plain list (the cheapest object Python builds), indexed by these; the runtime
# stamps SEQ, START and END itself. ERROR is None or (type name, message, peer rank).
GROUP, KIND, SHAPE, DTYPE, NAME, ALGO, CODE, LINE, ENQUEUE, SEQ, START, END, ERROR = range(13)
_monotonic = time.monotonic
_DESC: dict = {}  # request class -> what _describe found out about it


def _describe(op: Any) -> tuple:
    """``(kind or None when the request carries it, tensor attribute, has compression, has algorithm,
    has a name)`` of request ``op``'s class, worked out once per class (a request class's instances
    share attributes)."""
    attr = "buf" if hasattr(op, "buf") else "tensor" if hasattr(op, "tensor") else None
    d = _DESC[op.__class__] = (_KINDS.get(op.__class__.__name__), attr, hasattr(op, "compressed"),
                               hasattr(op, "algorithm"), hasattr(op, "name"))
    return d


class Record:
    """One collective as this rank saw it, read from a ring entry: the monotonic times
    (``time.monotonic``; the dump adds the wall clock's offset), ``dtype`` as the torch dtype, the shape
    as its ``torch.Size`` (no reference to the tensor is kept); ``seq`` is None until it starts;
    ``site``: (file, line) of the user's call; ``state``: queued, running, done or failed."""

    __slots__ = ("group", "ranks", "seq", "kind", "name", "shape", "dtype", "algorithm", "site", "state",
                 "error", "error_type", "peer", "m_enqueue", "m_start", "m_end")

    def __init__(self, e: list) -> None:
        g = e[GROUP]
        self.group, self.ranks, self.seq, self.kind = g.id, g.ranks, e[SEQ], e[KIND]
        self.shape, self.dtype, self.name, self.algorithm = e[SHAPE] or (), e[DTYPE], e[NAME], e[ALGO] or ""
        code = e[CODE]
        self.site = None if code is None else (code.co_filename, e[LINE])
        self.m_enqueue, self.m_start, self.m_end = e[ENQUEUE], e[START], e[END]
        err = e[ERROR]
        self.error_type, self.error, self.peer = ("", "", None) if err is None else err
        self.state = ("queued" if self.seq is None else "running" if self.m_end is None
                      else "done" if err is None else "failed")

    def to_json(self, wall_offset: float) -> dict:
        """The record as JSON-ready values; ``wall_offset``: ``time.time() - time.monotonic()``."""
        dt = self.dtype
        d = {k: getattr(self, k) for k in self.__slots__}
        d["ranks"], d["shape"], d["site"] = list(self.ranks), list(self.shape), _site_text(self.site)
        d["dtype"] = "" if dt is None else str(dt).replace("torch.", "")
        d["bytes"] = 0 if dt is None else math.prod(self.shape) * dt.itemsize
        for k in ("enqueue", "start", "end"):
            m = d[f"m_{k}"]
            d[f"t_{k}"] = None if m is None else m + wall_offset
        return d


class FlightRecorder:
    """The ring buffer of one rank. ``size`` 0: off (``enqueue`` returns None and nothing is kept).

    The collective path pays for one list and two or three clock reads per collective, and a walk of the
    few ringlet frames above it to the user's call site; everything else (kind names, byte counts, wall
    times) is worked out when the record is read (:attr:`records`, :meth:`snapshot`). ``appended``: how
    many entries the ring has taken since it started (those beyond the last ``size`` are gone)."""

    def __init__(self, rank: int, world_size: int, size: int | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.size = configured_size() if size is None else size
        self._ring: collections.deque = collections.deque(maxlen=max(self.size, 1))
        self.appended = 0
        self.hostname = socket.gethostname()
        self.failure: str | None = None  # the first failed collective's error (dumped once, kept in later dumps)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def records(self) -> list[Record]:
        """The ring's records, oldest first, as of now (entries still running may change afterwards)."""
        for _ in range(3):
            try:
                return [Record(e) for e in list(self._ring)]
            except RuntimeError:  # the deque changed while it was copied: copy again
                continue
        return []

    def recent(self, n: int) -> list[Record]:
        """The ring's last ``n`` records, oldest first (as :attr:`records`)."""
        for _ in range(3):
            try:
                ring = self._ring
                k = len(ring)
                return [Record(ring[i]) for i in range(max(k - n, 0), k)]
            except (RuntimeError, IndexError):  # the deque changed meanwhile: read again
                continue
        return []

    def enqueue(self, op: Any, skip: int = 0) -> list | None:
        """Record request ``op`` as queued, with the user's call site; the ring entry, or None when off.
        Called by the runtime only, from a ringlet function (the runtime's caller): the call site is
        looked for from ``skip`` frames above that function (frames skipped that way cost nothing; each
        frame looked at costs Python a frame object, about half a microsecond for a short-lived one)."""
        if self.size <= 0:
            return None
        try:
            f = sys._getframe(3 + skip)
        except ValueError:  # called from the top of a stack: no user frame above
            f = None
        inside = _INSIDE
        for _ in range(24 if f is not None else 0):
            code = f.f_code
            ins = inside.get(code)
            if ins is None:
                ins = inside[code] = code.co_filename.startswith(_library_dirs())
            if not ins:
                break
            f = f.f_back
            if f is None:
                code = None
                break
        else:
            code = None
        cls = op.__class__
        kind, attr, has_spec, has_algo, has_name = _DESC.get(cls) or _describe(op)
        if attr is None:
            shape = dtype = None
        else:
            t = getattr(op, attr)
            shape, dtype = t.shape, t.dtype
        spec = op.compressed if has_spec else None
        name = spec.name if spec is not None else op.name if has_name else ""
        e = [op.group, kind or _kind_of(op), shape, dtype, name,
             op.algorithm if has_algo else "", code, f.f_lineno if code is not None else 0, _monotonic(),
             None, None, None, None]
        self._ring.append(e)
        self.appended += 1
        return e

    def begin(self, group: Any, kind: str, tensor: Any, name: str = "", algorithm: str = "") -> list | None:
        """Record a collective that starts now outside the runtime's queue (a front end that runs the engine
        on a channel of its own: the Horovod-style coordinator's collectives):
        the ring entry, queued and started at once (the caller stamps ``SEQ``), or None when off. No call
        site: such collectives run on a background thread."""
        if self.size <= 0:
            return None
        now = _monotonic()
        e = [group, kind, None if tensor is None else tensor.shape, None if tensor is None else tensor.dtype,
             name, algorithm, None, 0, now, None, now, None, None]
        self._ring.append(e)
        self.appended += 1
        return e

    def snapshot(self, reason: str, tail: int | None = None) -> dict:
        """This rank's dump as a JSON-ready dict. ``tail``: keep only each group's last ``tail`` records.
        ``complete``: the records hold every collective since the runtime started (none dropped)."""
        recs = self.records
        complete = self.appended <= self._ring.maxlen
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


def _kind_of(op: Any) -> str:
    kind = getattr(op, "kind", None)
    if kind is None:
        return type(op).__name__
    name = kind.name.lower()
    return "reduce_scatter" if name == "reducescatter" else name


def failed(entry: list, error: BaseException) -> None:
    """Mark ring ``entry`` failed with ``error`` (its type, message and the peer it names, if any)."""
    entry[ERROR] = (type(error).__name__, str(error)[:500], getattr(error, "rank", None))
    entry[END] = _monotonic()


def install_signal_handler(get_recorder) -> bool:
    """Dump ``get_recorder()``'s record on SIGUSR1, and on SIGTERM before dying of it as before (a
    launcher stops the other ranks of a failed job with SIGTERM: their records say where they were).
    Installed only from the main thread and only for a signal that has its default handler (a program's
    own handler is never replaced); returns whether the SIGUSR1 handler was."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def handler(signum, frame):
        rec = get_recorder()
        if rec is not None and rec.enabled:
            try:
                rec.dump(reason=signal.Signals(signum).name)
            except OSError:
                pass
        if signum == getattr(signal, "SIGTERM", None):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    installed = False
    for name in ("SIGTERM", "SIGUSR1"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)
            installed = installed or name == "SIGUSR1"
    return installed
