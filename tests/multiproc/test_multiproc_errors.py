"""Failure behaviour with real processes and the launcher's contract.

- mismatched shapes/dtypes/ops across ranks raise MismatchError on every rank, and the next op works;
- a rank that leaves mid-job makes the survivors raise PeerError or CollectiveTimeout (no hang);
- RINGLET_*/HOROVOD_* variables are right in every rank, also with emulated hosts (--hosts); for torch
  one "host" is started through ``--rsh`` (a stand-in remote shell that runs the command here), which
  exercises the multi-host path end to end;
- a failing rank fails the job with ITS exit status and its traceback on stderr;
- SIGINT to ``ringlet run`` reaches every rank and the job ends with 128 + SIGINT.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from mp_jobs import (finish_job, job_report, load_rank_files, require_transport, run_job, start_job,
                     transport_params, worker)

DEAD_PEER_TIMEOUT = 6  # RINGLET_TIMEOUT of the error jobs: survivors that cannot see the death wait this long
# Two emulated hosts. For torch the second is "remote": not this machine by name, so ringlet run starts
# its node launcher through --rsh. Expected per rank: (local_rank, local_size, cross_rank, cross_size).
HOSTS = {"torch": "127.0.0.1:2,nodeb.invalid:1", "mpi": "127.0.0.1:2,127.0.0.2:1", "shm": None}
LAYOUT = {0: (0, 2, 0, 2), 1: (1, 2, 0, 1), 2: (0, 1, 1, 2)}
FAKE_RSH = "#!/bin/sh\n# stand-in remote shell: drop the host name, run the command line here\nshift\nexec /bin/sh -c \"$*\"\n"


def _checks_params():
    return [pytest.param(p.values[0], HOSTS[p.values[0]], id=p.id, marks=p.marks) for p in transport_params()]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport, hosts", _checks_params())
def test_env_mismatch_and_dead_peer(transport, hosts, tmp_path):
    require_transport(transport)
    out = tmp_path / "checks.json"
    where = ["--hosts", hosts] if hosts else ["-np", "3"]
    if transport == "torch":
        rsh = tmp_path / "fake_rsh"
        rsh.write_text(FAKE_RSH)
        os.chmod(rsh, 0o755)
        where += ["--rsh", str(rsh)]
    job = run_job([*where, "--transport", transport, "--", sys.executable, worker("errors_worker.py"), "checks",
                   str(out)], timeout=240, env={"RINGLET_TIMEOUT": str(DEAD_PEER_TIMEOUT)})
    ranks = load_rank_files(out, 3)
    assert all(s is not None for s in ranks), job_report(job)
    problems = []
    for s in ranks:
        r = s["rank"]
        problems += [f"rank {r}: {p}" for p in s["env problems"]]
        if hosts:
            lr, ls, cr, cs = LAYOUT[r]
            host = [h.split(":")[0] for h in hosts.split(",")][0 if r < 2 else 1]
            want = {"HOROVOD_RANK": r, "HOROVOD_SIZE": 3, "HOROVOD_LOCAL_RANK": lr, "HOROVOD_LOCAL_SIZE": ls,
                    "HOROVOD_CROSS_RANK": cr, "HOROVOD_CROSS_SIZE": cs, "HOROVOD_HOSTNAME": host}
            for k, v in want.items():
                if s["env"].get(k) != str(v):
                    problems.append(f"rank {r}: {k}={s['env'].get(k)!r}, want {v!r}")
        for name in ("shape", "dtype", "op", "allgather trailing dims", "broadcast root", "collective kind"):
            if s["mismatch"][name] != "MismatchError":
                problems.append(f"rank {r}: {name} mismatch gave {s['mismatch'][name]}")
            if s["mismatch"][name + " then"] != "ok":
                problems.append(f"rank {r}: the op after the {name} mismatch: {s['mismatch'][name + ' then']}")
        if s["role"] == "survivor" and s["dead peer"] not in ("PeerError", "CollectiveTimeout"):
            problems.append(f"rank {r}: after rank 2 left: {s['dead peer']}")
    roles = sorted(s["role"] for s in ranks)
    assert roles == ["survivor", "survivor", "victim"], roles
    assert not problems, "\n".join(problems) + "\n" + job_report(job)
    # Under MPI, Hydra aborts the job once ranks leave without MPI_Finalize: any status is fine there.
    if transport != "mpi":
        assert job.returncode == 0, job_report(job)


@pytest.mark.multiproc
@pytest.mark.parametrize("transport", [pytest.param("torch"), pytest.param("mpi", marks=pytest.mark.mpi)])
def test_failing_rank_sets_exit_status(transport, tmp_path):
    require_transport(transport)
    job = run_job(["-np", "3", "--transport", transport, "--", sys.executable, worker("errors_worker.py"), "exit",
                   str(tmp_path / "exit.json")], timeout=180, env={"RINGLET_TIMEOUT": "20"})
    assert job.returncode == 17, job_report(job)
    assert "RuntimeError: boom from rank 1" in job.stderr, job_report(job)
    # The launcher's last words: which rank failed first, then where the flight records are, with the verdict.
    last = job.stderr.splitlines()[-2:]
    assert "rank 1" in last[0] and "failed first" in last[0], job_report(job)
    assert last[1].startswith("ringlet run: flight records in "), job_report(job)


@pytest.mark.multiproc
def test_sigint_reaches_every_rank(tmp_path):
    t0 = time.monotonic()
    proc = start_job(["-np", "2", "--", sys.executable, worker("errors_worker.py"), "sleep", str(tmp_path / "s.json")])
    ready = [tmp_path / f"s.json.ready{r}" for r in range(2)]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in ready) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    job = finish_job(proc, 60, t0)
    assert all(p.exists() for p in ready), job_report(job)
    assert job.returncode == 128 + signal.SIGINT, job_report(job)
    for r in range(2):
        assert f"rank {r} got KeyboardInterrupt" in job.stdout, job_report(job)
