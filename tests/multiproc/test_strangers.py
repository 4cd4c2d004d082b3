"""A stranger without the job's secret connects to the job's store (which is also its static
rendezvous) and to an elastic job's rendezvous: it is refused and logged, and the job finishes with
correct results. Strangers tried: torch's ``TCPStore`` client (what anyone would use), raw bytes, a
client of ringlet's store protocol that skips the handshake, and ringlet's client with a wrong secret."""
from __future__ import annotations

import datetime
import json
import socket
import sys
import time
from pathlib import Path

import pytest
from mp_jobs import finish_job, start_job, worker

pytestmark = pytest.mark.multiproc

TIMEOUT = 180


def wait_ports(out: Path, proc, limit: float = 90.0) -> dict:
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        p = out / "ports.json"
        if p.exists():
            return json.loads(p.read_text())
        time.sleep(0.1)
    raise AssertionError("the job never wrote its ports")


def be_a_stranger(addr: str, port: int) -> list[str]:
    """Every way a stranger would try; returns what each attempt got."""
    import torch.distributed as dist

    from ringlet.security import AuthError
    from ringlet.store import StoreClient
    from ringlet.store.protocol import Op, send

    got = []
    try:
        st = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=3))
        st.set("stranger", "was here")
        got.append("torch client: ACCEPTED")
    except Exception as exc:  # noqa: BLE001
        got.append(f"torch client: refused ({type(exc).__name__})")
    try:
        with socket.create_connection((addr, port), timeout=3) as s:
            s.sendall(b"\x00" * 64)
            send(s, Op.SET, [b"stranger", b"1"])
            got.append("raw bytes: sent")
    except OSError as exc:  # the store dropped the connection before the second write
        got.append(f"raw bytes: refused ({type(exc).__name__})")
    try:
        StoreClient(addr, port, bytes(32), timeout=3, connect_timeout=3).set("stranger", "1")
        got.append("wrong secret: ACCEPTED")
    except AuthError:
        got.append("wrong secret: refused")
    return got


@pytest.mark.parametrize("endpoint", ["store", "elastic"])
def test_a_stranger_is_refused_and_logged_and_the_job_finishes(tmp_path, endpoint):
    args = ["-np", "2", "--transport", "torch"] if endpoint == "store" else ["--elastic", "-np", "2"]
    t0 = time.monotonic()
    proc = start_job([*args, "--", sys.executable, worker("stranger_worker.py"), str(tmp_path)])
    try:
        addr, port = wait_ports(tmp_path, proc)[endpoint]
        got = be_a_stranger(addr, int(port))
    finally:
        (tmp_path / "go").touch()
    job = finish_job(proc, TIMEOUT, t0)
    assert job.returncode == 0, job.stderr[-4000:]
    assert not any("ACCEPTED" in g for g in got), got
    assert [json.loads((tmp_path / f"res-{r}.json").read_text())["ok"] for r in range(2)] == [True, True]
    refusals = [ln for ln in job.stderr.splitlines() if "refused a connection from ('127.0.0.1'" in ln]
    assert len(refusals) == 1, job.stderr[-4000:]  # logged, once per address


def test_a_malformed_secret_is_a_clear_launch_error(tmp_path):
    t0 = time.monotonic()
    proc = start_job(["-np", "2", "--", sys.executable, "-c", "pass"], {"RINGLET_JOB_SECRET": "not-hex"})
    job = finish_job(proc, 60, t0)
    assert job.returncode == 2 and "RINGLET_JOB_SECRET is not hexadecimal" in job.stderr, job.stderr
