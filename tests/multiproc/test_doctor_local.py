"""`ringlet doctor -np 3` on this host with real processes: every rank is a row, every pair is measured,
the JSON holds the same table, and a verdict line is printed."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from mp_jobs import RINGLET, finish_job, job_report, require_transport


@pytest.mark.multiproc
def test_doctor_three_ranks_on_one_host(tmp_path):
    require_transport("shm")
    out = tmp_path / "doctor.json"
    argv = RINGLET + ["doctor", "-np", "3", "--quick", "--json", str(out)]
    t0 = time.monotonic()
    job = finish_job(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True), 300, t0)
    assert job.returncode == 0, job_report(job)
    table = json.loads(out.read_text())
    assert [h["ranks"] for h in table["hosts"]] == [[0], [1], [2]]
    for h in table["hosts"]:
        assert h["gflops_1t"] > 0 and h["gflops_nt"] > 0 and h["mem_available"] > 0
        assert h["iface"] == "lo" and h["mtu"] > 0 and h["clock_err_s"] >= 0
    assert [(p["a"], p["b"]) for p in table["pairs"]] == [(0, 1), (0, 2), (1, 2)]
    assert all(p["latency_us"] > 0 and p["bw_ab_gbit"] > 0 and p["bw_ba_gbit"] > 0 for p in table["pairs"])
    assert table["verdict"] and all(f"verdict: {line}" in job.stdout for line in table["verdict"])
    assert all(h["name"] in job.stdout for h in table["hosts"])
