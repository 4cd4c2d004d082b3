"""Metrics (ringlet.metrics): the fold of flight records (order, cursor, what the ring dropped), step times
and exposed communication, the collector's names and labels over real runtimes, the endpoints (per rank
and the host's merge) over HTTP on loopback, and the options' errors."""
from __future__ import annotations

import collections
import os
import socket
import types
import urllib.request

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import ringlet
from ringlet import collectives, steps
from ringlet.launch import LaunchError
from ringlet.launch.agent import run_multi_host
from ringlet.launch.api import _metrics_options
from ringlet.launch.config import RunConfig
from ringlet.metrics import clear_straggler_scores, serve, set_straggler_score
from ringlet.metrics.collector import RankCollector
from ringlet.metrics.fold import BUCKETS, Cursor, Totals
from ringlet.metrics.host import HostEndpoint, merge, read_ports
from ringlet.metrics.serve import RankEndpoint
from ringlet.metrics.stepfold import StepTotals

from conftest import run_world


# ---- the fold ------------------------------------------------------------------------------------------
class FakeRecorder:
    def __init__(self, size):
        self.records = collections.deque(maxlen=size)
        self.appended = 0

    def add(self, kind="allreduce", state="done", seconds=1e-3, shape=(4,), algorithm="ring", error_type=""):
        r = types.SimpleNamespace(kind=kind, state=state, m_enqueue=0.0, m_start=10.0, m_end=10.0 + seconds,
                                  shape=torch.Size(shape), dtype=torch.float32, algorithm=algorithm,
                                  error_type=error_type)
        self.records.append(r)
        self.appended += 1
        return r


def test_cursor_takes_each_finished_record_once_in_order():
    rec = FakeRecorder(10)
    cur = Cursor(rec)
    a, b = rec.add(), rec.add()
    t = cur.take()
    assert t.records == [a, b] and t.dropped == 0 and t.pending == 0
    assert cur.take().records == []  # nothing new: nothing twice
    c = rec.add(state="running")
    d = rec.add()
    t = cur.take()
    assert t.records == [] and t.pending == 1  # c stops the take; d waits behind it
    c.state = "done"
    assert cur.take().records == [c, d]


def test_cursor_counts_what_the_ring_dropped():
    rec = FakeRecorder(4)
    cur = Cursor(rec)
    for _ in range(6):
        rec.add()
    t = cur.take()  # 6 appended, the ring holds 4: 2 lost before the first scrape
    assert (len(t.records), t.dropped) == (4, 2)
    for _ in range(3):
        rec.add()
    t = cur.take()  # within the ring: exact
    assert (len(t.records), t.dropped) == (3, 0)
    for _ in range(11):
        rec.add()
    t = cur.take()  # 11 new, the ring holds the last 4
    assert (len(t.records), t.dropped) == (4, 7)
    rec.add(state="queued")
    for _ in range(5):
        rec.add()
    t = cur.take()  # the queued one left the ring unfinished: counted lost, the 4 after it taken
    assert (len(t.records), t.dropped) == (4, 2)


def test_totals_counts_bytes_histogram_and_errors():
    rec = FakeRecorder(100)
    rec.add(seconds=2e-5, shape=(256,))
    rec.add(seconds=3e-3, shape=(2, 8), algorithm="recursive_doubling")
    rec.add(kind="broadcast", algorithm="", seconds=1.0)
    rec.add(state="failed", error_type="PeerError")
    tot = Totals()
    tot.add(Cursor(rec).take())
    assert tot.ops[("allreduce", "ring")].count == 1 and tot.ops[("allreduce", "ring")].bytes == 1024
    assert tot.ops[("allreduce", "recursive_doubling")].bytes == 64
    assert ("broadcast", "default") in tot.ops
    assert tot.errors == {("allreduce", "PeerError"): 1}
    counts, total, n = tot.hist["allreduce"]
    assert n == 2 and total == pytest.approx(2e-5 + 3e-3)
    assert counts[BUCKETS.index(2.5e-5)] == 1 and counts[BUCKETS.index(5e-3)] == 1


