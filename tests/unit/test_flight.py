"""The flight recorder (ringlet.flight): what each collective leaves in the ring, the off switch, the
ring's wrap, dumps (asked for, on a failure, at shutdown) and the call site in user code."""
from __future__ import annotations

import json
import os

import pytest
import torch

import ringlet
from ringlet import collectives, flight
from ringlet.types import MismatchError

from conftest import run_world

THIS_FILE = os.path.basename(__file__)


def _ops(rank):
    ringlet.allreduce(torch.ones(4))
    ringlet.broadcast(torch.ones(2, 3, dtype=torch.float64), 0)
    ringlet.allgather(torch.ones(rank + 1, 2))
    ringlet.barrier()
    return collectives.runtime().recorder.snapshot("test")


def test_records_fields_and_call_site():
    dumps = run_world(2, _ops)
    for rank, d in enumerate(dumps):
        assert (d["rank"], d["world_size"], d["reason"]) == (rank, 2, "test")
        recs = d["records"][-4:]
        assert [r["kind"] for r in recs] == ["allreduce", "broadcast", "allgather", "barrier"]
        assert [r["seq"] for r in recs] == list(range(recs[0]["seq"], recs[0]["seq"] + 4))
        ar, bc, ag, _ = recs
        assert (ar["shape"], ar["dtype"], ar["bytes"], ar["group"], ar["ranks"]) == ([4], "float32", 16, 0, [0, 1])
        assert (bc["shape"], bc["dtype"], bc["bytes"]) == ([2, 3], "float64", 48)
        assert ag["shape"] == [rank + 1, 2]
        for r in recs:
            assert r["state"] == "done" and r["error"] == ""
            assert r["t_enqueue"] <= r["t_start"] <= r["t_end"] and r["m_enqueue"] <= r["m_start"] <= r["m_end"]
            path, _, line = r["site"].rpartition(":")
            assert os.path.basename(path) == THIS_FILE and int(line) > 0


def test_ring_wraps_and_off_switch(monkeypatch):
    monkeypatch.setenv("RINGLET_FLIGHT_RECORDER", "3")

    def many(rank):
        for _ in range(7):
            ringlet.allreduce(torch.ones(2))
        snap = collectives.runtime().recorder.snapshot("x")
        assert snap["complete"] is (not snap["records"])
        return snap["records"]

    recs = run_world(2, many)[0]
    assert len(recs) == 3 and [r["seq"] for r in recs] == [recs[0]["seq"], recs[0]["seq"] + 1, recs[0]["seq"] + 2]
    monkeypatch.setenv("RINGLET_FLIGHT_RECORDER", "0")
    assert run_world(2, many)[0] == []
    monkeypatch.setenv("RINGLET_FLIGHT_RECORDER", "many")
    with pytest.raises(ValueError, match="RINGLET_FLIGHT_RECORDER"):
        flight.configured_size()


def test_dump_to_path_and_default_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGLET_FLIGHT_DIR", str(tmp_path / "fr"))

    def body(rank):
        ringlet.allreduce(torch.ones(3))
        rt = collectives.runtime()
        return rt.recorder.dump(), ringlet.dump(str(tmp_path / f"mine-{rank}.json"))

    out = run_world(2, body)
    for rank, (default, given) in enumerate(out):
        assert default == str(tmp_path / "fr" / f"rank-{rank}.json")
        for p in (default, given):
            d = json.loads(open(p).read())
            assert d["rank"] == rank and d["pid"] == os.getpid() and d["records"][-1]["kind"] == "allreduce"
            assert d["hostname"] and d["time"] > 0
    assert not [f for f in os.listdir(tmp_path / "fr") if f.endswith(".tmp")]


def test_failure_dumps_once_with_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGLET_FLIGHT_DIR", str(tmp_path))

    def body(rank):
        errors = []
        for _ in range(2):
            try:
                ringlet.allreduce(torch.ones(4 + rank))
            except MismatchError as exc:
                errors.append(exc)
        ringlet.allreduce(torch.ones(2))  # business as usual afterwards
        return len(errors), collectives.runtime().recorder.failure

    for n, failure in run_world(2, body):
        assert n == 2 and failure.startswith("MismatchError")
    for rank in range(2):
        d = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert d["reason"].startswith("MismatchError")
        failed = [r for r in d["records"] if r["state"] == "failed"]
        assert len(failed) == 1 and failed[0]["error_type"] == "MismatchError"  # written at the first failure


