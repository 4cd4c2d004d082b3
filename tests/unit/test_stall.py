"""The stall inspector (ringlet.stall): its settings, the state each rank publishes, the report's words
and back-off, giving up, and a real in-process wait seen with and without a store."""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest
import torch

import ringlet
from ringlet import collectives, flight, stall
from ringlet.group import Group
from ringlet.liveness.monitor import StoreView

from conftest import run_world

THIS_FILE = os.path.basename(__file__)
WORLD = Group(0, (0, 1, 2), (0, 0, 0), 0)
PAIR = Group(1, (1, 2), (0, 0), 1)


# ---- settings ----------------------------------------------------------------------------------------
def test_settings_defaults_and_values():
    assert stall.StallOptions.from_env({}) == stall.StallOptions(60.0, 0.0)
    o = stall.StallOptions.from_env({"RINGLET_STALL_WARN_S": "8", "RINGLET_STALL_SHUTDOWN_S": "30.5"})
    assert (o.warn, o.shutdown, o.active) == (8.0, 30.5, True)
    assert not stall.StallOptions.from_env({"RINGLET_STALL_WARN_S": "0"}).active


@pytest.mark.parametrize("var", ["RINGLET_STALL_WARN_S", "RINGLET_STALL_SHUTDOWN_S"])
@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "inf"])
def test_a_bad_setting_is_a_clear_error(var, raw):
    with pytest.raises(ValueError, match=f"{var}='{raw}': expected seconds >= 0"):
        stall.StallOptions.from_env({var: raw})


def test_horovod_variables_fill_the_ones_not_given():
    hv = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9"}
    assert stall.StallOptions.from_env(hv) == stall.StallOptions(60.0, 0.0)  # not under ringlet.torch
    o = stall.StallOptions.from_env(hv, horovod=True)
    assert (o.warn, o.shutdown, o.warn_var) == (5.0, 9.0, "HOROVOD_STALL_CHECK_TIME_SECONDS")
    o = stall.StallOptions.from_env({**hv, "RINGLET_STALL_WARN_S": "7"}, horovod=True)
    assert (o.warn, o.shutdown, o.warn_var) == (7.0, 9.0, "RINGLET_STALL_WARN_S")
    o = stall.StallOptions.from_env({**hv, "HOROVOD_STALL_CHECK_DISABLE": "1"}, horovod=True)
    assert not o.active
    o = stall.StallOptions.from_env({"HOROVOD_STALL_CHECK_DISABLE": "1", "RINGLET_STALL_WARN_S": "3"}, horovod=True)
    assert (o.warn, o.shutdown) == (3.0, 0.0)
    with pytest.raises(ValueError, match="HOROVOD_STALL_CHECK_TIME_SECONDS='x'"):
        stall.StallOptions.from_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "x"}, horovod=True)


# ---- fakes -------------------------------------------------------------------------------------------
class FakeStore:
    """The calls a StoreView makes, over a dict shared by the ranks of a test."""

    def __init__(self):
        self.d: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, k, v):
        with self.lock:
            self.d[k] = v.encode() if isinstance(v, str) else v

    def check(self, keys):
        return all(k in self.d for k in keys)

    def get(self, k):
        return self.d[k]

    def multi_get(self, keys):
        return [self.d[k] for k in keys]


class AllreduceRequest:  # the flight recorder takes the kind from the request's class name
    def __init__(self, group, shape=(4,)):
        self.group, self.buf = group, torch.ones(shape)


def _record(recorder, group, seq, kind="allreduce", state="running", shape=(4,), started=None):
    """A ring entry of ``recorder``: started with ``seq`` (at ``started``), finished unless running."""
    e = recorder.enqueue(AllreduceRequest(group, shape))
    e[flight.KIND], e[flight.SEQ] = kind, seq
    e[flight.CODE], e[flight.LINE] = compile("pass", "/x/train.py", "exec"), 12  # as if called from train.py:12
    e[flight.START] = time.monotonic() if started is None else started
    if state != "running":
        e[flight.END] = time.monotonic()
    return e


class FakeTransport:
    def __init__(self):
        self.aborted = []

    def abort(self, err):
        self.aborted.append(err)


class FakeRuntime:
    def __init__(self, rank=0, size=3):
        self.rank, self.size = rank, size
        self.groups = [WORLD, PAIR]
        self.recorder = flight.FlightRecorder(rank, size, size=100)
        self.seqs = {0: 3, 1: 0}
        self.transport = FakeTransport()
        self.hostnames = ("h0", "h1", "h2")
        self.monitor = None

    def last_started(self):
        return dict(self.seqs)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _peer_entry(store, rank, entry):
    StoreView(store, "p", rank, 3).publish(stall.ENTRY, json.dumps(entry))


