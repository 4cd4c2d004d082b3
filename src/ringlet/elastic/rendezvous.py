"""Worker side of ``ringlet run --elastic``: join the driver's current generation.

``ringlet.init()`` over the torch transport calls :func:`join` (through :func:`group_args`, which it
hands to :func:`ringlet.transport.torchdist.init_default_group`) when ``RINGLET_ELASTIC`` is set. A worker
only moves forward: after it has been a member of generation ``g`` (or failed to start it), its next
join waits for a generation newer than ``g`` that includes it, and asks the driver for one
(``req/<id>``). Before anyone builds the Gloo group, every member of the generation meets at a
store barrier; a member that never comes is replaced by a newer generation (the driver bumps it
when a process dies, or kills a member that does not arrive within the elastic timeout), and the
barrier notices the newer generation and moves on. So a join either returns a complete membership
or raises :class:`RendezvousError`; it never waits forever.

On success the process environment describes the new place (``RANK``, ``WORLD_SIZE``,
``RINGLET_RANK/SIZE/LOCAL_*/CROSS_*`` and the ``HOROVOD_*`` names), as the launcher's shim would.
"""
from __future__ import annotations

import atexit
import os
import threading
import time

from . import protocol as P
from . import release

POLL_SECONDS = 0.05
STORE_TIMEOUT = 60.0  # Gloo's own rendezvous waits on this store: a peer that died in between costs this much
WATCH_SECONDS = 0.25
# How long a newer generation must have existed before a member still in the old one tears it down: the
# members of a planned change (HostsUpdatedInterrupt) leave within milliseconds of each other, gracefully.
RELEASE_GRACE = 2.0


class RendezvousError(RuntimeError):
    """No generation can be joined: the job is stopping, the driver is gone, or the wait timed out."""


_store = None
_last_gen = -1
_current: P.Assignment | None = None
_lock = threading.Lock()            # guards _current, _snapshot and _released against the watchdog
_snapshot: set[int] = set()         # sockets that existed before the current generation's group
_released = -1                      # generation whose connections were torn down
_watchdog: threading.Thread | None = None
_stop_watch = threading.Event()


def enabled() -> bool:
    """True in a worker started by ``ringlet run --elastic``."""
    return os.environ.get(P.ENV_FLAG, "").strip() not in ("", "0")


def worker_id() -> str:
    """This worker's id (stable for the life of the process, unlike its rank)."""
    return os.environ[P.ENV_ID]


def store():
    """The client of the driver's store (one per process, kept across generations)."""
    global _store
    if _store is None:
        from ..store.torch_store import connect

        addr, port = os.environ[P.ENV_ADDR], int(os.environ[P.ENV_PORT])
        try:
            _store = connect(addr, port, timeout=STORE_TIMEOUT)
        except Exception as exc:
            raise RendezvousError(f"cannot reach the elastic driver at {addr}:{port}: {exc}") from exc
    return _store


def current() -> P.Assignment | None:
    """This worker's place in the generation it last joined (None before the first join)."""
    return _current


def _wait_limit() -> float:
    v = os.environ.get(P.ENV_TIMEOUT)
    return float(v) if v not in (None, "") else 600.0


def group_args():
    """Join the next generation (:func:`join`) and return what torch's default group is built from:
    ``(store, rank, world_size)``, the store being the driver's under ``ringlet/elastic/<generation>``."""
    import torch.distributed as dist

    a = join()
    return dist.PrefixStore(f"ringlet/elastic/{a.generation}", store()), a.rank, a.size


def group_join():
    """:func:`group_args` in a worker of ``ringlet run --elastic``, else None (the env:// rendezvous)."""
    return group_args if enabled() else None


def _check_abort(st) -> None:
    if st.check([P.ABORT]):
        raise RendezvousError(f"the elastic job is stopping: {st.get(P.ABORT).decode(errors='replace')}")


def _generation(st) -> int:
    return int(st.get(P.GEN))


def _barrier(st, rec: P.Record, wid: str, deadline: float) -> bool:
    """Wait until every member of ``rec`` arrived (True) or a newer generation replaced it (False)."""
    g = rec.generation
    st.set(P.arrived_marker(g, wid), "1")
    n = st.add(P.arrived_key(g), 1)
    while n < len(rec.workers):
        _check_abort(st)
        if _generation(st) != g:
            return False
        if time.monotonic() > deadline:
            raise RendezvousError(f"worker {wid}: generation {g} did not assemble in time "
                                  f"({n} of {len(rec.workers)} members arrived)")
        time.sleep(POLL_SECONDS)
        n = st.add(P.arrived_key(g), 0)
    return True


