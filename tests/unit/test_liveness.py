"""The liveness monitor on an in-memory store: silence, clean exits, death records, an unreachable store,
and the launcher's side (death records from exit records, the culprit). No wall-clock assertions: every
wait is bounded and only the outcome is checked."""
from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from ringlet.liveness import keys as K
from ringlet.liveness.monitor import Monitor
from ringlet.liveness.options import LivenessOptions
from ringlet.liveness.verdict import Verdict, exit_reason
from ringlet.types import PeerError

FAST = LivenessOptions(peer_timeout=0.6, interval=0.05, grace=2.0)


class MemStore:
    """The subset of torch's Store API the monitor uses, in memory, thread-safe; ``fail`` makes calls raise."""

    def __init__(self):
        self.d: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.fail = False

    def _chk(self):
        if self.fail:
            raise RuntimeError("store unreachable")

    def set(self, k, v):
        self._chk()
        with self.lock:
            self.d[k] = v.encode() if isinstance(v, str) else bytes(v)

    def get(self, k):
        self._chk()
        with self.lock:
            return self.d[k]

    def add(self, k, n):
        self._chk()
        with self.lock:
            v = int(self.d.get(k, b"0")) + n
            self.d[k] = str(v).encode()
            return v

    def check(self, keys):
        self._chk()
        with self.lock:
            return all(k in self.d for k in keys)

    def multi_get(self, keys):
        return [self.get(k) for k in keys]

    def compare_set(self, k, expected, desired):
        self._chk()
        desired = desired.encode() if isinstance(desired, str) else desired
        with self.lock:
            if k not in self.d and expected in ("", b""):
                self.d[k] = desired
            return self.d[k]

    def append(self, k, v):
        self._chk()
        with self.lock:
            self.d[k] = self.d.get(k, b"") + (v.encode() if isinstance(v, str) else v)


def publish_death(store, v: Verdict, job: str = "job") -> None:
    """What a node launcher does when one of its ranks exits with an error."""
    store.set(K.of_rank(job, K.DEAD, v.rank), v.encode())
    store.append(K.dead_list(job), f"{v.rank},")


def monitors(store, size, opts=FAST, job="job"):
    found = {}
    ms = []
    for r in range(size):
        def on_verdict(v, r=r):
            found[r] = v
        ms.append(Monitor(lambda: store, r, size, f"h{r}", job, 0, opts, on_verdict))
    return ms, found


@contextlib.contextmanager
def running(ms):
    """The monitors ``ms`` started for the body, and stopped after it whatever happens."""
    for m in ms:
        m.start()
    try:
        yield ms
    finally:
        for m in ms:
            m.stop()


def wait_for(cond, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("size", [2, 3, 5])
def test_a_silent_rank_is_named_by_every_survivor(size):
    store = MemStore()
    ms, found = monitors(store, size)
    victim = size - 1
    survivors = [r for r in range(size) if r != victim]
    with running(ms):
        ms[victim].stop(clean=False)  # its heartbeats stop, it says nothing: silent
        assert wait_for(lambda: all(r in found for r in survivors))
        for r in survivors:
            v = found[r]
            assert (v.rank, v.host, v.kind) == (victim, f"h{victim}", "silent")
            err = v.error(r)
            assert isinstance(err, PeerError) and err.rank == victim and err.host == f"h{victim}"
            assert f"rank {victim} (host h{victim}) fell silent" in str(err)


def test_a_rank_that_left_cleanly_is_not_silent():
    store = MemStore()
    ms, found = monitors(store, 3)
    with running(ms):
        ms[2].stop(clean=True)
        time.sleep(4 * FAST.peer_timeout)
    assert found == {}


def test_the_earliest_death_record_names_the_cause():
    store = MemStore()
    ms, found = monitors(store, 3)
    late = Verdict(2, "h2", exit_reason(1), 200.0, "dead")
    first = Verdict(1, "h1", exit_reason(128 + 9), 100.0, "dead")
    with running(ms):
        for v in (late, first):
            publish_death(store, v)
        assert wait_for(lambda: 0 in found)
        assert found[0].rank == 1 and "was killed by SIGKILL" in found[0].reason


def test_explain_waits_for_the_record_that_names_a_reset():
    store = MemStore()
    ms, _ = monitors(store, 2, LivenessOptions(peer_timeout=30, interval=0.05, grace=5.0))

    def publish():
        time.sleep(0.3)
        publish_death(store, Verdict(1, "h1", exit_reason(137), time.time(), "dead"))

    with running(ms):
        threading.Thread(target=publish).start()
        err = ms[0].explain(PeerError("connection reset by peer"))
        assert err is not None and err.rank == 1 and "connection reset by peer" in str(err)


def test_explain_gives_up_after_the_grace():
    store = MemStore()
    ms, _ = monitors(store, 2, LivenessOptions(peer_timeout=30, interval=0.05, grace=0.2))
    ms[0].start()
    try:
        assert ms[0].explain(PeerError("x")) is None
    finally:
        ms[0].stop()


def test_an_unreachable_store_is_a_verdict_after_the_timeout():
    store = MemStore()
    ms, found = monitors(store, 2)
    ms[0].start()
    store.fail = True
    try:
        assert wait_for(lambda: 0 in found)
        v = found[0]
        assert v.kind == "store" and "did not answer" in v.reason
        assert v.error(0).rank is None
    finally:
        ms[0].stop()


def test_verdict_round_trip_and_exit_reasons():
    v = Verdict(3, "h3", "fell silent: no heartbeat for 20 s", 12.5)
    assert Verdict.decode(v.encode()) == v
    assert exit_reason(137) == "was killed by SIGKILL"
    assert exit_reason(1) == "exited with status 1"


@pytest.mark.parametrize("kwargs", [dict(peer_timeout=-1), dict(interval=0), dict(watch=0),
                                    dict(peer_timeout=1.0, interval=1.0)])
def test_bad_options_are_clear(kwargs):
    with pytest.raises(ValueError):
        LivenessOptions(**kwargs)


def test_options_from_env():
    o = LivenessOptions.from_env({"RINGLET_PEER_TIMEOUT": "0"})
    assert not o.enabled
    assert LivenessOptions.from_env({"RINGLET_PEER_TIMEOUT": "7", "RINGLET_HEARTBEAT_INTERVAL": "0.5"}).peer_timeout == 7


def test_deathwatch_publishes_exit_records_and_reports_the_silent_rank(tmp_path):
    import datetime

    from torch.distributed import TCPStore

    from ringlet.launch.deaths import DeathWatch

    server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    dw = DeathWatch(str(tmp_path), "run1", lambda: ("127.0.0.1", server.port)).start()
    try:
        (tmp_path / "exit-2.json").write_text(json.dumps({"rank": 2, "status": 137, "time": 5.0, "host": "h2"}))
        job = f"{K.ROOT}/run1/0"
        assert wait_for(lambda: server.check([K.of_rank(job, K.DEAD, 2)]))
        assert Verdict.decode(server.get(K.of_rank(job, K.DEAD, 2))).reason == "was killed by SIGKILL"
        silent = Verdict(1, "h1", "fell silent: no heartbeat for 20 s", 4.0)
        server.set(K.verdict(K.session_prefix(job, 0)), silent.encode())
        assert wait_for(lambda: dw.culprit() == silent)  # earlier than the death record
    finally:
        dw.stop()
