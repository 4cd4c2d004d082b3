"""The flight recorder and the stall inspector with real processes (tests/workers/flight_worker.py).

- A rank that skips one all-reduce and stays away 14 s: with ``RINGLET_STALL_WARN_S=8`` ranks 0 and 1
  log, while it is away, that rank 2 has not arrived and is outside any collective; the launcher keeps
  the job's records (ranks 0 and 1 at their failure, rank 2 at its shutdown) and prints the verdict of
  ``ringlet diagnose``, which says the same on the folder.
- One rank in a broadcast while the others all-reduce, a shape mismatch, and a rank that dies
  (``os._exit``) in a DDP training loop: each job's verdict, as the launcher prints it and as
  :func:`ringlet.diagnose.analyse` gives it on the kept folder.
- The skipped call in a job over two host entries: every host's records reach the first host's launcher.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from mp_jobs import RINGLET, job_report, load_rank_files, run_job, worker

VERDICT_LINE = r"ringlet run: flight records in (\S+) \(ringlet diagnose \S+\): (.*)"


def _verdict(job, case: str) -> tuple[str, str]:
    """The launcher's verdict line of ``job``: (flight folder, verdict)."""
    m = re.search(VERDICT_LINE, job.stderr)
    assert m, f"{case}: no verdict line\n{job_report(job)}"
    return m.group(1), m.group(2)


@pytest.mark.multiproc
def test_skipped_allreduce_is_named(tmp_path):
    out = tmp_path / "out.json"
    job = run_job(["-np", "3", "--", sys.executable, worker("flight_worker.py"), "skip", str(out)], timeout=150,
                  env={"RINGLET_TIMEOUT": "60", "RINGLET_STALL_WARN_S": "8", "RINGLET_TEST_AWAY_S": "14"})
    fr, launcher_verdict = _verdict(job, "skip")
    ranks = load_rank_files(out, 3)
    assert all(s is not None for s in ranks), job_report(job)
    assert ranks[2]["outcome"] == "ok"
    assert all(s["outcome"] in ("PeerError", "CollectiveTimeout") for s in ranks[:2]), ranks
    # The stall inspector, while rank 2 is away: ranks 0 and 1 name it (one report each, at 8 s).
    logs = job.stdout + job.stderr
    for r in (0, 1):
        warn = re.search(rf"ringlet stall: rank {r} has waited \S+ s in an all-reduce on the world group seq "
                         rf"(\d+) \(shape \[4\], float32, flight_worker.py:\d+\), started [^;]*; rank 2 has not "
                         rf"arrived: it is outside any collective since [^;]*; its last was an all-reduce on "
                         rf"the world group seq (\d+) .*Next report at 16 s \(RINGLET_STALL_WARN_S=8\)", logs)
        assert warn, f"rank {r} logged no stall report naming rank 2\n{job_report(job)}"
        assert int(warn.group(2)) == int(warn.group(1)) - 1
    res = subprocess.run(RINGLET + ["diagnose", fr], capture_output=True, text=True, timeout=60)
    shutil.rmtree(fr, ignore_errors=True)
    verdict = res.stdout.splitlines()[0] if res.stdout else ""
    assert res.returncode == 1, res.stdout + res.stderr
    assert verdict.startswith("rank 2 made 2 all-reduces on the world group where ranks 0 and 1 made 3; "
                              "ranks 0 and 1 failed in the third (shape [4], float32, flight_worker.py:"), res.stdout
    assert launcher_verdict == verdict, job_report(job)


VERDICTS = {
    "kind": r"rank 2 is in a broadcast \(shape \[4\], float32, flight_worker.py:\d+\) where ranks 0 and 1 are in "
            r"an all-reduce \(shape \[4\], float32, flight_worker.py:\d+\), the world group seq \d+$",
    "shape": r"rank 2 called an all-reduce with shape \[5\], float32, flight_worker.py:\d+ where ranks 0 and 1 "
             r"used shape \[4\], float32, flight_worker.py:\d+, the world group seq \d+$",
    # The survivors failed (PeerError naming rank 1) or were stopped by the launcher (SIGTERM) inside the
    # step's all-reduce; the call site is the user's backward() line, under DDP's hooks.
    "die": r"rank 1 left no flight record \(died or was killed before writing one\); ranks 0 and 2 (failed|wait) "
           r"in an all-reduce on the world group seq \d+ \(shape \[\d+\], float32, flight_worker.py:\d+\)",
}


@pytest.mark.multiproc
@pytest.mark.parametrize("case", sorted(VERDICTS))
def test_verdicts_of_failed_jobs(case, tmp_path):
    from ringlet.diagnose import analyse, load

    job = run_job(["-np", "3", "--", sys.executable, worker("flight_worker.py"), case, str(tmp_path / "o.json")],
                  timeout=120, env={"RINGLET_TIMEOUT": "30"})
    assert job.returncode != 0, job_report(job)
    fr, launcher_verdict = _verdict(job, case)
    try:
        verdict = analyse(load(fr))
    finally:
        shutil.rmtree(fr, ignore_errors=True)
    assert verdict.sentence == launcher_verdict
    assert re.match(VERDICTS[case], verdict.sentence), f"{case}: {verdict.sentence}\n{job_report(job)}"
    assert verdict.kind == {"kind": "kind", "shape": "shape", "die": "missing"}[case]


@pytest.mark.multiproc
def test_records_of_a_multi_host_job_are_collected_on_its_first_host(tmp_path):
    """Two host entries on this machine (a node launcher each): every host's records reach node 0's
    launcher through the job's store, and its verdict is the single-host job's."""
    out = tmp_path / "out.json"
    job = run_job(["--hosts", "localhost:2,127.0.0.1:1", "--", sys.executable, worker("flight_worker.py"), "skip",
                   str(out)], timeout=180, env={"RINGLET_TIMEOUT": "5"})
    fr, verdict = _verdict(job, "multi-host skip")
    files = sorted(p.name for p in pathlib.Path(fr).glob("rank-*.json"))
    shutil.rmtree(fr, ignore_errors=True)
    assert files == ["rank-0.json", "rank-1.json", "rank-2.json"], job_report(job)
    assert verdict.startswith("rank 2 made 2 all-reduces on the world group where ranks 0 and 1 made 3"), \
        job_report(job)