def test_step_fold_times_share_and_lost_marks():
    clock = steps.StepClock(keep=3)
    st = StepTotals()
    clock.mark(100.0)
    clock.mark(100.5)
    clock.waited(0.25)
    clock.mark(101.0)
    clock.switched("algorithm")
    st.fold(clock)
    assert (st.steps, st.timed, st.seconds, st.share) == (3, 2, pytest.approx(1.0), pytest.approx(0.25))
    assert st.switches == {"algorithm": 1}
    st.fold(clock)  # nothing new: the share stays
    assert (st.steps, st.timed, st.share) == (3, 2, pytest.approx(0.25))
    for t in (102.0, 103.0, 104.0, 105.0, 106.0):
        clock.mark(t)
    st.fold(clock)  # 5 new, 3 kept: 2 lost, and the gap across them is no step
    assert (st.steps, st.lost, st.timed, st.seconds) == (8, 2, 4, pytest.approx(3.0))


# ---- the collector over real runtimes ----------------------------------------------------------------------
def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(fams: dict, name: str, **labels) -> list:
    return [s for f in fams.values() for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def test_collector_names_labels_and_cursor_over_a_world():
    clock = steps.StepClock()

    def body(rank):
        rt = collectives.runtime()
        reg = CollectorRegistry(auto_describe=False)
        reg.register(RankCollector(lambda: rt, clock))
        ringlet.allreduce(torch.ones(4))
        ringlet.allreduce(torch.ones(1 << 16))  # 256 KiB: a schedule, named
        ringlet.broadcast(torch.ones(3), 0)
        first = _families(generate_latest(reg).decode())
        ringlet.allreduce(torch.ones(4))
        second = _families(generate_latest(reg).decode())
        return rt.hostnames[rank], first, second

    set_straggler_score(1, "h1", 2.5)
    try:
        out = run_world(2, body)
    finally:
        clear_straggler_scores()
    for rank, (host, first, second) in enumerate(out):
        r = str(rank)
        info = _samples(first, "ringlet_rank_info")[0].labels
        assert info == {"rank": r, "host": host, "world_size": "2", "local_rank": r, "transport": "inproc"}
        ops = {(s.labels["op"], s.labels["algorithm"]): s.value for s in _samples(first, "ringlet_collectives_total")}
        assert ops[("broadcast", "default")] == 1
        named = [a for (op, a) in ops if op == "allreduce"]
        assert "auto" not in named and len(named) >= 1, ops  # the algorithm that ran
        assert sum(v for (op, _), v in ops.items() if op == "allreduce") == 2
        nbytes = sum(s.value for s in _samples(first, "ringlet_collective_bytes_total", op="allreduce"))
        assert nbytes == 16 + (1 << 18)
        assert _samples(first, "ringlet_collective_latency_seconds_count", op="allreduce")[0].value == 2
        assert _samples(first, "ringlet_flight_records_dropped_total", rank=r)[0].value == 0
        later = sum(s.value for s in _samples(second, "ringlet_collectives_total", op="allreduce"))
        assert later == 3  # the cursor: the new one added, none counted twice
        assert _samples(first, "ringlet_straggler_score")[0].labels == {"rank": "1", "host": "h1"}
        for name in ("ringlet_steps_total", "ringlet_exposed_comm_seconds_total", "ringlet_exposed_comm_share",
                     "ringlet_liveness_up", "ringlet_collectives_pending"):
            assert _samples(first, name, rank=r), name


def test_straggler_score_rejects_bad_values():
    with pytest.raises(ValueError, match="straggler score"):
        set_straggler_score(-1, "h", 1.0)
    with pytest.raises(ValueError, match="straggler score"):
        set_straggler_score(0, "h", float("nan"))


# ---- endpoints -----------------------------------------------------------------------------------------------
def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def test_rank_endpoints_merged_by_the_host_endpoint(tmp_path):
    folder = str(tmp_path / "metrics")
    ranks = [types.SimpleNamespace(rank=r, size=2, hostnames=("a", "a"), local_rank=lambda r=r: r, monitor=None,
                                   transport=types.SimpleNamespace(name="fake"), recorder=FakeRecorder(8))
             for r in range(2)]
    for r, rt in enumerate(ranks):
        for _ in range(r + 1):
            rt.recorder.add()
    ends = [RankEndpoint(lambda rt=rt: rt, 0, "127.0.0.1", clock=steps.StepClock()) for rt in ranks]
    host = None
    set_straggler_score(0, "a", 1.25)
    try:
        for rt, e in zip(ranks, ends):
            e.advertise(folder, rt.rank)
        assert read_ports(folder) == {0: ends[0].port, 1: ends[1].port}
        assert 'rank="1"' in _get(ends[1].port)
        host = HostEndpoint(folder, 0, "127.0.0.1")
        fams = _families(_get(host.port))
        counts = {s.labels["rank"]: s.value for s in _samples(fams, "ringlet_collectives_total")}
        assert counts == {"0": 1.0, "1": 2.0}
        assert len(_samples(fams, "ringlet_straggler_score")) == 1  # both ranks serve it: once
        assert {s.labels["state"]: s.value for s in _samples(fams, "ringlet_host_ranks")} == \
            {"scraped": 2.0, "unreachable": 0.0}
        ends[1].close()  # a rank that left: its file goes with it
        assert list(read_ports(folder)) == [0]
    finally:
        clear_straggler_scores()
        for e in ends:
            e.close()
        if host is not None:
            host.close()


def test_merge_keeps_first_help_and_every_rank():
    a = "# HELP x_total X.\n# TYPE x_total counter\nx_total{rank=\"0\"} 1.0\n"
    b = "# HELP x_total other.\n# TYPE x_total counter\nx_total{rank=\"1\"} 2.0\nx_total{rank=\"0\"} 9.0\n"
    (fam,) = merge([a, b])
    assert fam.documentation == "X." and [(s.labels["rank"], s.value) for s in fam.samples] == [("0", 1.0), ("1", 2.0)]


def test_environment_and_launcher_errors(monkeypatch):
    rt = types.SimpleNamespace(recorder=types.SimpleNamespace(enabled=True))
    with pytest.raises(ValueError, match="expected a TCP port"):
        serve.start(rt, lambda: None, {"RINGLET_METRICS_PORT": "http"})
    with pytest.raises(ValueError, match="both set"):
        serve.start(rt, lambda: None, {"RINGLET_METRICS_PORT": "9100", "RINGLET_METRICS_DIR": "/tmp/x"})
    off = types.SimpleNamespace(recorder=types.SimpleNamespace(enabled=False))
    with pytest.raises(ValueError, match="RINGLET_FLIGHT_RECORDER=0"):
        serve.start(off, lambda: None, {"RINGLET_METRICS_PORT": "9100"})
    assert serve.start(rt, lambda: None, {}) is None
    with pytest.raises(LaunchError, match="needs --metrics-port"):
        _metrics_options({}, None, True, "shm", False)
    with pytest.raises(LaunchError, match="1-65535"):
        _metrics_options({}, 70000, False, "shm", False)
    with pytest.raises(LaunchError, match="--metrics-per-rank"):
        _metrics_options({}, 9100, False, "mpi", False)
    env: dict = {}
    assert _metrics_options(env, 9100, True, "mpi", False) is None and env["RINGLET_METRICS_PORT"] == "9100"
    monkeypatch.setenv("RINGLET_METRICS_PORT", "9000")
    with pytest.raises(LaunchError, match="unset it"):
        _metrics_options({}, 9100, False, "shm", False)
    monkeypatch.delenv("RINGLET_METRICS_PORT")
    assert _metrics_options({}, 9100, False, "torch", False) == 9100
    hosts = (("localhost", 1), ("127.0.0.1", 1))
    with pytest.raises(LaunchError, match="several host entries are this machine"):
        run_multi_host(RunConfig(("true",), hosts=hosts, metrics_port=9100), hosts)
    assert os.environ.get("RINGLET_METRICS_DIR") is None


def test_port_per_rank_is_the_port_plus_the_local_rank(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    rec = FakeRecorder(4)
    rec.enabled = True
    rec.add()
    rt = types.SimpleNamespace(rank=3, size=4, hostnames=("a", "a", "b", "b"), local_rank=lambda: 1, monitor=None,
                               transport=types.SimpleNamespace(name="fake"), recorder=rec)
    monkeypatch.setattr(serve, "_ENDPOINT", None)
    try:
        ep = serve.start(rt, lambda: rt, {"RINGLET_METRICS_PORT": str(base - 1), "RINGLET_METRICS_ADDR": "127.0.0.1"})
    except OSError:  # taken by someone else since it was found free
        pytest.skip(f"port {base} is in use")
    try:
        assert ep.port == base and serve.endpoint() is ep
        assert serve.start(rt, lambda: rt, {"RINGLET_METRICS_PORT": str(base - 1)}) is ep  # once per process
        fams = _families(_get(ep.port))
        assert _samples(fams, "ringlet_collectives_total", rank="3", op="allreduce")[0].value == 1
        assert _samples(fams, "ringlet_rank_info")[0].labels["local_rank"] == "1"
    finally:
        ep.close()
