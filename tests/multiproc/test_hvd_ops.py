"""ringlet.torch ops with real processes: one ``ringlet run`` job per (transport, world size) pair (Gloo
on 3 ranks, shared memory on 2), each running every case of ``hvd_ops_worker.py`` (name matching, the
error table, fusion on/off, join, process sets, stall warning, re-init, dead peer)."""
from __future__ import annotations

import sys

import pytest

from mp_jobs import job_report, load_rank_files, require_transport, run_job, transport_world_params, worker

JOB_TIMEOUT = 300  # seconds; a healthy job takes well under a minute here


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2)))
def test_hvd_ops(transport, world, tmp_path):
    require_transport(transport)
    out = tmp_path / "hvd.json"
    job = run_job(["-np", str(world), "--transport", transport, "--", sys.executable, worker("hvd_ops_worker.py"),
                   str(out)], timeout=JOB_TIMEOUT, env={"RINGLET_TIMEOUT": "20"})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    problems = [f"rank {s['rank']}: {f['case']}: {f['error']}\n{f.get('trace', '')}" for s in ranks for f in s["failed"]]
    assert not problems, "\n".join(problems) + "\n" + job_report(job)
    assert ranks[-1]["role"] == "victim" and all(s["role"] == "survivor" for s in ranks[:-1])
    assert all("dead_peer" in s["passed"] for s in ranks[:-1])
    assert job.returncode == 0, job_report(job)