def _setup(warn=8.0, shutdown=0.0):
    rt, clock, store = FakeRuntime(), Clock(), FakeStore()
    _record(rt.recorder, WORLD, 2, state="done")
    _record(rt.recorder, WORLD, 3, started=clock.t)
    insp = stall.Inspector(rt, stall.StallOptions(warn, shutdown), clock=clock)
    now = time.time()
    _peer_entry(store, 1, {"seq": {"0": 3}, "in": [0, 3, "allreduce", [4], "float32", "train.py:12", now],
                           "out": None, "last": None})
    _peer_entry(store, 2, {"seq": {"0": 2, "1": 4}, "in": None, "out": now - 5.0,
                           "last": [0, 2, "allreduce", [4], "float32", "train.py:12", now - 5.0]})
    return rt, clock, insp, StoreView(store, "p", 0, 3)


# ---- the report ----------------------------------------------------------------------------------------
def test_report_names_the_ranks_that_have_not_arrived_and_backs_off(caplog):
    rt, clock, insp, view = _setup()
    caplog.set_level(logging.WARNING, logger="ringlet")
    insp.tick(view)
    clock.t += 7.9
    insp.tick(view)
    assert insp.reports == []
    clock.t += 0.2
    insp.tick(view)
    assert len(insp.reports) == 1
    text = insp.reports[0]
    assert text.startswith("ringlet stall: rank 0 has waited 8.1 s in an all-reduce on the world group seq 3 "
                           "(shape [4], float32, train.py:12), started ")
    assert "; rank 2 has not arrived: it is outside any collective since " in text
    assert "its last was an all-reduce on the world group seq 2 (shape [4], float32, train.py:12)" in text
    assert "rank 1" not in text  # it arrived (its seq on the world group is 3)
    assert text.endswith("Next report at 16 s (RINGLET_STALL_WARN_S=8)")
    assert [r.levelname for r in caplog.records if r.name == "ringlet"] == ["WARNING"]
    for step, expect in ((7.0, 1), (1.0, 2), (8.0, 2), (8.0, 3)):  # at 16 s, then 32 s
        clock.t += step
        insp.tick(view)
        assert len(insp.reports) == expect, (clock.t, insp.reports)
    assert insp.reports[-1].endswith("Next report at 64 s (RINGLET_STALL_WARN_S=8)")
    # the next collective starts the back-off over
    rt.recorder._ring[-1][flight.END] = clock.t
    _record(rt.recorder, WORLD, 4, started=clock.t)
    clock.t += 8.5
    insp.tick(view)
    assert len(insp.reports) == 4 and "seq 4" in insp.reports[-1]


def test_report_says_what_each_missing_rank_does():
    groups = {0: (0, 1, 2), 1: (1, 2)}
    now = 10_000.0
    op = [0, 7, "allreduce", [4], "float32", "train.py:12", now - 9]
    peers = {1: {"seq": {"0": 6, "1": 4}, "in": [1, 4, "broadcast", [2, 3], "float64", "eval.py:30", now - 9],
                 "out": None, "last": None},
             2: None}
    text, missing = stall.report(0, op, 9.0, peers, groups, now)
    assert missing == [1, 2]
    assert ("ranks 1 and 2 have not arrived: rank 1 is in a broadcast on group 1 (ranks [1, 2]) seq 4 "
            "(shape [2, 3], float64, eval.py:30) since ") in text
    assert "rank 2 has published no state yet" in text
    peers = {1: {"seq": {"0": 7}}, 2: {"seq": {"0": 8}}}
    text, missing = stall.report(0, op, 9.0, peers, groups, now)
    assert missing == [] and "every other member has started it" in text
    text, missing = stall.report(0, op, 9.0, None, groups, now)
    assert "which ranks have not arrived is unknown: this job has no store" in text
    many = {r: None for r in range(1, 12)}
    text, missing = stall.report(0, op, 9.0, many, {0: tuple(range(12))}, now)
    assert len(missing) == 11 and text.endswith("and ranks 9, 10 and 11")


def test_giving_up_aborts_the_transport_once_naming_the_missing_rank(caplog):
    rt, clock, insp, view = _setup(warn=8.0, shutdown=20.0)
    caplog.set_level(logging.WARNING, logger="ringlet")
    for _ in range(3):
        clock.t += 10.0
        insp.tick(view)
    assert len(rt.transport.aborted) == 1
    err = rt.transport.aborted[0]
    assert isinstance(err, stall.StallError) and isinstance(err, ringlet.PeerError)
    assert (err.rank, err.host, err.missing) == (2, "h2", (2,))
    assert "rank 2 has not arrived" in str(err)
    assert str(err).endswith("Giving up after 20 s (RINGLET_STALL_SHUTDOWN_S): its pending collectives fail")
    levels = [r.levelname for r in caplog.records if r.name == "ringlet"]
    assert levels == ["WARNING", "ERROR"]  # 10 s: warned; 20 s: gave up (the report due at 16 s with it)
    clock.t += 10.0
    insp.tick(view)
    assert len(insp.reports) == 3 and len(rt.transport.aborted) == 1  # 40 s: the report due at 32 s
    assert insp.reports[-1].endswith("Next report at 64 s (RINGLET_STALL_WARN_S=8)")
    insp.options = stall.StallOptions(0.0)
    insp.tick(view)
    insp.options = stall.StallOptions(1.0)  # new limits while the same collective waits
    insp.tick(view)
    assert len(insp.reports) == 4 and insp.reports[-1].endswith("Next report at 64 s (RINGLET_STALL_WARN_S=1)")