def join() -> P.Assignment:
    """Block until this worker is a member of an assembled generation newer than its last one; export
    that generation's ranks into ``os.environ`` and return them."""
    global _last_gen, _current, _snapshot
    st = store()
    wid = worker_id()
    with _lock:
        _current = None  # no longer in the old generation: the watchdog leaves us alone while we join
    deadline = time.monotonic() + _wait_limit()
    try:
        st.set(P.request_key(wid), str(_last_gen))
        while True:
            _check_abort(st)
            g = _generation(st)
            if g > _last_gen:
                rec = P.Record.decode(st.get(P.gen_key(g)))
                if wid in rec.workers and _barrier(st, rec, wid, time.monotonic() + _wait_limit()):
                    a = P.assignment(rec, wid)
                    with _lock:
                        _last_gen, _current, _snapshot = g, a, release.socket_inodes()
                    _export(a)
                    _start_watchdog()
                    return a
                if wid in rec.workers:
                    continue  # replaced while assembling: look at the newer one at once
            # A newcomer waits for the members' next commit, however long; a former member should be
            # taken back within the elastic timeout (the driver bumps the generation on its request).
            if _last_gen >= 0 and time.monotonic() > deadline:
                raise RendezvousError(f"worker {wid}: no generation newer than {_last_gen} includes it after "
                                      f"{_wait_limit():.0f}s")
            time.sleep(POLL_SECONDS)
    except RendezvousError:
        raise
    except Exception as exc:
        raise RendezvousError(f"worker {wid}: lost the elastic driver: {type(exc).__name__}: {exc}") from exc


def leave() -> int:
    """Tear down this worker's connections of its current generation now (after a failed collective, so
    that peers blocked on this rank fail at once instead of at their timeout). Returns the number of
    connections shut down."""
    global _released
    with _lock:
        if _current is None or _released == _current.generation:
            return 0
        _released = _current.generation
        return release.shutdown_sockets(_snapshot, int(os.environ[P.ENV_PORT]))


def _watch() -> None:
    """Daemon thread: when the driver has moved on (a member died, or others asked for a new generation)
    and this worker is still in the old generation after :data:`RELEASE_GRACE`, it is blocked on a peer
    that will never answer, or about to be: tear the generation's connections down (see :mod:`.release`)."""
    global _released
    from ..store.torch_store import connect

    try:  # a connection of its own: the store client is not shared between threads
        ws = connect(os.environ[P.ENV_ADDR], int(os.environ[P.ENV_PORT]), timeout=STORE_TIMEOUT)
    except Exception:  # noqa: BLE001 - no driver, nothing to watch
        return
    newer_since = None
    while not _stop_watch.wait(WATCH_SECONDS):
        with _lock:
            a = _current
        if a is None:
            newer_since = None
            continue
        try:
            g = _generation(ws)
        except Exception:  # noqa: BLE001 - the driver is gone; the job is over
            return
        if g <= a.generation:
            newer_since = None
            continue
        now = time.monotonic()
        newer_since = newer_since or now
        if now - newer_since >= RELEASE_GRACE:
            with _lock:
                if _current is a and _released != a.generation:
                    _released = a.generation
                    release.shutdown_sockets(_snapshot, int(os.environ[P.ENV_PORT]))


def _start_watchdog() -> None:
    global _watchdog
    if _watchdog is None:
        _watchdog = threading.Thread(target=_watch, name="ringlet-elastic-watchdog", daemon=True)
        _watchdog.start()
        atexit.register(_stop_watchdog)


def _stop_watchdog() -> None:
    # Before the interpreter finalises: a daemon thread caught inside a TCPStore call then would be
    # unwound through C++ noexcept frames, and the process would abort ("terminate called ...").
    _stop_watch.set()
    if _watchdog is not None:
        _watchdog.join(timeout=5.0)


def hosts_updated() -> bool:
    """True when workers wait to join after this worker's generation (asked by rank 0 at each commit)."""
    if _current is None:
        return False
    try:
        return bool(store().check([P.updates_key(_current.generation)]))
    except Exception as exc:
        raise RendezvousError(f"lost the elastic driver: {exc}") from exc


def _export(a: P.Assignment) -> None:
    from ..layout import layout_env

    env = os.environ
    env.update({"RANK": str(a.rank), "WORLD_SIZE": str(a.size), "LOCAL_RANK": str(a.local_rank),
                "LOCAL_WORLD_SIZE": str(a.local_size), "GROUP_RANK": str(a.cross_rank),
                "GROUP_WORLD_SIZE": str(a.cross_size)})
    env.update(layout_env(a))
