"""The flight recorder with real processes: a rank that skips one all-reduce; the launcher keeps the job's
records (ranks 0 and 1 at their failure, rank 2 at its shutdown) and prints the verdict of ``ringlet
diagnose``, which says the same on the folder."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from mp_jobs import RINGLET, job_report, load_rank_files, run_job, worker


@pytest.mark.multiproc
def test_skipped_allreduce_is_named(tmp_path):
    out = tmp_path / "out.json"
    job = run_job(["-np", "3", "--", sys.executable, worker("flight_worker.py"), str(out)], timeout=120,
                  env={"RINGLET_TIMEOUT": "5"})
    m = re.search(r"ringlet run: flight records in (\S+) \(ringlet diagnose \S+\): (.*)", job.stderr)
    assert m, job_report(job)
    fr = m.group(1)
    ranks = load_rank_files(out, 3)
    assert all(s is not None for s in ranks), job_report(job)
    assert ranks[2]["outcome"] == "ok"
    assert all(s["outcome"] in ("PeerError", "CollectiveTimeout") for s in ranks[:2]), ranks
    res = subprocess.run(RINGLET + ["diagnose", fr], capture_output=True, text=True, timeout=60)
    shutil.rmtree(fr, ignore_errors=True)
    verdict = res.stdout.splitlines()[0] if res.stdout else ""
    assert res.returncode == 1, res.stdout + res.stderr
    assert verdict.startswith("rank 2 made 2 all-reduces on the world group where ranks 0 and 1 made 3; "
                              "ranks 0 and 1 failed in the third (shape [4], float32, flight_worker.py:"), res.stdout
    assert m.group(2) == verdict, job_report(job)


@pytest.mark.multiproc
def test_records_of_a_multi_host_job_are_collected_on_its_first_host(tmp_path):
    """Two host entries on this machine (a node launcher each): every host's records reach node 0's
    launcher through the job's store, and its verdict is the single-host job's."""
    out = tmp_path / "out.json"
    job = run_job(["--hosts", "localhost:2,127.0.0.1:1", "--", sys.executable, worker("flight_worker.py"), str(out)],
                  timeout=180, env={"RINGLET_TIMEOUT": "5"})
    m = re.search(r"ringlet run: flight records in (\S+) \(ringlet diagnose \S+\): (.*)", job.stderr)
    assert m, job_report(job)
    fr = m.group(1)
    files = sorted(p.name for p in __import__("pathlib").Path(fr).glob("rank-*.json"))
    shutil.rmtree(fr, ignore_errors=True)
    assert files == ["rank-0.json", "rank-1.json", "rank-2.json"], job_report(job)
    assert m.group(2).startswith("rank 2 made 2 all-reduces on the world group where ranks 0 and 1 made 3"), \
        job_report(job)
