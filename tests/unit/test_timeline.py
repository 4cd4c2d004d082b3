"""The timeline writer: valid Chrome-trace JSON, streamed, thread-safe, env / dynamic configuration."""
from __future__ import annotations

import json
import threading

import pytest

from ringlet import timeline


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("RINGLET_TIMELINE", "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES", "RINGLET_RANK",
                 "HOROVOD_RANK", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(timeline, "_env_rank", None)
    monkeypatch.setattr(timeline, "_env_started", set())
    timeline.stop_timeline()
    yield
    timeline.stop_timeline()


def _spans(events):
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    return [(names[(e["pid"], e["tid"])], e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X"]


def test_complete_file_is_valid_json_with_named_tracks(tmp_path):
    p = tmp_path / "t.json"
    timeline.start_timeline(str(p))
    tl = timeline.active()
    assert tl is not None
    tl.span("layer.weight", "NEGOTIATE", 10.0, 12.5, {"shape": [3, 4]})
    tl.span("layer.weight", "COMMUNICATE", 12.5, 20.0)
    tl.span("layer.bias", "COMMUNICATE", 13.0, 14.0)
    timeline.mark_step({"step": 1})
    timeline.stop_timeline()
    assert timeline.active() is None
    events = json.loads(p.read_text())
    assert _spans(events) == [("layer.weight", "NEGOTIATE", 10.0, 2.5), ("layer.weight", "COMMUNICATE", 12.5, 7.5),
                              ("layer.bias", "COMMUNICATE", 13.0, 1.0)]
    steps = [e for e in events if e.get("name") == timeline.STEP_EVENT]
    assert len(steps) == 1 and steps[0]["ph"] == "i" and steps[0]["args"] == {"step": 1}
    shape = [e for e in events if e.get("ph") == "X"][0]["args"]["shape"]
    assert shape == [3, 4]


def test_file_is_readable_while_open_and_after_a_crash(tmp_path):
    p = tmp_path / "t.json"
    tl = timeline.Timeline(str(p))
    for i in range(2000):  # more than one flush worth of events
        tl.span(f"t{i % 7}", "COMMUNICATE", float(i), i + 0.5)
    tl.flush()
    text = p.read_text()
    assert text.startswith("[") and not text.rstrip().endswith("]")
    # What Chrome does with an unterminated array: the text plus "]" is JSON.
    assert len([e for e in json.loads(text + "]") if e.get("ph") == "X"]) == 2000
    assert len([e for e in timeline.read_events(str(p)) if e.get("ph") == "X"]) == 2000
    # A torn last line (the writer died mid-write) is skipped.
    torn = tmp_path / "torn.json"
    torn.write_text(text + ',\n{"name":"COMMU')
    assert len([e for e in timeline.read_events(str(torn)) if e.get("ph") == "X"]) == 2000
    tl.close()
    tl.close()  # idempotent
    tl.span("late", "COMMUNICATE", 0.0, 1.0)  # ignored after close
    assert len([e for e in json.loads(p.read_text()) if e.get("ph") == "X"]) == 2000


def test_memory_stays_bounded(tmp_path):
    tl = timeline.Timeline(str(tmp_path / "t.json"))
    for i in range(20000):
        tl.span("x", "COMMUNICATE", float(i), i + 1.0)
        assert tl._buf_bytes < timeline._FLUSH_BYTES
    tl.close()


def test_threads_record_concurrently(tmp_path):
    p = tmp_path / "t.json"
    tl = timeline.Timeline(str(p))

    def worker(k):
        for i in range(500):
            tl.span(f"thread{k}", "COMMUNICATE", float(i), i + 1.0)
            tl.instant("steps", "step")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tl.close()
    events = json.loads(p.read_text())
    spans = _spans(events)
    assert len(spans) == 2000
    for k in range(4):
        assert sum(1 for s in spans if s[0] == f"thread{k}") == 500
    # One thread_name record per track, distinct tids.
    meta = [e for e in events if e.get("name") == "thread_name"]
    assert len(meta) == 5 and len({e["tid"] for e in meta}) == 5


def test_module_functions_are_no_ops_without_a_timeline():
    assert timeline.active() is None
    timeline.mark_step()
    timeline.span("x", "BACKWARD", 0.0, 1.0)
    timeline.instant("x", "y")
    with timeline.record("x", "FORWARD"):
        pass


def test_record_and_module_span(tmp_path):
    p = tmp_path / "t.json"
    timeline.start_timeline(str(p))
    with timeline.record("model", "FORWARD"):
        pass
    timeline.span("backward", "BACKWARD", 5.0, 9.0)
    timeline.stop_timeline()
    spans = _spans(json.loads(p.read_text()))
    assert [s[:2] for s in spans] == [("model", "FORWARD"), ("backward", "BACKWARD")]


def test_env_path_starts_a_timeline_on_rank_zero_only(tmp_path, monkeypatch):
    p = tmp_path / "env.json"
    monkeypatch.setenv("RINGLET_TIMELINE", str(p))
    timeline.configure_from_env(1)
    assert timeline.active() is None and not p.exists()
    monkeypatch.setattr(timeline, "_env_started", set())  # as if rank 0 were another process
    timeline.configure_from_env(0)
    tl = timeline.active()
    assert tl is not None and tl.path == str(p)
    timeline.configure_from_env(0)  # a second init keeps the same timeline
    assert timeline.active() is tl
    timeline.mark_step()
    timeline.stop_timeline()
    timeline.configure_from_env(0)  # ... and does not restart (truncate) it after stop_timeline
    assert timeline.active() is None
    assert [e["name"] for e in json.loads(p.read_text()) if e.get("ph") == "i"] == ["step"]


def test_horovod_env_and_per_rank_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_TIMELINE", str(tmp_path / "tl-{rank}.json"))
    timeline.configure_from_env(3)
    assert timeline.active() is not None
    timeline.mark_step()
    timeline.stop_timeline()
    events = json.loads((tmp_path / "tl-3.json").read_text())
    assert {e["pid"] for e in events} == {3}


def test_dynamic_waits_for_start_timeline(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    timeline.configure_from_env(0)
    assert timeline.active() is None
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    timeline.start_timeline(str(a), mark_cycles=True)
    timeline.active().cycle()
    timeline.start_timeline(str(b))  # switching files closes the first
    timeline.active().cycle()  # not marking cycles: nothing written
    timeline.stop_timeline()
    timeline.stop_timeline()
    ea, eb = json.loads(a.read_text()), json.loads(b.read_text())
    assert [e["name"] for e in ea if e.get("ph") == "i"] == ["CYCLE_START"]
    assert [e for e in eb if e.get("ph") == "i"] == []


def test_start_timeline_rejects_an_empty_path():
    with pytest.raises(ValueError):
        timeline.start_timeline("")


def test_rank_comes_from_the_launcher_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGLET_RANK", "2")
    timeline.start_timeline(str(tmp_path / "x.json"))
    assert timeline.active() is None  # rank 2, shared path: rank 0 writes


def test_paused_drops_events_and_resumes_in_the_same_file(tmp_path):
    p = tmp_path / "t.json"
    timeline.start_timeline(str(p))
    timeline.span("a", "FORWARD", 0.0, 1.0)
    with timeline.paused():
        assert timeline.active() is None
        timeline.span("b", "FORWARD", 2.0, 3.0)
        timeline.mark_step()
    timeline.span("c", "FORWARD", 4.0, 5.0)
    timeline.stop_timeline()
    events = json.loads(p.read_text())
    assert [s[0] for s in _spans(events)] == ["a", "c"]
    assert not [e for e in events if e.get("name") == timeline.STEP_EVENT]


def test_paused_then_stopped_or_restarted(tmp_path):
    p, q = tmp_path / "p.json", tmp_path / "q.json"
    timeline.start_timeline(str(p))
    with timeline.paused():
        timeline.stop_timeline()  # stays stopped, and its file is complete
    assert timeline.active() is None
    json.loads(p.read_text())
    timeline.start_timeline(str(p))
    with timeline.paused():
        timeline.start_timeline(str(q))  # replaces the paused one, which is closed
    assert timeline.active() is not None and timeline.active().path == str(q)
    timeline.stop_timeline()
    json.loads(p.read_text())
    json.loads(q.read_text())
    with timeline.paused():  # without a timeline: nothing to hold
        assert timeline.active() is None
    assert timeline.active() is None
