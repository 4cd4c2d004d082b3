"""The torch transport's Gloo endpoints with real processes (``ringlet run --transport torch`` with a
job secret in the environment): strangers on every Gloo listener of a running job are refused and
reported while the job's results stay correct, and a rank that does not hold the secret makes every
rank fail clearly. The rank side is ``transport_auth_worker.py``."""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

import pytest
from mp_jobs import finish_job, job_report, load_rank_files, start_job, worker

from ringlet.security import new_secret

WAIT_S = 180.0


def job_env() -> dict:
    return {"RINGLET_JOB_SECRET": new_secret(), "RINGLET_TIMEOUT": "60"}


def wait_files(paths, proc) -> None:
    deadline = time.monotonic() + WAIT_S
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the job ended before writing {[str(p) for p in paths if not p.exists()]}"
        assert time.monotonic() < deadline, f"never written: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def strangers_at(endpoint) -> list[socket.socket]:
    """Three strangers on one listener: one idle, one sending random bytes, one sending what a Gloo peer
    sends first (an 8-byte sequence number)."""
    family = socket.AF_INET6 if ":" in endpoint[0] else socket.AF_INET
    out = []
    for first in (b"", os.urandom(64), struct.pack("<Q", 0)):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(WAIT_S)
        s.connect(tuple(endpoint))
        if first:
            s.sendall(first)
        out.append(s)
    return out


def refused(s: socket.socket) -> bool:
    """True when the job closed the connection (EOF or reset) without sending anything."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
def test_strangers_on_every_gloo_listener_are_refused(world, tmp_path):
    out = tmp_path / "auth.json"
    t0 = time.monotonic()
    proc = start_job(["-np", str(world), "--transport", "torch", "--", sys.executable,
                      worker("transport_auth_worker.py"), "strangers", str(out)], env=job_env())
    socks: dict[int, list[socket.socket]] = {}
    names: dict[int, set] = {}
    try:
        lists = [tmp_path / f"auth.json.listeners{r}" for r in range(world)]
        wait_files(lists, proc)
        for r, path in enumerate(lists):
            listeners = json.loads(path.read_text())
            assert listeners, f"rank {r} watches no Gloo listener"
            assert all(ep[0] in ("127.0.0.1", "::1") for ep in listeners), f"not on loopback: {listeners}"
            socks[r] = [s for ep in listeners for s in strangers_at(ep)]
            names[r] = {tuple(s.getsockname()[:2]) for s in socks[r]}
        (tmp_path / "auth.json.go").write_text(json.dumps({str(r): len(v) for r, v in socks.items()}))
        wait_files([tmp_path / f"auth.json.found{r}" for r in range(world)], proc)
        not_refused = [(r, s.getsockname()) for r, v in socks.items() for s in v if not refused(s)]
        (tmp_path / "auth.json.finish").write_text("")
    finally:
        job = finish_job(proc, WAIT_S, t0)
        for v in socks.values():
            for s in v:
                s.close()
    assert not not_refused, f"strangers not refused: {not_refused}\n{job_report(job)}"
    assert job.returncode == 0, job_report(job)
    assert "transport refused a connection from" in job.stderr, job_report(job)
    for s in load_rank_files(out, world):
        assert s is not None, job_report(job)
        assert {tuple(ep) for ep in s["found"]} == names[s["rank"]], s
        assert all(s["checks"].values()) and s["checks"], s


@pytest.mark.multiproc
@pytest.mark.parametrize("world,bad", [(2, 1), (3, 1), (3, 0)])
def test_a_rank_without_the_secret_fails_every_rank(world, bad, tmp_path):
    out = tmp_path / "bad.json"
    t0 = time.monotonic()
    proc = start_job(["-np", str(world), "--transport", "torch", "--", sys.executable,
                      worker("transport_auth_worker.py"), "bad_secret", str(out), str(bad)], env=job_env())
    job = finish_job(proc, WAIT_S, t0)
    assert job.returncode != 0, job_report(job)
    for r, s in enumerate(load_rank_files(out, world)):
        assert s is not None, f"rank {r} wrote nothing\n{job_report(job)}"
        assert s["error"] == "PairAuthError" and s["peer_error"], s
        assert "failed authentication" in s["message"], s
        assert s["pairs"] and all(bad in pair for pair in s["pairs"]), s
        if r != bad:
            assert f"with rank {bad}: it did not prove the job's secret" in s["message"], s