def test_snapshot_tail_keeps_each_groups_last_records():
    def body(rank):
        sub = ringlet.new_group([0, 1])
        for _ in range(5):
            ringlet.allreduce(torch.ones(2))
            ringlet.allreduce(torch.ones(2), group=sub)
        rec = collectives.runtime().recorder
        return rec.snapshot("x"), rec.snapshot("x", tail=2)

    full, tail = run_world(2, body)[0]
    assert full["complete"] and not tail["complete"]
    by_group = {}
    for r in tail["records"]:
        by_group.setdefault(r["group"], []).append(r["seq"])
    for gid, seqs in by_group.items():
        assert seqs == [r["seq"] for r in full["records"] if r["group"] == gid][-2:]


def test_shutdown_dumps(tmp_path, monkeypatch):
    from ringlet.transport.inproc import InprocWorld

    monkeypatch.setenv("RINGLET_FLIGHT_DIR", str(tmp_path))
    rt = ringlet.Runtime(InprocWorld(1).transport(0), ringlet.Options(timeout=5))
    with ringlet.use_runtime(rt):
        ringlet.allreduce(torch.ones(2))
    ringlet._dump_at_exit(rt)
    rt.close()
    d = json.loads((tmp_path / "rank-0.json").read_text())
    assert d["reason"] == "shutdown" and d["records"][-1]["state"] == "done"


def test_signal_handler_respects_existing_handler():
    import signal

    prev = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        own = lambda *a: None  # noqa: E731
        signal.signal(signal.SIGUSR1, own)
        signal.signal(signal.SIGTERM, own)
        assert flight.install_signal_handler(lambda: None) is False
        assert signal.getsignal(signal.SIGTERM) is own
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert flight.install_signal_handler(lambda: None) is True
        assert signal.getsignal(signal.SIGTERM) is signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    finally:
        for s, h in prev.items():
            signal.signal(s, h)


def test_sigterm_dumps_then_ends_the_process(tmp_path):
    """A launcher stops the other ranks of a failed job with SIGTERM: the record is written, and the
    process still dies of the signal."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, time\n"
            "from ringlet import flight\n"
            "rec = flight.FlightRecorder(1, 2, size=10)\n"
            "assert flight.install_signal_handler(lambda: rec)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    env = {**os.environ, "RINGLET_FLIGHT_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGTERM, res.stderr
    d = json.loads((tmp_path / "rank-1.json").read_text())
    assert (d["rank"], d["reason"]) == (1, "SIGTERM")


def test_front_ends_that_run_the_engine_themselves_are_recorded():
    """The Horovod-style coordinator's collectives (by tensor name) and ZeRO's flat-buffer ops
    (Comm.reduce_scatter_flat_ / allgather_flat_) leave records like the core API's."""
    from hvd_world import hvd_world

    from ringlet.torch.comm import Comm
    from ringlet.torch.name_matched import NAME_MATCHED
    from ringlet.types import ReduceOp

    def body(rank):
        Comm(scheduler=NAME_MATCHED).allreduce_(torch.ones(5), ReduceOp.SUM, "grad.w").wait()
        flat = torch.ones(6)
        comm = Comm()
        comm.reduce_scatter_flat_(flat, [3, 3], ReduceOp.SUM, "zero.rs").wait()
        comm.allgather_flat_(flat, [3, 3], "zero.ag").wait()
        return collectives.runtime().recorder.snapshot("x")["records"]

    for recs in hvd_world(2, body):
        by_name = {r["name"]: r for r in recs if r["name"]}
        assert (by_name["allreduce.grad.w"]["kind"], by_name["allreduce.grad.w"]["shape"]) == ("allreduce", [5])
        assert by_name["zero.rs"]["kind"] == "reduce_scatter" and by_name["zero.ag"]["kind"] == "allgather"
        for r in by_name.values():
            assert r["state"] == "done" and r["seq"] is not None and r["t_start"] <= r["t_end"]
