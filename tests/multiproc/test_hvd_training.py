"""Horovod-API training with real processes: one ``ringlet run`` job per world size (torch transport).

The job (``hvd_training_worker.py``) checks, on every rank: DistributedOptimizer training equals
single-process training on the concatenated batch (fp32, 1e-6) with and without accumulation, grouping,
fusion (two init sessions: default threshold and ``HOROVOD_FUSION_THRESHOLD=0``); the optimizer's misuse
errors; the gradients of every differentiable collective; broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object; SyncBatchNorm against BatchNorm on the
concatenated batch. This test launches it and fails with every failing case of every rank.

One further job per world size runs the same worker on the case modules, one after the other:
``hvd_cases_join`` (join() followed by every collective kind, each rank joining first in turn, with
cached, fresh and unnamed ops), ``hvd_cases_optim`` (broadcast_optimizer_state for every torch.optim
class, SparseAdam with sparse_as_dense, the step()-after-synchronize() warning), ``hvd_cases_fused``
(gradients as ordered, fused all-reduces against matched by name; join() with uneven steps; differing
parameters) and ``hvd_cases_factors``.
"""
from __future__ import annotations

import importlib
import sys

import pytest

from mp_jobs import job_report, load_rank_files, run_job, worker

JOB_TIMEOUT = 300  # seconds; a healthy job takes well under a minute here


def run_cases(world: int, tmp_path, modules: list[str]) -> list[dict]:
    """Run the worker on ``world`` ranks (with only ``modules``' cases when given); fail with every
    failing case of every rank; return the ranks' summaries."""
    out = tmp_path / "hvd.json"
    job = run_job(["-np", str(world), "--transport", "torch", "--", sys.executable,
                   worker("hvd_training_worker.py"), str(out), *modules],
                  timeout=JOB_TIMEOUT, env={"RINGLET_TIMEOUT": "60", "HOROVOD_STALL_CHECK_TIME_SECONDS": "20"})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    lines = [f"rank {s['rank']}: {f['case']}: {f['error']}\n{f['trace']}" for s in ranks for f in s["failed"]]
    assert not lines, f"{len(lines)} failing cases over {world} ranks:\n" + "\n".join(lines[:12])
    assert job.returncode == 0, job_report(job)
    return ranks


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
def test_hvd_training_equivalence(world, tmp_path):
    ranks = run_cases(world, tmp_path, [])
    passed = ranks[0]["passed"]
    assert any(p.startswith("fusion_off/") for p in passed) and any(p.startswith("fusion_default/") for p in passed)
    print(f"torch x {world}: {len(passed)} cases passed on every rank; sections {ranks[0]['sections']}")


CASE_MODULES = ["hvd_cases_join", "hvd_cases_optim", "hvd_cases_fused", "hvd_cases_factors"]


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
def test_hvd_case_modules(world, tmp_path):
    """Every case module's cases, one after the other in one job (one process start per world size)."""
    cases = [name for module in CASE_MODULES for name, _ in importlib.import_module(module).CASES]
    ranks = run_cases(world, tmp_path, CASE_MODULES)
    assert [p.split("/", 1)[1] for p in ranks[0]["passed"]] == cases, ranks[0]["passed"]
