"""``ringlet tune`` with real processes on this host, and ``ringlet.init()`` loading what it saved: every
rank of a later job with the same fingerprint holds the same network model. Two emulated hosts come
from a host list naming this machine twice (each entry acts as a host)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_jobs import RINGLET, finish_job, job_report, load_rank_files, require_transport, run_job

from ringlet.tuning.network import INTER, INTRA
from ringlet.tuning.profile import Fingerprint, Profile, cache_path

WORKER = '''
import json, sys
import ringlet
rt = ringlet.init()
model = rt.network_model
out = {"rank": rt.rank, "host_of": list(rt.world.host_of),
       "network": None if model is None else model[0].to_dict(),
       "topology": None if model is None else list(model[1].host_of)}
ringlet.shutdown()
with open(f"{sys.argv[1]}.rank{out['rank']}", "w") as fh:
    json.dump(out, fh)
'''

JOBS = [  # (transport, ranks, host list, ranks per host)
    pytest.param("shm", 2, None, (2,), id="shm-1x2"),
    pytest.param("shm", 3, None, (3,), id="shm-1x3"),
    pytest.param("torch", 4, "localhost:2,127.0.0.1:2", (2, 2), id="torch-2x2"),
]


def _launch(args: list[str], profiles: Path, timeout: float = 300, **env):
    t0 = time.monotonic()
    proc = subprocess.Popen(RINGLET + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "RINGLET_PROFILE_DIR": str(profiles), **env})
    return finish_job(proc, timeout, t0)


def _place(transport: str, ranks: int, hosts: str | None) -> list[str]:
    return ["-np", str(ranks), "--transport", transport] + (["--hosts", hosts] if hosts else [])


def _init_models(tmp_path: Path, profiles: Path, transport, ranks, hosts, **env) -> list[dict]:
    worker = tmp_path / "init_worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "init"
    job = run_job(_place(transport, ranks, hosts) + ["--", sys.executable, str(worker), str(out)],
                  timeout=300, env={"RINGLET_PROFILE_DIR": str(profiles), **env})
    assert job.returncode == 0, job_report(job)
    return load_rank_files(out, ranks)


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,ranks,hosts,layout", JOBS)
def test_tune_saves_a_profile_that_init_loads_on_every_rank(tmp_path, transport, ranks, hosts, layout):
    require_transport(transport)
    profiles = tmp_path / "profiles"
    job = _launch(["tune", "--quick"] + _place(transport, ranks, hosts), profiles)
    assert job.returncode == 0, job_report(job)
    fp = Fingerprint(ranks, layout, transport)
    saved = Profile.load(cache_path(fp, str(profiles)))
    assert saved.fingerprint == fp
    assert "alpha (us)" in job.stdout and fp.key in job.stdout and cache_path(fp, str(profiles)) in job.stdout
    assert saved.info["measured"] == ([INTER, INTRA] if len(layout) > 1 else [INTRA])
    assert saved.network.gamma > 0 and saved.info["plan"] == "quick"
    models = _init_models(tmp_path, profiles, transport, ranks, hosts)
    assert all(m is not None and m["network"] == saved.network.to_dict() for m in models), models
    assert all(m["topology"] == m["host_of"] for m in models)


@pytest.mark.multiproc
def test_tune_out_path_and_init_with_ringlet_profile(tmp_path):
    require_transport("shm")
    target = tmp_path / "mine.json"
    job = _launch(["tune", "--quick", "-np", "2", "--transport", "shm", "--out", str(target)], tmp_path / "unused")
    assert job.returncode == 0, job_report(job)
    saved = Profile.load(str(target))
    assert not (tmp_path / "unused").exists()
    models = _init_models(tmp_path, tmp_path / "empty", "shm", 2, None, RINGLET_PROFILE=str(target))
    assert [m["network"] for m in models] == [saved.network.to_dict()] * 2
    # the same profile for another rank count is ignored: no model, no error
    models = _init_models(tmp_path, tmp_path / "empty", "shm", 3, None, RINGLET_PROFILE=str(target))
    assert [m["network"] for m in models] == [None] * 3


@pytest.mark.multiproc
def test_init_with_tune_auto_calibrates_once_and_caches(tmp_path):
    require_transport("shm")
    profiles = tmp_path / "profiles"
    models = _init_models(tmp_path, profiles, "shm", 2, None, RINGLET_TUNE="auto")
    fp = Fingerprint(2, (2,), "shm")
    saved = Profile.load(cache_path(fp, str(profiles)))
    assert saved.info["plan"] == "quick"
    assert [m["network"] for m in models] == [saved.network.to_dict()] * 2
    again = _init_models(tmp_path, profiles, "shm", 2, None, RINGLET_TUNE="auto")
    assert [m["network"] for m in again] == [saved.network.to_dict()] * 2
    assert Profile.load(cache_path(fp, str(profiles))).info == saved.info  # loaded, not re-calibrated


@pytest.mark.multiproc
def test_init_fails_on_every_rank_with_a_corrupt_profile(tmp_path):
    require_transport("shm")
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    worker = tmp_path / "init_worker.py"
    worker.write_text(WORKER)
    job = run_job(["-np", "2", "--transport", "shm", "--", sys.executable, str(worker),
                   str(tmp_path / "x")], timeout=300, env={"RINGLET_PROFILE": str(bad)})
    assert job.returncode != 0
    assert f"{bad} (RINGLET_PROFILE) is not JSON" in job.stderr, job_report(job)


@pytest.mark.multiproc
def test_bench_predict_auto(tmp_path):
    require_transport("shm")
    profiles = tmp_path / "profiles"
    assert _launch(["tune", "--quick", "-np", "2", "--transport", "shm"], profiles).returncode == 0
    out = tmp_path / "bench.json"
    job = _launch(["bench", "-np", "2", "--transport", "shm", "--algorithms", "ring,recursive_doubling",
                   "--sizes", "4K,1M", "-n", "3", "-w", "1", "--predict", "auto", "--json", str(out),
                   "--no-progress"], profiles)
    assert job.returncode == 0, job_report(job)
    rows = json.loads(out.read_text())["rows"]
    if importlib.util.find_spec("ringlet.tuning.cost") is None:
        assert "cost model (ringlet.tuning.cost) is not available" in job.stdout
        return
    assert "measured (in-place) against predicted" in job.stdout
    for r in rows:
        assert r["extra"]["predicted_us"] > 0 and r["extra"]["pred_against"] == "ip_us", r
