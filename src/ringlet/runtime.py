"""The per-process runtime: one transport, the groups, tag sequencing and the communication thread.

Collectives execute one at a time in submission order, either inline in the caller (nothing queued)
or on the background thread (``*_async``), so every rank runs them in the same order.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import socket
import threading
from time import monotonic as _monotonic
from typing import Any, Callable

from .engine.agree import exchange
from .engine.channel import P2P_SLOT, Channel, tag_base
from . import flight
from .group import Group
from .timeline import now_us
from .tuning.select import Selector
from .types import CollectiveTimeout, MismatchError, Options, PeerError

_SEQ, _START, _END, _ALGO = flight.SEQ, flight.START, flight.END, flight.ALGO


_WORK_LOCK = threading.Lock()  # guards every Work's completion against a waiter or a callback arriving


class Work:
    """Handle of an asynchronous collective: ``wait()`` returns its result or raises its error."""

    __slots__ = ("_done", "_event", "_result", "_error", "_callbacks", "span")

    def __init__(self) -> None:
        self._done = False
        self._event: threading.Event | None = None  # made only for a wait that has to block
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] | None = None
        self.span: tuple[float, float] | None = None  # (start, end) of its execution, timeline microseconds

    def _run(self, fn: Callable[[], Any], explain: Callable[[PeerError], BaseException] | None = None) -> None:
        """Execute ``fn`` as this work's job: record its span and finish with its result or error (a
        ``PeerError`` as ``explain`` rewrites it)."""
        t0 = now_us()
        try:
            result, error = fn(), None
        except PeerError as exc:
            result, error = None, exc if explain is None else explain(exc)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through wait()
            result, error = None, exc
        self.span = (t0, now_us())
        self._finish(result, error)

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        with _WORK_LOCK:
            self._result, self._error = result, error
            self._done = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, None
        for cb in callbacks or ():
            cb(self)

    def add_done_callback(self, fn: Callable[["Work"], None]) -> None:
        """Call ``fn(work)`` once the collective has completed, on the thread that completes it (at
        once, on this thread, when it already has). ``fn`` must not raise."""
        with _WORK_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def done(self) -> bool:
        """True once the collective has completed (successfully or not); never blocks."""
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until completion; return the result (the output tensor) or raise the collective's error."""
        if not self._done:
            with _WORK_LOCK:
                if not self._done and self._event is None:
                    self._event = threading.Event()
                event = self._event
            if event is not None and not event.wait(timeout):
                raise TimeoutError("collective still running")
        if self._error is not None:
            raise self._error
        return self._result


MAX_GROUPS = P2P_SLOT  # group tag slots 0 .. P2P_SLOT - 1; the last one carries point-to-point messages