def test_off_means_no_report_and_no_abort():
    rt, clock, insp, view = _setup(warn=0.0, shutdown=0.0)
    clock.t += 1e6
    insp.tick(view)
    assert insp.reports == [] and rt.transport.aborted == []
    assert json.loads(view._store.get("p/now/0"))["in"][1] == 3  # the state is published all the same


def test_start_uses_the_monitor_or_a_thread_of_its_own():
    class Monitor:
        def __init__(self):
            self.tasks = []

        def add_task(self, t):
            self.tasks.append(t)

    rt = FakeRuntime()
    rt.monitor = Monitor()
    insp = stall.start(rt, stall.StallOptions(1.0))
    assert rt.monitor.tasks == [insp.tick] and insp._thread is None
    rt.monitor = None
    insp = stall.start(rt, stall.StallOptions(1.0))
    assert insp._thread.is_alive() and insp._thread.name == "ringlet-stall"
    insp.stop()
    assert insp._thread is None
    assert stall.start(rt, stall.StallOptions(0.0))._thread is None
    assert stall.start(FakeRuntime(size=1), stall.StallOptions(1.0)) is None


def test_horovod_init_hands_its_settings_to_the_inspector(monkeypatch):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "4")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "12")
    monkeypatch.delenv("RINGLET_STALL_WARN_S", raising=False)
    monkeypatch.delenv("RINGLET_STALL_SHUTDOWN_S", raising=False)
    rt = FakeRuntime()
    stall.use_horovod_env(rt)  # no inspector: nothing to do
    rt.stall = stall.Inspector(rt, stall.StallOptions(0.0))
    stall.use_horovod_env(rt)
    assert (rt.stall.options.warn, rt.stall.options.shutdown) == (4.0, 12.0)
    assert rt.stall._thread.is_alive()  # no monitor: the inspector's own thread, now that it is on
    rt.stall.stop()


# ---- real in-process waits ------------------------------------------------------------------------------
def _late_rank_two(store):
    """Rank 2 makes its all-reduce 0.8 s late; rank 0's inspector ticks meanwhile. Returns its reports."""

    def body(rank):
        rt = collectives.runtime()
        insp = stall.Inspector(rt, stall.StallOptions(0.2))
        view = None if store is None else StoreView(store, "p", rank, 3)
        ringlet.allreduce(torch.ones(4))
        ringlet.barrier()
        stop = threading.Event()

        def ticker():
            while not stop.wait(0.05):
                insp.tick(view)

        t = threading.Thread(target=ticker, daemon=True)
        t.start()
        if rank == 2:
            time.sleep(0.8)
        ringlet.allreduce(torch.ones(4))  # the one rank 2 is late for
        stop.set()
        t.join()
        return insp.reports, insp.state()

    return run_world(3, body)


def test_a_late_rank_is_named_by_the_waiting_ones():
    results = _late_rank_two(FakeStore())
    reports, state = results[0]
    assert reports, "rank 0 did not report its wait"
    assert "in an all-reduce on the world group seq" in reports[0]
    assert "rank 2 has not arrived: it is outside any collective since " in reports[0]
    assert f"{THIS_FILE}:" in reports[0]
    assert results[2][0] == []  # rank 2 never waited
    assert state["in"] is None and state["last"][2] == "allreduce" and state["out"] == state["last"][6]


def test_without_a_store_the_rank_reports_its_own_wait():
    reports = _late_rank_two(None)[0][0]
    assert reports and "which ranks have not arrived is unknown" in reports[0]


def test_front_ends_reach_the_recorder_the_inspector_reads():
    """DDP's and the hooks' single collectives (Comm on the core queue) and ZeRO's flat-buffer ops are
    queued through Runtime.submit_op, so the flight recorder (and the inspector) see them."""
    from ringlet.torch.comm import Comm
    from ringlet.types import ReduceOp

    def body(rank):
        rt = collectives.runtime()
        comm = Comm(None)
        seen = []
        for run in (lambda: comm.allreduce_(torch.ones(6), ReduceOp.SUM, "b0").wait(),
                    lambda: comm.reduce_scatter_flat_(torch.ones(6), [3, 3], ReduceOp.AVG, "z").wait(),
                    lambda: comm.allgather_flat_(torch.ones(6), [3, 3], "z").wait()):
            run()
            last = stall.now_state(rt.recorder, rt.last_started(), 0.0)["last"]
            seen.append((last[2], last[3], last[5].split(":")[0], last[1] == rt.last_started()[0]))
        return seen

    for seen in run_world(2, body):
        assert seen == [("allreduce", [6], THIS_FILE, True), ("reduce_scatter", [6], THIS_FILE, True),
                        ("allgather", [6], THIS_FILE, True)]


def test_init_refuses_a_bad_setting_before_starting(monkeypatch):
    monkeypatch.setenv("RINGLET_STALL_WARN_S", "a minute")
    assert not ringlet.is_initialized()
    with pytest.raises(ValueError, match="RINGLET_STALL_WARN_S='a minute'"):
        ringlet.init()
    assert not ringlet.is_initialized()
