"""The examples and ``ringlet demo`` run for real: 2 ranks, a short training each, sane output.

``ringlet demo`` runs the three digits examples (``train_digits_hvd.py``, ``train_digits_ddp.py`` and
``train_digits_ddp.py --stock``) for one epoch each, so each must beat chance (10%) clearly there; the
synthetic benchmark must report a positive throughput, and its timeline (hvd, ddp) must summarise with
``ringlet report``.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mp_jobs import RINGLET, job_report, run_job

from ringlet.cli.report import analyze

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_TIMEOUT = 240  # seconds; each job takes well under a minute here

pytestmark = pytest.mark.multiproc


@pytest.fixture(autouse=True)
def _sklearn():
    if importlib.util.find_spec("sklearn") is None:
        pytest.fail("scikit-learn is missing: the examples need it (pip install -e '.[examples]'; make test does)")


@pytest.mark.parametrize("mode,model,traced", [("hvd", "cnn", True), ("ddp", "cnn", True),
                                               ("stock-ddp", "mlp", False)])
def test_synthetic_benchmark(mode, model, traced, tmp_path):
    trace = tmp_path / "trace.json"
    env = {"RINGLET_TIMEOUT": "60", **({"RINGLET_TIMELINE": str(trace)} if traced else {})}
    job = run_job(["-np", "2", "--", sys.executable, str(EXAMPLES / "synthetic_benchmark.py"), "--mode", mode,
                   "--model", model, "--batch-size", "4", "--num-warmup-batches", "1",
                   "--num-batches-per-iter", "2", "--num-iters", "2"], timeout=JOB_TIMEOUT, env=env)
    assert job.returncode == 0, job_report(job)
    params = {"cnn": "2.47", "mlp": "25.19"}[model]
    assert f"model {model} ({params} M parameters), mode {mode}" in job.stdout, job_report(job)
    assert len(re.findall(r"iter \d: [\d.]+ img/s per rank", job.stdout)) == 2, job_report(job)
    total = re.search(r"total img/s on 2 ranks: ([\d.]+)", job.stdout)
    assert total and float(total.group(1)) > 0, job_report(job)
    if traced:
        summary = analyze(str(trace)).summary
        assert summary.steps >= 3 and summary.comm_us > 0 and summary.compute_us > 0, summary
        res = subprocess.run(RINGLET + ["report", str(trace)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "hidden behind compute" in res.stdout, res.stdout + res.stderr


def test_demo():
    cmd = RINGLET + ["demo", "-np", "2", "--epochs", "1", "--timeout", str(JOB_TIMEOUT)]
    # The demo stops each of its jobs after --timeout itself; this outer limit is only a backstop.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * JOB_TIMEOUT + 60,
                         env={**os.environ, "RINGLET_TIMEOUT": "60"})
    report = f"$ {' '.join(cmd)}\nexit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    assert res.returncode == 0, report
    for label in ("ringlet DistributedOptimizer (hvd API)", "ringlet DistributedDataParallel",
                  "torch DistributedDataParallel (Gloo)"):
        row = re.search(re.escape(label) + r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x", res.stdout)
        assert row and float(row.group(1)) > 0.5 and float(row.group(2)) > 0, report
    assert "correctness: all results exact" in res.stdout, report
