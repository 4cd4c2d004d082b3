"""Timeline: a Chrome-trace JSON file (opens in Perfetto / chrome://tracing) of what ringlet did when.

One process (``pid``) per rank, one thread (``tid``) per *track* — a tensor name, ``"backward"``,
``"steps"`` — named through ``thread_name`` metadata events. Spans are complete events (``"ph": "X"``)
whose ``name`` is the phase: ``NEGOTIATE``, ``QUEUE``, ``FUSE``, ``COMMUNICATE``, ``BACKWARD``,
``FORWARD``. :func:`mark_step` writes an instant event named ``"step"`` that ``ringlet report`` uses to
cut the trace into training steps.

The file is streamed: ``[`` first, then one event per line with a leading comma, ``]`` on close. Events
are buffered only briefly (a few KiB or a fraction of a second) and always written whole, so a file cut
off by a crash is a JSON array missing its closing bracket — which Chrome and Perfetto accept, and which
:func:`read_events` reads too.

Enabling it: ``RINGLET_TIMELINE=path`` or Horovod's ``HOROVOD_TIMELINE=path`` (read by
:func:`configure_from_env`, which the ``init`` functions call), or :func:`start_timeline` /
:func:`stop_timeline` at run time (``HOROVOD_TIMELINE=DYNAMIC`` means "only when started that way").
Rank 0 writes the file unless the path contains ``{rank}``, in which case every rank writes its own.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from typing import Any, Iterator

__all__ = ["Timeline", "active", "start_timeline", "stop_timeline", "paused", "configure_from_env", "mark_step",
           "now_us", "span", "instant", "record", "read_events", "Intervals", "union", "measure", "intersect"]

# Buffer limits: big enough that a step of per-tensor phases costs a handful of writes, small enough that
# memory stays flat and a crash loses at most a moment of history.
_FLUSH_BYTES = 64 << 10
_FLUSH_SECONDS = 0.25

STEP_TRACK = "steps"
STEP_EVENT = "step"


def now_us() -> float:
    """Microseconds on the clock every span uses (monotonic, shared by the processes of one host)."""
    return time.monotonic_ns() / 1000.0


class Timeline:
    """An open trace file. Thread-safe: the comm thread and the main thread record concurrently."""

    def __init__(self, path: str, rank: int = 0, mark_cycles: bool = False):
        self.path = path
        self.rank = rank
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        self._tids: dict[str, int] = {}
        self._buf: list[str] = []
        self._buf_bytes = 0
        self._last_flush = time.monotonic()
        self._closed = False
        self._file = open(path, "w", encoding="utf-8")
        self._file.write("[\n")
        self._emit_first({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                          "args": {"name": f"rank {rank}"}})
        self._flush_locked()

    # ---- writing ---------------------------------------------------------------------------------
    def _emit_first(self, event: dict) -> None:
        self._buf.append(json.dumps(event, separators=(",", ":")))

    def _emit(self, event: dict) -> None:
        # Caller holds the lock. Leading comma keeps every flushed prefix a valid unterminated array.
        line = ",\n" + json.dumps(event, separators=(",", ":"))
        self._buf.append(line)
        self._buf_bytes += len(line)
        if self._buf_bytes >= _FLUSH_BYTES or time.monotonic() - self._last_flush >= _FLUSH_SECONDS:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._buf:
            self._file.write("".join(self._buf))
            self._buf.clear()
            self._buf_bytes = 0
        self._file.flush()
        self._last_flush = time.monotonic()

    def _tid(self, track: str) -> int:
        tid = self._tids.get(track)
        if tid is None:
            tid = self._tids[track] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": track}})
            self._emit({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid,
                        "args": {"sort_index": tid}})
        return tid

    # ---- public ----------------------------------------------------------------------------------
    def span(self, track: str, phase: str, start_us: float, end_us: float, args: dict | None = None) -> None:
        """Record that ``track`` (usually a tensor name) spent ``[start_us, end_us]`` in ``phase``."""
        self._record(track, {"name": phase, "cat": phase, "ph": "X", "ts": round(start_us, 3),
                             "dur": round(max(0.0, end_us - start_us), 3), "pid": self.rank}, args)

    def instant(self, track: str, name: str, args: dict | None = None, ts_us: float | None = None) -> None:
        """Record a point event ``name`` on ``track`` (now, unless ``ts_us`` is given)."""
        self._record(track, {"name": name, "ph": "i", "s": "p", "pid": self.rank,
                             "ts": round(now_us() if ts_us is None else ts_us, 3)}, args)

    def _record(self, track: str, ev: dict[str, Any], args: dict | None) -> None:
        if args:
            ev["args"] = args
        with self._lock:
            if self._closed:
                return
            ev["tid"] = self._tid(track)
            self._emit(ev)

    def cycle(self, args: dict | None = None) -> None:
        """Mark the start of a coordinator cycle (only when the timeline was started with ``mark_cycles``)."""
        if self.mark_cycles:
            self.instant("cycles", "CYCLE_START", args)

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        """Write the closing bracket and close the file; later records are ignored. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._flush_locked()
            self._file.write("\n]\n")
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._closed


# ---- process-wide timeline ------------------------------------------------------------------------
_active: Timeline | None = None
_paused: list[Timeline] = []  # timelines held by open paused() blocks (stop_timeline closes them too)
_state_lock = threading.Lock()
_env_rank: int | None = None
_env_started: set[str] = set()  # env paths already started by configure_from_env in this process
_atexit_done = False


