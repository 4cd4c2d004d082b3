"""Mixed precision with real processes (2 and 3 ranks, Gloo and shared memory): ringlet's GradScaler
agrees on overflows across ranks, MasterWeights keeps float32 masters of a bfloat16/float16 model,
autocast trains under ringlet's DDP, and a checkpoint continues identically. The cases live in
``amp_worker.py``; this test launches the job and fails with every failing case of every rank."""
from __future__ import annotations

import sys

import pytest

from mp_jobs import job_report, load_rank_files, require_transport, run_job, worker

CASES = ["inf_on_one_rank", "master_weights", "autocast_bf16", "checkpoint", "coordinated"]


def run_worker(script: str, transport: str, world: int, tmp_path) -> list[dict]:
    """``ringlet run`` the worker; fail with every failing case of every rank; the ranks' summaries."""
    require_transport(transport)
    out = tmp_path / "job.json"
    job = run_job(["-np", str(world), "--transport", transport, "--", sys.executable, worker(script), str(out)],
                  timeout=300, env={"RINGLET_TIMEOUT": "60", "HOROVOD_STALL_CHECK_TIME_SECONDS": "20"})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    lines = [f"rank {s['rank']}: {f['case']}: {f['error']}\n{f['trace']}" for s in ranks for f in s["failed"]]
    assert not lines, "\n".join(lines[:12])
    assert job.returncode == 0, job_report(job)
    return ranks


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("transport", ["torch", "shm"])
def test_mixed_precision(transport, world, tmp_path):
    ranks = run_worker("amp_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: {ranks[0]['numbers']}")
