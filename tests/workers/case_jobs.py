"""Launch a worker built on ``case_harness`` (``amp_worker.py``, ``local_sgd_worker.py``) with
``ringlet run`` and collect the ranks' summaries, failing with every failing case of every rank."""
from __future__ import annotations

import sys

from mp_jobs import job_report, load_rank_files, require_transport, run_job, worker


def run_worker(script: str, transport: str, world: int, tmp_path, timeout: float = 300,
               args: tuple[str, ...] = ()) -> list[dict]:
    """``ringlet run -np WORLD --transport TRANSPORT`` the worker (``OUT`` then ``args`` on its command
    line); the ranks' summaries, after asserting that every rank wrote one and none failed a case."""
    require_transport(transport)
    out = tmp_path / "job.json"
    job = run_job(["-np", str(world), "--transport", transport, "--", sys.executable, worker(script), str(out),
                   *args],
                  timeout=timeout, env={"RINGLET_TIMEOUT": "60", "HOROVOD_STALL_CHECK_TIME_SECONDS": "20"})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    lines = [f"rank {s['rank']}: {f['case']}: {f['error']}\n{f['trace']}" for s in ranks for f in s["failed"]]
    assert not lines, "\n".join(lines[:12])
    assert job.returncode == 0, job_report(job)
    return ranks
