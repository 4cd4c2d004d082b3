"""Straggler detection with real processes: three ranks of DDP under ``ringlet run`` (the liveness
monitor shares the summaries on its heartbeat), rank 1 sleeping 60 ms in each forward for its first
150 steps while the others sleep 10 ms. The job's log names rank 1 a compute straggler once and its
recovery once; every rank's timeline marks both, and ``ringlet report`` lists them. The detector's
cases (a slow but equal job, one slow step, a slow link) run in tests/unit/test_straggler.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mp_jobs import RINGLET, job_report, run_job, worker

pytestmark = pytest.mark.multiproc


def test_a_rank_sleeping_in_forward_is_named_then_recovers(tmp_path):
    job = run_job(["-np", "3", "--transport", "torch", "--", sys.executable, worker("straggler_worker.py"),
                   "--out", str(tmp_path), "--slow", "1"], timeout=240, env={"RINGLET_TIMEOUT": "120"})
    assert job.returncode == 0, job_report(job)
    log = job.stdout + job.stderr
    named = [x for x in log.splitlines() if "straggler: rank 1 (host" in x and "is compute-bound" in x]
    recovered = [x for x in log.splitlines() if "straggler rank 1 (host" in x and "has recovered" in x]
    assert len(named) == 1 and len(recovered) == 1, job_report(job)
    assert log.count("is compute-bound") == 1 and "network-bound" not in log, job_report(job)
    for r in range(3):
        summary = json.loads((tmp_path / f"summary-{r}.json").read_text())
        assert summary["summary"]["n"] >= 590 and set(summary["scores"]) == {"0", "1", "2"}
    for r in range(3):  # every rank marks the verdicts on its own timeline
        res = subprocess.run(RINGLET + ["report", str(tmp_path / f"timeline-{r}.json")], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.split("stragglers:")[1].splitlines()
        assert "rank 1 (host" in lines[1] and "compute-bound" in lines[1], res.stdout[-2000:]
        assert "rank 1 (host" in lines[2] and "recovered" in lines[2], res.stdout[-2000:]
