"""A short soak (``benchmarks/soak/soak.py``) with real processes over Gloo and shared memory: 300 mixed
collectives on 4 ranks (every collective, blocking and ``_async`` forms with handles outstanding, in-place
forms, four groups, every all-reduce algorithm and ``auto``, sizes up to 256 KiB). Every result must equal
the soak's reference and, after the first sample, descriptors and threads must stay constant. Memory
growth is judged by the full soak only (a run this short is all warm-up); see docs/testing.md ("The soak")."""
from __future__ import annotations

import json
import sys

import pytest
from mp_jobs import HERE, job_report, require_transport, run_job

from ringlet import algorithms

SOAK = str(HERE.parent.parent / "benchmarks" / "soak" / "soak.py")
KINDS = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter", "alltoall", "barrier")


@pytest.mark.multiproc
@pytest.mark.parametrize("transport", ["torch", "shm"])
def test_soak_short(transport, tmp_path):
    require_transport(transport)
    out = tmp_path / "soak.json"
    job = run_job(["-np", "4", "--transport", transport, "--", sys.executable, SOAK, "--ops", "300",
                   "--max-bytes", str(256 << 10), "--seed", "3", "--rss-limit", "inf", "--out", str(out)],
                  timeout=180, env={"RINGLET_TIMEOUT": "60"})
    assert out.exists(), job_report(job)
    m = json.loads(out.read_text())
    assert m["verdict"]["errors"] == 0, "\n".join(m["errors"][:20])
    for r in m["ranks"]:
        for k in ("fds", "threads", "threads_os"):
            assert r[f"{k}_constant"], (k, r)
    assert job.returncode == 0, job_report(job)
    calls = m["calls"]
    assert all(calls.get(k, 0) > 0 for k in KINDS), calls
    algos = {k.split(":", 1)[1] for k in calls if k.startswith("allreduce:")}
    want = set(algorithms.allreduce_names()) | {"auto"}
    if transport != "torch":
        want.discard(algorithms.NATIVE)
    assert algos == want, algos
