"""Item: stock torch DDP plus ringlet's hook line, nothing else — ringlet initialises itself on the
script's default process group at the first hook call (real processes, 2 and 3 ranks)."""
from __future__ import annotations

import sys

import pytest

from mp_jobs import job_report, load_rank_files, run_job, worker


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", [("torch", 3), ("default", 2)], ids=["torch-3", "default-2"])
def test_hook_line_is_all_a_stock_ddp_script_needs(world, transport, tmp_path):
    out = tmp_path / "hook.json"
    how = ["--transport", transport] if transport != "default" else []  # default: shm on one host
    job = run_job(["-np", str(world), *how, "--", sys.executable, worker("hook_only_worker.py"),
                   str(out)], timeout=240, env={"RINGLET_TIMEOUT": "60"})
    assert job.returncode == 0, job_report(job)
    for s in load_rank_files(out, world):
        assert s is not None, job_report(job)
        assert s["transport"] == ("shm" if transport == "default" else "torch"), s
        assert s["hook_vs_stock"] <= 1e-6, s
        assert s["fp16_vs_stock"] <= 1e-2, s
        # Several buckets went through the hook on its per-bucket state (DDP rebuilds its buckets after
        # the first step, so their count and indices may change then).
        calls = s["bucket_calls"]
        assert len(calls) > 1 and min(calls.values()) >= 3 and max(calls.values()) == 4, s
