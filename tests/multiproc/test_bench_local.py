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


@pytest.mark.multiproc
def test_bench_compression_counts_bytes_from_the_transport(tmp_path):
    """`--compression` on 2 ranks: the bytes are the transport's count, fp16 about half of none's and
    top-k 1 % a small fraction; nothing else is measured without `--collectives`."""
    require_transport("shm")
    out = tmp_path / "bench.json"
    argv = RINGLET + ["bench", "-np", "2", "--transport", "shm", "--compression", "none,fp16,int8+ef,topk:0.01+ef",
                      "--sizes", "256K", "-n", "3", "-w", "1", "--json", str(out), "--no-progress"]
    t0 = time.monotonic()
    job = finish_job(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True), 300, t0)
    assert job.returncode == 0, job_report(job)
    data = json.loads(out.read_text())
    assert data["rows"] == []
    rows = {r["compressor"]: r for r in data["compression"]}
    assert list(rows) == ["none", "fp16", "int8+ef", "topk:0.01+ef"]
    none, fp16, topk = rows["none"], rows["fp16"], rows["topk:0.01+ef"]
    assert none["sent"] == pytest.approx(256 * 1024, rel=0.01)  # ring on 2 ranks: 2(p-1)/p x 4 B x n
    assert fp16["sent"] / none["sent"] == pytest.approx(0.5, abs=0.01) == fp16["ratio"]
    assert topk["sent"] < 0.05 * none["sent"]
    assert none["max_err"] < 1e-5 < fp16["max_err"] < 0.05
    assert "compressor" in job.stdout and "topk:0.01+ef" in job.stdout
