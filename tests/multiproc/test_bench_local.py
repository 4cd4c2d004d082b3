"""`ringlet bench` on this host with real processes: every requested competitor is measured beside
ringlet's transport (a silently missing `native` row would make a comparison look won)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from mp_jobs import RINGLET, finish_job, job_report, require_transport


@pytest.mark.multiproc
@pytest.mark.parametrize("transport", ["torch", "shm"])
def test_bench_measures_native_beside_each_transport(tmp_path, transport):
    require_transport(transport)
    out = tmp_path / "bench.json"
    argv = RINGLET + ["bench", "-np", "2", "--transport", transport, "--compare", "native",
                      "--algorithms", "ring", "-b", "4K", "-e", "64K", "-f", "16", "--json", str(out), "--no-progress"]
    t0 = time.monotonic()
    job = finish_job(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True), 300, t0)
    assert job.returncode == 0, job_report(job)
    data = json.loads(out.read_text())
    assert data["meta"]["transport"] == transport
    assert {(r["impl"], r["size"]) for r in data["rows"]} == {
        (impl, size) for impl in ("ringlet:ring", "native") for size in (4096, 65536)}
    assert all(r["oop_wrong"] == 0 and r["ip_wrong"] == 0 for r in data["rows"]), data["rows"]