class Runtime:
    def __init__(self, transport, options: Options | None = None):
        self.transport = transport
        self.options = options or Options.from_env()
        self.rank = transport.rank
        self.size = transport.size
        self._seq: dict[int, int] = collections.defaultdict(int)
        self._exec_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._queued = 0
        self._wake = threading.Condition(self._state_lock)
        self._worker: threading.Thread | None = None
        self._closed = False
        self.groups: list[Group] = []
        self.workspace: dict = {}  # executor scratch, reused across collectives of this rank
        hostnames = self._exchange_hostnames()
        order: dict[str, int] = {}
        host_of = tuple(order.setdefault(h, len(order)) for h in hostnames)
        self.hostnames = hostnames
        self.world = self._add_group(tuple(range(self.size)), host_of)
        self._seq[self.world.id] = 1  # sequence 0 carried the hostname exchange
        # The calibrated network of this job, set by ringlet.init (ringlet.tuning.autoload.attach):
        # (Network, Topology) and the Profile it came from, or None without a matching profile.
        self.network_model = None
        self.profile = None
        # The algorithm selector every channel of this runtime hands the engine: the size rule until
        # ringlet.init (ringlet.tuning.autoload.attach) gives it the calibration profile's cost model.
        self.selector = Selector()
        # The liveness monitor (ringlet.liveness), set by ringlet.init when the job has a store.
        self.monitor = None
        # The heap decay thread (ringlet.memory), set by ringlet.init; None when off.
        self.heap_decay = None
        # The stall inspector (ringlet.stall), set by ringlet.init; None for a world of one.
        self.stall = None
        # The flight recorder (ringlet.flight): the last collectives queued through submit_op.
        self.recorder = flight.FlightRecorder(self.rank, self.size)

    # ---- topology -------------------------------------------------------------------------
    def _exchange_hostnames(self) -> tuple[str, ...]:
        """Every rank's hostname, exchanged as op 0 of the world (before any group exists)."""
        name = os.environ.get("RINGLET_HOSTNAME") or os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
        ch = Channel.world(self.transport, tag_base(0, 0), timeout=self.options.timeout)
        raws = exchange(ch.meta(), name.encode()[:63], 64)
        return tuple(raw.rstrip(b"\0").decode(errors="replace") for raw in raws)

    @property
    def local_ranks(self) -> list[int]:
        h = self.world.host_of[self.rank]
        return [r for r in range(self.size) if self.world.host_of[r] == h]

    def local_rank(self) -> int:
        return self.local_ranks.index(self.rank)

    def local_size(self) -> int:
        return len(self.local_ranks)

    def cross_rank(self) -> int:
        lr = self.local_rank()
        peers = [r for r in range(self.size) if self._local_rank_of(r) == lr]
        return peers.index(self.rank)

    def cross_size(self) -> int:
        lr = self.local_rank()
        return sum(1 for r in range(self.size) if self._local_rank_of(r) == lr)

    def _local_rank_of(self, r: int) -> int:
        h = self.world.host_of[r]
        return [q for q in range(self.size) if self.world.host_of[q] == h].index(r)

    # ---- groups and tags ------------------------------------------------------------------
    def _add_group(self, ranks: tuple[int, ...], host_of: tuple[int, ...]) -> Group:
        g = Group(len(self.groups), ranks, host_of, self._tag_slot(ranks))
        self.groups.append(g)
        return g

    def _tag_slot(self, ranks: tuple[int, ...]) -> int:
        """The lowest tag slot that no earlier group with two or more of ``ranks`` among its members has.

        Message tags carry the slot in GROUP_BITS bits, the last slot reserved for point-to-point. Two groups
        in one slot share tags, which is safe exactly when no pair of ranks belongs to both: a message always
        travels between two members.
        Identical on every rank, since every rank creates the same groups in the same order."""
        members = set(ranks)
        taken = {g.tag_slot for g in self.groups if len(members.intersection(g.ranks)) >= 2}
        free = next((s for s in range(MAX_GROUPS) if s not in taken), None)
        if free is None:
            raise RuntimeError(
                f"ringlet supports {MAX_GROUPS} groups per session that share two or more ranks with each "
                f"other (the world included); ranks {list(ranks)} would make one more. Reuse groups, or "
                "start a new session with ringlet.shutdown() and ringlet.init().")
        return free

    def new_group(self, ranks) -> Group:
        """Create a sub-group. Like ``torch.distributed.new_group``, every rank calls it in the same order."""
        ranks = tuple(sorted(set(int(r) for r in ranks)))
        if not ranks:
            raise ValueError("A group needs at least one rank.")
        for r in ranks:
            if not 0 <= r < self.size:
                raise ValueError(f"Rank {r} is outside the world of size {self.size}.")
        g = self._add_group(ranks, tuple(self.world.host_of[r] for r in ranks))
        if self.transport.capabilities.group_setup:
            # Queued like a collective: the backend's group creation must not overlap the comm thread.
            self.submit(lambda: self.transport.on_new_group(g.id, ranks), sync=True).wait()
        return g

    def next_tag(self, group: Group) -> int:
        """Tag base of the next op on ``group``; called in execution order, identical on all members."""
        seq = self._seq[group.id]
        self._seq[group.id] = seq + 1
        return tag_base(group.tag_slot, seq)

    def last_started(self) -> dict[int, int]:
        """Group id -> sequence number of the last collective started on it, whichever path took its
        channel (any thread may call it)."""
        return {g: n - 1 for g, n in dict(self._seq).items()}

    def channel(self, group: Group, workspace: dict | None = None) -> Channel:
        """The channel of the next op on ``group`` (takes its tag: call in execution order). ``workspace``:
        the calling thread's executor scratch (default: the runtime's, which belongs to the thread that
        executes the runtime's queue)."""
        return Channel(self.transport, group, group.rank_of(self.rank), self.next_tag(group),
                       self.options.segment_bytes, self.options.timeout,
                       self.workspace if workspace is None else workspace, self.selector)

    # ---- execution ------------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any], *, sync: bool) -> Work:
        """Run ``fn`` after every earlier submission. Synchronous calls with nothing queued run inline, and
        so do all calls made by a queued function itself, asynchronous ones too: it already holds its place
        in the order (a job on the communication thread may run several collectives), and queueing behind
        itself could never finish while it waits."""
        work = Work()
        with self._state_lock:
            if self._closed:
                raise RuntimeError("ringlet has been shut down")
            on_worker = threading.current_thread() is self._worker
            inline = on_worker or (sync and self._queued == 0)
            if not inline:
                self._queued += 1
                self._queue.append((fn, work))
                self._ensure_worker()
                self._wake.notify()
        if inline:
            with self._exec_lock:
                work._run(fn, self._name_failure)
        return work

    def submit_op(self, op, *, sync: bool, library_frames: int = 0) -> Work:
        """Queue ``op`` as :meth:`submit` queues a function: an engine request with a ``group`` and a
        ``run(channel)`` method (:mod:`ringlet.engine.requests`). When its turn comes, the runtime takes
        the channel of ``op.group`` for it (in execution order, so the tags agree on every member) and
        runs ``op.run(channel)``; the handle gives its result. The request never calls back into the
        runtime: everything it needs from it is the channel. ``library_frames``: how many frames above
        the caller are ringlet's on every path (the flight recorder's search for the user's call site
        starts above them)."""
        rec = self.recorder.enqueue(op, library_frames)
        return self.submit(functools.partial(self._run_op, op, rec), sync=sync)

    def _run_op(self, op, rec=None) -> Any:
        if rec is None:
            return op.run(self.channel(op.group))
        rec[_SEQ], rec[_START] = self._seq[op.group.id], _monotonic()
        try:
            result = op.run(self.channel(op.group))
        except BaseException as exc:
            self._failed(rec, exc)
            raise
        rec[_END] = _monotonic()
        ran = getattr(op, "ran", None)
        if ran:  # an all-reduce names what ran (the record had what was asked: often "auto")
            rec[_ALGO] = ran
        return result

    @contextlib.contextmanager
    def recorded(self, group: Group, kind: str, tensor, name: str = "", workspace: dict | None = None):
        """The channel of the next op on ``group`` (as :meth:`channel`), for a front end that runs the
        engine itself; the op is in the flight recorder as one ``kind`` collective of ``tensor`` named
        ``name`` (:meth:`ringlet.flight.FlightRecorder.begin`), failed when the block raises (a peer's
        failure, a timeout or a mismatch also writes the record, as for queued collectives)."""
        seq = self._seq[group.id]
        e = self.recorder.begin(group, kind, tensor, name)
        ch = self.channel(group, workspace)
        if e is None:
            yield ch
            return
        e[_SEQ] = seq
        try:
            yield ch
        except BaseException as exc:
            self._failed(e, exc)
            raise
        e[_END] = _monotonic()

    def _failed(self, entry: list, exc: BaseException) -> None:
        """Flight-record entry ``entry`` failed with ``exc``; a peer's failure, a timeout or a mismatch also
        writes the record (once)."""
        flight.failed(entry, exc)
        if isinstance(exc, (PeerError, CollectiveTimeout, MismatchError)):
            self._dump_failure(exc)

    def _dump_failure(self, exc: BaseException) -> None:
        """Write the flight record once, on the first failed collective; a failed write is logged."""
        rec = self.recorder
        if rec.failure is not None:
            return
        rec.failure = f"{type(exc).__name__}: {exc}"[:300]
        try:
            rec.dump(reason=rec.failure)
        except OSError as err:
            logging.getLogger("ringlet").warning("flight recorder: could not write its record: %s", err)

    def _name_failure(self, exc: PeerError) -> BaseException:
        """``exc``, or the error that names the rank that caused it when the liveness monitor knows (a
        dead peer's death record arrives a moment after the connection reset)."""
        monitor = self.monitor
        if monitor is None or exc.rank is not None:
            return exc
        named = monitor.explain(exc)
        if named is None:
            return exc
        named.__cause__ = exc
        return named

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="ringlet-comm", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            with self._state_lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                fn, work = self._queue.popleft()
            with self._exec_lock:
                work._run(fn, self._name_failure)
            fn = work = None  # the idle thread must not keep the last job's buffers (and result) alive
            with self._state_lock:
                self._queued -= 1

    def close(self) -> None:
        with self._state_lock:
            self._closed = True
            self._wake.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5.0)
        self.transport.close()
