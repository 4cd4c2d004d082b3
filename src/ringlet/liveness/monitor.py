"""The per-rank liveness thread: heartbeats out, silence and death records in, the transport aborted."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from ..types import PeerError
from . import keys as K
from .options import LivenessOptions
from .verdict import Verdict

log = logging.getLogger(__name__)
_sessions = 0  # ringlet.init sessions of this process (the same count on every rank)


class Monitor:
    """Heartbeats of rank ``rank`` of ``size`` into the store ``connect()`` returns, and a watch on the
    next ``options.watch`` ranks; ``on_beat()`` runs with every heartbeat (the transport's check for
    strangers on its endpoints). The first verdict (a silent rank, a death record, an unreachable
    store) is handed once to ``on_verdict``. Store calls run on this thread only, over its own
    connection, so a blocked collective never delays a heartbeat."""

    def __init__(self, connect: Callable[[], object], rank: int, size: int, host: str, job: str, session: int,
                 options: LivenessOptions, on_verdict: Callable[[Verdict], None], deaths_per_session: bool = False,
                 on_beat: Callable[[], object] | None = None):
        self.rank, self.size, self.host = rank, size, host
        self.prefix = K.session_prefix(job, session)
        # Where death records are: per job (ringlet run's agents), or per generation (--elastic's driver).
        self.job = self.prefix if deaths_per_session else job
        self.options = options
        self._connect, self._on_verdict, self._on_beat = connect, on_verdict, on_beat
        self.verdict: Verdict | None = None
        self.beats = 0  # heartbeats this rank has written
        self._store = None
        self._stop = threading.Event()
        self._found = threading.Event()
        self._urgent = threading.Event()
        w = min(size - 1, options.watch)
        self.watched = [(rank + i) % size for i in range(1, w + 1)]
        self._seen: dict[int, tuple[int | None, float]] = {}
        self._hosts: dict[int, str] = {}
        self._thread: threading.Thread | None = None
        self._tasks: list[Callable[["StoreView"], object]] = []

    def add_task(self, task: Callable[["StoreView"], object]) -> None:
        """Run ``task(view)`` on this thread after every heartbeat (a :class:`StoreView`: this rank's
        keys to publish, the others' to read). Tasks share the heartbeat's round, so what they publish
        costs the training loop nothing; a task that raises is logged (debug) and kept."""
        self._tasks.append(task)

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> "Monitor":
        self._store = self._connect()
        self._store.set(K.of_rank(self.prefix, K.HOST, self.rank), self.host)
        self._store.add(K.of_rank(self.prefix, K.HEARTBEAT, self.rank), 1)
        now = time.monotonic()
        self._seen = {r: (None, now) for r in self.watched}
        self._last_ok = now
        self._thread = threading.Thread(target=self._loop, name="ringlet-liveness", daemon=True)
        self._thread.start()
        return self

    def stop(self, clean: bool = True) -> None:
        """Stop the thread; ``clean``: tell the others this rank left on purpose."""
        self._stop.set()
        self._urgent.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.options.interval + 5.0)
        if clean and self.verdict is None and self._store is not None:
            try:
                self._store.set(K.of_rank(self.prefix, K.DONE, self.rank), "1")
            except Exception:  # noqa: BLE001 - leaving; the others may already be gone
                pass

    def peer_ages(self) -> dict[int, float]:
        """Seconds since each watched rank's heartbeat last moved, as this rank last looked."""
        now = time.monotonic()
        return {r: now - since for r, (_, since) in dict(self._seen).items() if r in self.watched}

    def store_age(self) -> float:
        """Seconds since this rank's last heartbeat round that reached the store."""
        return time.monotonic() - getattr(self, "_last_ok", time.monotonic())

    # ---- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
                self._last_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a store that fails is itself the news
                self._store_trouble(exc)
            if self.verdict is not None:
                return
            if self._urgent.wait(self.options.interval):
                self._urgent.clear()
                time.sleep(0.1)

    def _round(self) -> None:
        st = self._store
        st.add(K.of_rank(self.prefix, K.HEARTBEAT, self.rank), 1)
        self.beats += 1
        if self._on_beat is not None:
            try:
                self._on_beat()
            except Exception as exc:  # noqa: BLE001 - a failed check must not look like a silent store
                log.debug("ringlet liveness: the strangers check failed: %s", exc)
        if self._tasks:
            view = StoreView(st, self.prefix, self.rank, self.size)
            for task in list(self._tasks):
                try:
                    task(view)
                except Exception as exc:  # noqa: BLE001 - a broken task must not stop the heartbeats
                    log.debug("ringlet liveness: task %r failed: %s", task, exc)
        found = self._read_verdict() or self._read_deaths()
        if found is None:
            found = self._check_watched()
        if found is not None:
            self._fire(found)

    def _read_verdict(self) -> Verdict | None:
        key = K.verdict(self.prefix)
        if not self._store.check([key]):
            return None
        return Verdict.decode(self._store.get(key))

    def _read_deaths(self) -> Verdict | None:
        """The earliest death record of the job, if any."""
        key = K.dead_list(self.job)
        if not self._store.check([key]):
            return None
        ranks = sorted({int(x) for x in self._store.get(key).decode().split(",") if x.strip()})
        recs = [Verdict.decode(self._store.get(K.of_rank(self.job, K.DEAD, r))) for r in ranks]
        return min(recs, key=lambda v: v.time) if recs else None

    def _check_watched(self) -> Verdict | None:
        if not self.watched:
            return None
        now = time.monotonic()
        hb = [K.of_rank(self.prefix, K.HEARTBEAT, r) for r in self.watched]
        if self._store.check(hb):
            values = [int(v) for v in self._store.multi_get(hb)]
        else:
            values = [int(self._store.get(k)) if self._store.check([k]) else None for k in hb]
        silent = []
        for r, v in zip(self.watched, values):
            last, since = self._seen[r]
            if v != last:
                self._seen[r] = (v, now)
            elif now - since > self.options.peer_timeout:
                silent.append((r, now - since))
        for r, age in silent:
            if self._store.check([K.of_rank(self.prefix, K.DONE, r)]):
                self.watched.remove(r)
                continue
            return self._declare(r, age)
        return None

    def _declare(self, r: int, age: float) -> Verdict:
        mine = Verdict(r, self._host_of(r), f"fell silent: no heartbeat for {age:.0f} s", time.time(), "silent")
        won = self._store.compare_set(K.verdict(self.prefix), "", mine.encode())
        return Verdict.decode(won) if won else mine

    def _host_of(self, r: int) -> str:
        if r not in self._hosts:
            key = K.of_rank(self.prefix, K.HOST, r)
            self._hosts[r] = self._store.get(key).decode() if self._store.check([key]) else "?"
        return self._hosts[r]

    def _store_trouble(self, exc: BaseException) -> None:
        quiet = time.monotonic() - self._last_ok
        if quiet <= self.options.peer_timeout:
            log.debug("ringlet liveness: store call failed (%s); retrying", exc)
            return
        addr = os.environ.get("MASTER_ADDR", "?")
        self._fire(Verdict(-1, addr, f"is unreachable: the job's store did not answer for {quiet:.0f} s "
                                     f"(this host or the store's host is cut off: {exc})", time.time(), "store"))

    def _fire(self, v: Verdict) -> None:
        if self.verdict is not None or self._stop.is_set():
            return
        self.verdict = v
        self._found.set()
        log.error("ringlet: %s", v.describe())
        self._on_verdict(v)

    # ---- for the rank's own threads -----------------------------------------------------
    def explain(self, exc: BaseException) -> PeerError | None:
        """A ``PeerError`` naming the rank that caused transport error ``exc``: the verdict now, or the
        one found within ``options.grace`` seconds; None when none comes."""
        if self.verdict is None and self._thread is not None and self._thread.is_alive():
            self._urgent.set()
            self._found.wait(self.options.grace)
        return None if self.verdict is None else self.verdict.error(self.rank, exc)


class StoreView:
    """What a monitor task may do in the job's store: publish this rank's value of a named entry and
    read every rank's (names other than the monitor's own: ``hb``, ``host``, ``done``, ``dead``)."""

    def __init__(self, store, prefix: str, rank: int, size: int) -> None:
        self._store, self._prefix, self.rank, self.size = store, prefix, rank, size

    def publish(self, name: str, value: bytes | str) -> None:
        """Set this rank's ``name`` entry to ``value``."""
        self._store.set(K.of_rank(self._prefix, name, self.rank), value)

    def read(self, name: str, ranks) -> dict[int, bytes | None]:
        """Each of ``ranks``' ``name`` entry (None where it has published none yet)."""
        keys = [K.of_rank(self._prefix, name, r) for r in ranks]
        if keys and self._store.check(keys):
            return dict(zip(ranks, self._store.multi_get(keys)))
        return {r: (self._store.get(k) if self._store.check([k]) else None) for r, k in zip(ranks, keys)}


def start(rt) -> Monitor | None:
    """Start the monitor of runtime ``rt`` when liveness is on and the job has a store it can reach (a
    launcher's agent store: ``ringlet run``, torchrun); None otherwise."""
    from .stores import connector, session_of

    global _sessions
    opts = LivenessOptions.from_env()
    connect = connector(opts) if opts.enabled and rt.size > 1 else None
    session, _sessions = session_of(_sessions), _sessions + 1
    if connect is None:
        return None
    host = rt.hostnames[rt.rank]

    def on_verdict(v: Verdict) -> None:
        rt.transport.abort(v.error(rt.rank))

    from ..elastic import rendezvous

    try:
        job = K.job_prefix({}) if rendezvous.enabled() else K.job_prefix()
        return Monitor(connect, rt.rank, rt.size, host, job, session, opts, on_verdict,
                       deaths_per_session=rendezvous.enabled(), on_beat=rt.transport.check_strangers).start()
    except Exception as exc:  # noqa: BLE001 - the job runs on; only silence detection is lost
        log.warning("ringlet: liveness monitor not started: %s", exc)
        return None
