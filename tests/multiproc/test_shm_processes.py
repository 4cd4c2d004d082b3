"""The shared-memory transport between real processes: correctness over both data paths, FIFO order,
a peer that dies, nothing left in /dev/shm, and a torchrun launch through ``ShmTransport.from_env``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mp_jobs import worker

from ringlet.transport.shm import ShmTransport

pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(not ShmTransport.available(), reason="needs Linux x86 with /dev/shm")]

WORKER = Path(worker("shm_worker.py"))
PYTHON = sys.executable
MODES = {  # small rings so that large messages stream through them in many pieces
    "eager": {"RINGLET_SHM_CMA": "0", "RINGLET_SHM_RING_BYTES": "65536"},
    "cma": {"RINGLET_SHM_CMA": "1", "RINGLET_SHM_RING_BYTES": "65536", "RINGLET_SHM_CMA_MIN_BYTES": "4096"},
    "spin": {"RINGLET_SHM_SPIN_US": "200"},  # default ring and threshold, pollers that spin
}


def launch(scenario: str, p: int, tmp_path: Path, env_extra: dict | None = None, timeout: float = 120):
    """Run ``p`` worker processes; return (exit codes, parsed result lines by rank)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    store = tmp_path / f"store-{scenario}"
    procs = [subprocess.Popen([PYTHON, str(WORKER), scenario, str(r), str(p), str(store)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(p)]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = {}
    for r, (out, err) in enumerate(outs):
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if lines:
            results[r] = json.loads(lines[-1])
        elif procs[r].returncode == 0:
            raise AssertionError(f"rank {r} printed no result:\n{err[-3000:]}")
    codes = [proc.returncode for proc in procs]
    for r, code in enumerate(codes):
        if code not in (0, 17):
            raise AssertionError(f"rank {r} exited with {code}:\n{outs[r][1][-3000:]}")
    return codes, results


def no_segments_left(results: dict) -> None:
    for r, res in results.items():
        assert not res["path_exists_after_start"], f"rank {r} kept its segment linked after bootstrap"
        assert not os.path.exists(res["path"])


@pytest.mark.parametrize("p, mode", [(2, "cma"), (3, "eager"), (4, "spin")])
def test_exchange_fifo_allreduce(p, mode, tmp_path):
    """All pairs exchange every size on interleaved tags (and big messages all at once), rank 0's
    messages arrive in posting order per tag, and the public all-reduce runs on top."""
    codes, results = launch("suite", p, tmp_path, MODES[mode])
    assert codes == [0] * p
    assert [results[r]["bad"] for r in range(p)] == [[]] * p
    assert all(results[r]["order"] == list(range(40)) for r in range(1, p))
    assert all(all(results[r]["ok"]) for r in range(p))
    no_segments_left(results)


def test_dead_peer_raises_peer_error(tmp_path):
    """The victim exits without closing; the survivors get the message it sent before dying, then a
    PeerError naming it (well before their 60 s timeout), and its segment is gone."""
    codes, results = launch("dead_peer", 3, tmp_path, MODES["cma"])
    assert codes == [0, 0, 17]
    for r in (0, 1):
        res = results[r]
        assert res["error"] == "PeerError", res
        assert "rank 2 died" in res["message"]
        assert res["first"]
    no_segments_left(results)


@pytest.mark.parametrize("p, spin", [(2, "sleep"), (4, "default")])  # each wait mode, each size once
def test_mailbox_small_allreduce(p, spin, tmp_path):
    """The one-round small all-reduce (engine.small over the shm mailbox) between real processes: 300
    exact rounds, the same MismatchError on every rank, and PeerError when a rank dies mid-round; with
    the default spin, and with none (every wait sleeps, so the last publisher must post each sleeper)."""
    codes, results = launch("mailbox", p, tmp_path, {"RINGLET_SHM_MAILBOX_SPIN_US": "0"} if spin == "sleep" else None)
    assert codes == [0] * (p - 1) + [17]
    for r in range(p - 1):
        res = results[r]
        assert all(res["ok"]) and len(res["ok"]) == 301, res["ok"]
        assert "shape" in res["mismatch"] and res["mismatch"] == results[0]["mismatch"]
        assert res["error"] is not None and f"rank {p - 1}" in res["error"], res
    no_segments_left(results)


@pytest.mark.parametrize("mode", ["eager", "cma"])
def test_dead_receiver_fails_the_send(mode, tmp_path):
    codes, results = launch("dead_receiver", 2, tmp_path, MODES[mode])
    assert codes == [0, 17]
    assert results[0]["error"] == "PeerError", results[0]
    assert "rank 1 died" in results[0]["message"]
    no_segments_left(results)


TORCHRUN_SCRIPT = """
import torch, ringlet
ringlet.init("shm")
r, p = ringlet.rank(), ringlet.size()
out = ringlet.allreduce(torch.full((1 << 18,), float(r + 1)), op="sum", algorithm="ring")
assert ringlet._rt().transport.name == "shm"
assert torch.equal(out, torch.full((1 << 18,), float(p * (p + 1) // 2))), out[:4]
ringlet.shutdown()
import os
os.write(1, f"OK {r}\\n".encode())  # one write: two ranks share the pipe
"""


def test_torchrun_launch_with_from_env(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, RINGLET_TRANSPORT="shm")
    proc = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("OK")) == ["OK 0", "OK 1"]


def test_own_store_without_torchrun(tmp_path):
    """Without torchrun's agent store, rank 0 hosts one on RINGLET_SHM_PORT (default MASTER_PORT + 1)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="1", RINGLET_SHM_PORT=str(port), RINGLET_TRANSPORT="shm")
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([PYTHON, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
