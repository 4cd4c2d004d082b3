"""What ``ringlet run`` gives a job by default, with real processes: on one host the shm transport with
torch.distributed's default group beside it, and a store that listens on loopback only; a job over
several host entries on this machine (torch transport) and an ``--elastic`` job (the driver's store) keep
their store on loopback too."""
from __future__ import annotations

import sys

import pytest

from launcher_worker import listening_addresses
from mp_jobs import job_report, load_rank_files, require_transport, run_job, worker

pytestmark = pytest.mark.multiproc


def _check_store(rec: dict, job) -> None:
    assert rec["listening"], job_report(job)
    assert all(a.startswith("127.0.0.1:") for a in rec["listening"]), (rec["listening"], job_report(job))
    assert rec["loopback_reachable"], job_report(job)
    if rec["outside"] is not None:  # a machine without a non-loopback address has nothing more to show
        assert rec["outside_reachable"] is False, (rec, job_report(job))


@pytest.mark.parametrize("where, transport", [(["-np", "2"], "shm"),
                                              (["--hosts", "localhost:1,127.0.0.1:1"], "torch"),
                                              (["--elastic", "-np", "2"], "torch")],
                         ids=["one-host", "two-entries", "elastic"])
def test_default_transport_and_loopback_store(where, transport, tmp_path):
    require_transport(transport)
    out = tmp_path / "probe"
    job = run_job([*where, "--", sys.executable, worker("launcher_worker.py"), str(out)], timeout=240,
                  env={"RINGLET_TIMEOUT": "60"})
    assert job.returncode == 0, job_report(job)
    ranks = load_rank_files(out, 2)
    assert all(r is not None for r in ranks), job_report(job)
    for r in ranks:
        assert r["env_transport"] == transport and r["transport"] == transport, (r, job_report(job))
        assert r["ringlet_sum"] == [3.0] * 4 and r["dist_sum"] == [3.0] * 4, r
        assert r["master_addr"] == "127.0.0.1", r
        assert r["dist_after_shutdown"] is False, r  # ringlet.shutdown() destroyed the group ringlet.init made
    _check_store(ranks[0], job)


def test_explicit_torch_transport_still_chosen(tmp_path):
    out = tmp_path / "probe"
    job = run_job(["-np", "2", "--transport", "torch", "--", sys.executable, worker("launcher_worker.py"), str(out)],
                  timeout=240, env={"RINGLET_TIMEOUT": "60"})
    assert job.returncode == 0, job_report(job)
    ranks = load_rank_files(out, 2)
    assert [r["transport"] for r in ranks] == ["torch", "torch"], job_report(job)
    _check_store(ranks[0], job)


def test_listening_addresses_reads_this_process_socket():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert listening_addresses(port) == [f"127.0.0.1:{port}"]
