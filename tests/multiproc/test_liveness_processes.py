"""Silent and dead peers with real processes: ``kill -9`` and ``SIGSTOP`` of one rank in an all-reduce
loop, over Gloo with one node launcher per "host" (three entries of this machine) and over shared
memory; every survivor raises a ``PeerError`` naming the rank, the launcher exits non-zero and names
it, nothing hangs (each job is bounded). A slow but live rank (a long pause between collectives) and
a clean early exit raise nothing. Cutting a link needs the emulated cluster: see
benchmarks/liveness/liveness_trials.py."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from mp_jobs import finish_job, start_job, worker

pytestmark = pytest.mark.multiproc

HOSTS = ["--hosts", "localhost:1,127.0.0.2:1,127.0.0.3:1", "--transport", "torch"]
ENV = {"RINGLET_PEER_TIMEOUT": "4", "RINGLET_TIMEOUT": "120"}
BOUND = 150


def wait_ready(out: Path, n: int, proc, limit: float = 90.0) -> None:
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        if all((out / f"ready-{r}").exists() for r in range(n)):
            return
        time.sleep(0.1)
    raise AssertionError("the ranks never reached their loop")


def results(out: Path, n: int) -> dict[int, dict]:
    return {r: json.loads((out / f"res-{r}.json").read_text()) for r in range(n) if (out / f"res-{r}.json").exists()}


@pytest.mark.parametrize("how", ["kill", "stop"])
@pytest.mark.parametrize("layout", ["hosts", "shm"])
def test_every_survivor_names_the_failed_rank(tmp_path, how, layout):
    args = HOSTS if layout == "hosts" else ["-np", "3", "--transport", "shm"]
    t0 = time.monotonic()
    proc = start_job([*args, "--", sys.executable, worker("liveness_worker.py"), "--out", str(tmp_path)], ENV)
    wait_ready(tmp_path, 3, proc)
    victim = int((tmp_path / "pid-1").read_text())
    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    job = finish_job(proc, BOUND, t0)
    assert job.returncode != 0
    res = results(tmp_path, 3)
    if layout == "shm" and how == "kill":
        # One host, one agent: it stops the other ranks as soon as one dies (as torchrun does).
        assert "rank 1 (host" in job.stderr and "exit status 137" in job.stderr, job.stderr[-3000:]
        return
    for r in (0, 2):
        assert r in res and not res[r]["ok"], (r, res, job.stderr[-3000:])
        assert res[r]["type"] == "PeerError" and res[r]["peer"] == 1, res[r]
        want = "was killed by SIGKILL" if how == "kill" else "fell silent"
        assert f"rank 1 (host " in res[r]["msg"] and want in res[r]["msg"], res[r]
    assert "the first failure: rank 1 (host" in job.stderr, job.stderr[-3000:]


def test_a_slow_live_peer_and_a_clean_exit_raise_nothing(tmp_path):
    """Rank 1 pauses three times the peer timeout between two all-reduces (its heartbeats go on)."""
    t0 = time.monotonic()
    proc = start_job([*HOSTS, "--", sys.executable, worker("liveness_worker.py"), "--out", str(tmp_path),
                      "--iters", "40", "--pause", "12"], ENV)
    job = finish_job(proc, BOUND, t0)
    assert job.returncode == 0, job.stderr[-3000:]
    assert all(v["ok"] for v in results(tmp_path, 3).values())