def active() -> Timeline | None:
    """The timeline being written by this process, or ``None`` (cheap: a global read)."""
    return _active


def _current_rank() -> int:
    if _env_rank is not None:
        return _env_rank
    try:
        import ringlet

        if ringlet.is_initialized():
            return ringlet.rank()
    except Exception:  # a half-initialised runtime must not break tracing
        pass
    for name in ("RINGLET_RANK", "HOROVOD_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        val = os.environ.get(name)
        if val not in (None, ""):
            return int(val)
    return 0


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline to ``file_path`` (Horovod's name and semantics).

    Rank 0 writes; when ``file_path`` contains ``{rank}`` every rank writes its own file with the rank
    substituted. A timeline already running is stopped first, so the call may switch files.
    """
    global _active, _atexit_done
    if not file_path:
        raise ValueError("start_timeline needs a file path")
    rank = _current_rank()
    per_rank = "{rank}" in file_path
    with _state_lock:
        if _active is not None:
            _active.close()
            _active = None
        if not per_rank and rank != 0:
            return
        path = file_path.replace("{rank}", str(rank))
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        _active = Timeline(path, rank, mark_cycles)
        if not _atexit_done:
            atexit.register(stop_timeline)
            _atexit_done = True


def stop_timeline() -> None:
    """Close the running timeline (a complete JSON file afterwards), also one held by :func:`paused`;
    a no-op when none runs."""
    global _active
    with _state_lock:
        tl, _active = _active, None
        held = list(_paused)
    for t in (tl, *held):
        if t is not None:
            t.close()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Drop every event of the ``with`` block; the file stays open and recording resumes after it.

    For keeping part of a run out of a training trace (evaluation, or the other arms of an A/B job)
    without starting a new file. A timeline started inside the block replaces the paused one, which is
    then closed; one stopped inside the block stays stopped.
    """
    global _active
    with _state_lock:
        held, _active = _active, None
        if held is not None:
            _paused.append(held)
    try:
        yield
    finally:
        with _state_lock:
            if held is not None:
                _paused.remove(held)
                if _active is None and not held.closed:
                    _active, held = held, None
        if held is not None:
            held.close()


def configure_from_env(rank: int | None = None) -> None:
    """Start a timeline if ``RINGLET_TIMELINE`` or ``HOROVOD_TIMELINE`` names a file.

    ``DYNAMIC`` (Horovod's value) starts nothing: the script calls :func:`start_timeline` itself.
    ``HOROVOD_TIMELINE_MARK_CYCLES=1`` records coordinator cycles. Each path is started once per process:
    later calls (every ``init``, every DDP wrapper) neither truncate it nor restart it after
    :func:`stop_timeline`.
    """
    global _env_rank
    if rank is not None:
        _env_rank = int(rank)
    path = os.environ.get("RINGLET_TIMELINE") or os.environ.get("HOROVOD_TIMELINE") or ""
    if not path or path.strip().upper() == "DYNAMIC":
        return
    cycles = os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "").strip().lower() in ("1", "true", "yes", "on")
    with _state_lock:
        if path in _env_started:
            return
        _env_started.add(path)
    start_timeline(path, mark_cycles=cycles)


def mark_step(args: dict | None = None) -> None:
    """Mark the boundary between training steps (an instant ``"step"``); a no-op without a timeline."""
    tl = _active
    if tl is not None:
        tl.instant(STEP_TRACK, STEP_EVENT, args)


def span(track: str, phase: str, start_us: float, end_us: float, args: dict | None = None) -> None:
    """:meth:`Timeline.span` on the active timeline; a no-op without one."""
    tl = _active
    if tl is not None:
        tl.span(track, phase, start_us, end_us, args)


def instant(track: str, name: str, args: dict | None = None) -> None:
    """:meth:`Timeline.instant` on the active timeline; a no-op without one."""
    tl = _active
    if tl is not None:
        tl.instant(track, name, args)


@contextlib.contextmanager
def record(track: str, phase: str, args: dict | None = None) -> Iterator[None]:
    """Record the body of the ``with`` block as a ``phase`` span on ``track`` (if a timeline is active)."""
    if _active is None:
        yield
        return
    t0 = now_us()
    try:
        yield
    finally:
        span(track, phase, t0, now_us(), args)


def read_events(path: str) -> list[dict]:
    """Parse a timeline file, complete or cut off (missing ``]``, trailing comma, torn last line)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):  # the object form {"traceEvents": [...]}
        return list(data.get("traceEvents", []))
    if isinstance(data, list):
        return data
    events = []
    for line in text.splitlines():
        line = line.strip().strip(",")
        if not line or line in ("[", "]"):
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the torn tail of a file whose writer died
    return events


# ---- interval arithmetic over spans (microseconds): what the overlap measures are made of -----------------
Intervals = list[tuple[float, float]]


def union(intervals: Intervals) -> Intervals:
    """Sorted, disjoint cover of ``intervals`` (empty ones dropped)."""
    out: Intervals = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def measure(intervals: Intervals) -> float:
    """Total length of disjoint intervals."""
    return sum(b - a for a, b in intervals)


def intersect(xs: Intervals, ys: Intervals) -> Intervals:
    """Intersection of two sorted disjoint interval lists (two-pointer sweep)."""
    out: Intervals = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out
