"""``ringlet report``: interval arithmetic and per-step numbers on hand-built traces."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ringlet import timeline
from ringlet.cli.main import main
from ringlet.cli.report import analyze, intersect, measure, union


def test_interval_helpers():
    assert union([(5, 7), (0, 2), (1, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert measure([(0, 3), (5, 9)]) == 7
    assert intersect([(0, 3), (5, 9)], [(2, 6), (8, 20)]) == [(2, 3), (5, 6), (8, 9)]
    assert intersect([], [(0, 1)]) == []


def _trace(path, steps, rank=0):
    """Write a trace: each step is (compute spans, comm spans) placed in [100*k, 100*k + 100)."""
    tl = timeline.Timeline(str(path), rank)
    for k, (compute, comm) in enumerate(steps):
        base = 100.0 * k
        tl.instant(timeline.STEP_TRACK, timeline.STEP_EVENT, ts_us=base)
        for a, b in compute:
            tl.span("backward", "BACKWARD", base + a, base + b)
        for i, (a, b) in enumerate(comm):
            tl.span(f"bucket{i}", "COMMUNICATE", base + a, base + b)
            tl.span(f"bucket{i}", "QUEUE", base, base + a)  # other phases are ignored
    tl.instant(timeline.STEP_TRACK, timeline.STEP_EVENT, ts_us=100.0 * len(steps))
    return tl


def test_per_step_numbers(tmp_path):
    p = tmp_path / "t.json"
    steps = [
        ([(0, 50)], [(40, 60)]),                    # warm-up: hidden 10, exposed 10
        ([(0, 40)], [(20, 50), (30, 60)]),           # comm union 20..60 = 40, hidden 20, exposed 20
        ([(0, 30), (35, 50)], [(10, 40), (45, 80)]),  # comm 30+35=65, hidden 20+5+5=30, exposed 35
    ]
    _trace(p, steps).close()
    rep = analyze(str(p))
    assert [(s.compute_us, s.comm_us, s.hidden_us, s.exposed_us) for s in rep.steps] == [
        (50, 20, 10, 10), (40, 40, 20, 20), (45, 65, 30, 35)]
    assert [s.step_us for s in rep.steps] == [100, 100, 100]
    assert rep.steps[1].exposed_share == pytest.approx(0.2)
    m = rep.summary
    assert m.steps == 2 and m.comm_us == pytest.approx(52.5) and m.hidden_us == pytest.approx(25)
    assert m.exposed_share == pytest.approx(55 / 200) and m.hidden_fraction == pytest.approx(50 / 105)


def test_spans_are_clipped_to_their_step_and_a_trailing_step_counts(tmp_path):
    p = tmp_path / "t.json"
    tl = timeline.Timeline(str(p))
    tl.instant("steps", "step", ts_us=0.0)
    tl.span("backward", "BACKWARD", 0.0, 80.0)
    tl.span("b0", "COMMUNICATE", 60.0, 130.0)  # crosses into the next step
    tl.instant("steps", "step", ts_us=100.0)
    tl.span("backward", "BACKWARD", 100.0, 150.0)  # after the last mark: a final step to 150
    tl.close()
    rep = analyze(str(p), skip=0)
    assert len(rep.steps) == 2
    s0, s1 = rep.steps
    assert (s0.comm_us, s0.hidden_us, s0.exposed_us) == (40, 20, 20)
    assert (s1.step_us, s1.compute_us, s1.comm_us, s1.hidden_us) == (50, 50, 30, 30)


def test_unterminated_trace_and_rank_choice(tmp_path):
    p = tmp_path / "t.json"
    tl = _trace(p, [([(0, 50)], [(40, 60)])] * 3, rank=2)
    tl.flush()  # the writer "dies" here: no closing bracket
    rep = analyze(str(p))
    assert rep.rank == 2 and len(rep.steps) == 3
    with pytest.raises(Exception, match="no events of rank 0"):
        analyze(str(p), rank=0)
    tl.close()


def test_cli_prints_table_and_json(tmp_path):
    p = tmp_path / "t.json"
    _trace(p, [([(0, 50)], [(40, 60)]), ([(0, 40)], [(20, 50), (30, 60)])]).close()
    res = CliRunner().invoke(main, ["report", str(p)])
    assert res.exit_code == 0, res.output
    assert "hidden behind compute: 50.0%" in res.output and "20.0% of the step" in res.output
    res = CliRunner().invoke(main, ["report", "--json", "--skip", "0", str(p)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["summary"]["steps"] == 2 and len(data["steps"]) == 2


def test_cli_rejects_a_trace_without_spans(tmp_path):
    p = tmp_path / "empty.json"
    timeline.Timeline(str(p)).close()
    res = CliRunner().invoke(main, ["report", str(p)])
    assert res.exit_code != 0 and "no BACKWARD" in res.output


def test_stretches_without_spans_are_not_steps(tmp_path):
    """A paused timeline (another arm of an A/B job ran meanwhile) leaves marks around an empty stretch."""
    p = tmp_path / "t.json"
    tl = timeline.Timeline(str(p))
    for base in (0.0, 100.0, 1000.0):  # 200..1000: the timeline was paused
        tl.instant("steps", "step", ts_us=base)
        tl.span("backward", "BACKWARD", base, base + 50.0)
        tl.span("b0", "COMMUNICATE", base + 40.0, base + 60.0)
        tl.instant("steps", "step", ts_us=base + 100.0)
    tl.close()
    rep = analyze(str(p), skip=0)
    assert [s.start_us for s in rep.steps] == [0.0, 100.0, 1000.0]
    assert [s.step_us for s in rep.steps] == [100.0] * 3 and rep.summary.exposed_share == pytest.approx(0.1)
