"""Metrics with real processes: a 2-rank DDP job started with ``ringlet run --metrics-port``; the test scrapes
the launcher's endpoint over HTTP while the job trains and checks that both ranks are there, labelled,
and that their counters move between scrapes."""
from __future__ import annotations

import socket
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mp_jobs import finish_job, job_report, start_job, worker


MOVING = ("ringlet_steps_total", "ringlet_collectives_total", "ringlet_collective_bytes_total",
          "ringlet_collective_latency_seconds_count", "ringlet_liveness_heartbeats_total")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict:
    """sample name -> {rank: summed value} of one scrape, or {} when the endpoint is not up yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.labels.get("rank", "")
            out.setdefault(s.name, {}).setdefault(key, 0.0)
            out[s.name][key] += s.value
    return out


def _until(port: int, ok, deadline: float) -> dict:
    while time.monotonic() < deadline:
        m = _scrape(port)
        if m and ok(m):
            return m
        time.sleep(0.5)
    return _scrape(port)


@pytest.mark.multiproc
def test_metrics_endpoint_moves_while_the_job_runs(tmp_path):
    port, stop = _free_port(), tmp_path / "stop"
    t0 = time.monotonic()
    proc = start_job(["-np", "2", "--metrics-port", str(port), "--", sys.executable, worker("metrics_worker.py"),
                      str(stop)])
    try:
        def ranks_up(m):
            steps = m.get("ringlet_steps_total", {})
            return set(steps) == {"0", "1"} and min(steps.values()) >= 3
        first = _until(port, ranks_up, time.monotonic() + 90)
        assert ranks_up(first), first
        def moved(m):
            return all(m.get(n, {}).get(r, -1) > first[n][r] for n in MOVING for r in ("0", "1"))
        second = _until(port, moved, time.monotonic() + 30)
    finally:
        stop.touch()
    job = finish_job(proc, 60, t0)
    assert job.returncode == 0, job_report(job)
    assert job.stdout.count("steps ") == 2, job_report(job)
    for name in MOVING:
        for r in ("0", "1"):
            assert second[name][r] > first[name][r], (name, r, first[name], second[name])
    assert second["ringlet_host_ranks"][""] == 2  # scraped (2) + unreachable (0)
    assert set(second["ringlet_straggler_score"]) == {"0", "1"}
    assert all(v >= 0 for v in second["ringlet_exposed_comm_seconds_total"].values())
    assert set(second["ringlet_rank_info"]) == {"0", "1"}

