"""DistributedDataParallel and the comm hooks over real processes: one ``ringlet run`` job per world size
(torch transport, so stock torch DDP runs beside ringlet). The cases live in ``ddp_worker.py``; here we
launch, collect the per-rank summaries, run ``ringlet report`` on the timeline the job wrote and check
the per-rank timelines that ``RINGLET_TIMELINE=...{rank}...`` produced."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mp_jobs import RINGLET, job_report, load_rank_files, run_job, worker

from ringlet.cli.report import analyze

JOB_TIMEOUT = 300  # seconds; a healthy job takes well under a minute here

CASES = ["equiv_many_buckets", "equiv_one_bucket", "equiv_gradient_as_bucket_view", "lent_gradients", "tuned_algorithm",
         "rebuild_arrival_order", "accumulation_no_sync", "sufficient_factors", "find_unused_parameters", "partial_use",
         "unused_without_flag_raises", "initial_broadcast", "stock_ddp_hooks", "timeline", "coordinated"]


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_equivalence(world, tmp_path):
    out = tmp_path / "ddp.json"
    job = run_job(["-np", str(world), "--transport", "torch", "--", sys.executable, worker("ddp_worker.py"),
                   str(out)], timeout=JOB_TIMEOUT,
                  env={"RINGLET_TIMEOUT": "60", "RINGLET_TIMELINE": str(tmp_path / "env-{rank}.json")})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    failures = [f"rank {s['rank']}: {f['case']}: {f['error']}\n{f['trace']}" for s in ranks for f in s["failed"]]
    assert not failures, "\n".join(failures)
    for s in ranks:
        assert s["passed"] == CASES, s
    assert job.returncode == 0, job_report(job)
    nums = ranks[0]["numbers"]
    print(f"world {world}: buckets {nums['buckets_0.0002']} / {nums['buckets_25']}, "
          f"fp16 hook off by {nums['fp16_vs_stock']:.2e}, report {nums['report_summary']}")

    trace = f"{out}.trace.json"
    res = subprocess.run(RINGLET + ["report", trace], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    print(res.stdout)
    assert "6 steps" in res.stdout and "hidden behind compute" in res.stdout

    # RINGLET_TIMELINE with {rank}: every rank traced the cases before the "timeline" case switched files
    # (which closed these, so they are complete JSON).
    for r in range(world):
        events = json.loads((tmp_path / f"env-{r}.json").read_text())
        assert {e["pid"] for e in events} == {r}
        assert sum(1 for e in events if e.get("name") == "step") > 10
        assert analyze(str(tmp_path / f"env-{r}.json")).summary.comm_us > 0
