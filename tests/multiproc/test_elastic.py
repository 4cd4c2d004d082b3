"""``ringlet run --elastic`` with real processes: a worker dies and the survivors finish from the last commit;
a replacement joins; too few survivors fail the job; a death inside a ring all-reduce releases every survivor;
a member that never joins is stopped after the elastic timeout; a member that falls silent (SIGSTOP) is
named and stopped; the same script under plain ``ringlet run``;
the digits example.

The worker (elastic_worker.py) logs, per rank, each batch it commits (its own sample indices) and writes
its final parameters. "Every sample of an epoch exactly once" is checked on the union of those logs over
every worker that ever ran, the dead one included: a batch trained but not committed before a failure is
rolled back (not logged) and re-split over the survivors.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from mp_jobs import job_report, run_job, worker

pytestmark = pytest.mark.multiproc

JOB_TIMEOUT = 240  # seconds; each job takes well under a minute here
WORKER = worker("elastic_worker.py")
# A survivor that cannot see a death still stops waiting after RINGLET_TIMEOUT (the last resort).
ENV = {"RINGLET_TIMEOUT": "30"}


def elastic_job(tmp_path: Path, run_args: list[str], env: dict, *worker_args: str):
    return run_job([*run_args, "--", sys.executable, WORKER, "--out", str(tmp_path), *worker_args],
                   timeout=JOB_TIMEOUT, env={**ENV, **env})


def logs(out: Path) -> dict[str, list[dict]]:
    """Committed batches per worker id."""
    return {p.stem[1:]: [json.loads(line) for line in p.read_text().splitlines()] for p in out.glob("w*.jsonl")}


def finals(out: Path) -> dict[str, dict]:
    return {p.stem.split("-w")[1]: json.loads(p.read_text()) for p in out.glob("final-w*.json")}


def counts(out: Path, epoch: int) -> collections.Counter:
    return collections.Counter(i for recs in logs(out).values() for r in recs if r["epoch"] == epoch
                               for i in r["indices"])


def assert_identical_params(fin: dict[str, dict], job) -> None:
    params = [f["params"] for f in fin.values()]
    assert all(p == params[0] for p in params), job_report(job)


def assert_survivors_0_1_finished(out: Path, job) -> None:
    """Workers 0 and 1 went on as generation 1, ended with the same parameters, and every sample of
    both epochs was committed exactly once."""
    assert "generation 1: 2 rank(s) (workers 0,1)" in job.stderr, job_report(job)
    fin = finals(out)
    assert sorted(fin) == ["0", "1"], job_report(job)
    assert_identical_params(fin, job)
    for epoch in (0, 1):
        c = counts(out, epoch)
        assert sorted(c) == list(range(48)) and set(c.values()) == {1}, (epoch, c)


def test_survivors_finish_from_the_last_commit(tmp_path):
    """3 workers, --min-np 2: rank 2 exits 1 at step 4; the two others finish both epochs."""
    job = elastic_job(tmp_path, ["--elastic", "-np", "3", "--min-np", "2", "--elastic-timeout", "60"],
                      {"ELASTIC_KILL": "2:4"})
    assert job.returncode == 0, job_report(job)
    assert "worker 2 (rank 2 of generation 0) exited with status 1" in job.stderr, job_report(job)
    assert "generation 1: 2 rank(s) (workers 0,1)" in job.stderr, job_report(job)
    fin = finals(tmp_path)
    assert sorted(fin) == ["0", "1"], job_report(job)
    assert [(f["rank"], f["size"], f["resets"]) for _, f in sorted(fin.items())] == [(0, 2, [2]), (1, 2, [2])]
    assert_identical_params(fin, job)
    # The dead worker committed steps 1..4 at size 3 (6 samples each); the rest of epoch 0 (24 samples)
    # went to the survivors: 6 steps of 2 x 2, then epoch 1 (48 samples): 12 steps.
    log = logs(tmp_path)
    assert [r["step"] for r in log["2"]] == [1, 2, 3, 4] and {r["size"] for r in log["2"]} == {3}
    assert [r["step"] for r in log["0"]] == list(range(1, 23)) and fin["0"]["step"] == 22
    for epoch in (0, 1):
        c = counts(tmp_path, epoch)
        assert sorted(c) == list(range(48)) and set(c.values()) == {1}, (epoch, c)


def test_replacement_worker_joins(tmp_path):
    """--restarts 1: 3 ranks, rank 2 dies, 2 ranks go on, the replacement joins at a commit: 3 again."""
    samples = 600
    job = elastic_job(tmp_path, ["--elastic", "-np", "3", "--min-np", "2", "--restarts", "1",
                                 "--elastic-timeout", "60"],
                      {"ELASTIC_KILL": "2:2", "ELASTIC_SLOW_BELOW": "3"},
                      "--samples", str(samples), "--epochs", "1")
    assert job.returncode == 0, job_report(job)
    assert "started worker 3 to replace it" in job.stderr, job_report(job)
    assert "generation 1: 2 rank(s) (workers 0,1)" in job.stderr, job_report(job)
    assert "generation 2: 3 rank(s) (workers 0,1,3)" in job.stderr, job_report(job)
    fin = finals(tmp_path)
    assert sorted(fin) == ["0", "1", "3"], job_report(job)
    assert {f["wid"]: f["rank"] for f in fin.values()} == {"0": 0, "1": 1, "3": 2}
    assert all(f["size"] == 3 for f in fin.values())
    assert fin["0"]["resets"] == [2, 3] and fin["3"]["resets"] == []
    assert_identical_params(fin, job)
    sizes = [r["size"] for r in logs(tmp_path)["0"]]
    assert sizes[:2] == [3, 3] and 2 in sizes and sizes[-1] == 3
    c = counts(tmp_path, 0)
    # Every sample at least once; repeats only from padding each split to a multiple of the size.
    assert sorted(c) == list(range(samples)) and sum(c.values()) - samples <= 2 * 3, c


def test_too_few_survivors_fail_the_job_with_the_dead_workers_status(tmp_path):
    job = elastic_job(tmp_path, ["--elastic", "-np", "2", "--min-np", "2", "--elastic-timeout", "60"],
                      {"ELASTIC_KILL": "1:2:3"})
    assert job.returncode == 3, job_report(job)
    assert "fewer than --min-np 2" in job.stderr, job_report(job)
    assert "worker 1 (rank 1) failed first with exit status 3" in job.stderr, job_report(job)


def test_death_inside_a_ring_allreduce_releases_every_survivor(tmp_path):
    """The victim dies while a 64 MiB all-reduce is in the ring: a survivor waiting on the *other*
    survivor (which stopped on the dead peer) must be released too, and both finish."""
    job = elastic_job(tmp_path, ["--elastic", "-np", "3", "--min-np", "2", "--elastic-timeout", "60"],
                      {"ELASTIC_KILL": "2:3", "ELASTIC_KILL_MODE": "allreduce", "RINGLET_ALGORITHM": "ring"})
    assert job.returncode == 0, job_report(job)
    assert_survivors_0_1_finished(tmp_path, job)


def test_a_silent_member_is_named_stopped_and_the_survivors_finish(tmp_path):
    """Rank 2 stops itself (SIGSTOP) at step 3: no connection resets, so only the liveness monitor can
    tell. The survivors raise a PeerError naming it, the driver stops it, and the survivors finish."""
    job = elastic_job(tmp_path, ["--elastic", "-np", "3", "--min-np", "2", "--elastic-timeout", "60"],
                      {"ELASTIC_KILL": "2:3", "ELASTIC_KILL_MODE": "stop", "RINGLET_PEER_TIMEOUT": "4"})
    assert job.returncode == 0, job_report(job)
    assert "rank 2 (host " in job.stderr and "fell silent" in job.stderr, job_report(job)
    assert_survivors_0_1_finished(tmp_path, job)


def test_the_elastic_script_runs_under_plain_ringlet_run(tmp_path):
    job = elastic_job(tmp_path, ["-np", "2"], {})
    assert job.returncode == 0, job_report(job)
    fin = finals(tmp_path)
    assert sorted(f["rank"] for f in fin.values()) == [0, 1] and all(f["resets"] == [] for f in fin.values())
    assert_identical_params(fin, job)
    for epoch in (0, 1):
        c = counts(tmp_path, epoch)
        assert sorted(c) == list(range(48)) and set(c.values()) == {1}


@pytest.mark.parametrize("args, message", [
    (["--elastic", "-np", "2", "--transport", "shm"], "--elastic needs --transport torch"),
    (["--elastic", "-np", "2", "--min-np", "3"], "--min-np must be between 1 and -np"),
    (["--elastic", "-np", "2", "--max-np", "1"], "--max-np must be at least -np"),
])
def test_bad_elastic_options_are_clear_errors(tmp_path, args, message):
    job = run_job([*args, "--", sys.executable, "-c", "pass"], timeout=60)
    assert job.returncode == 2 and message in job.stderr, job_report(job)


def test_digits_example_recovers_from_a_killed_rank():
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("scikit-learn is missing (pip install -e '.[examples]')")
    example = Path(__file__).resolve().parents[2] / "examples" / "train_digits_elastic.py"
    job = run_job(["--elastic", "-np", "3", "--min-np", "2", "--", sys.executable, str(example), "--epochs", "2",
                   "--kill-rank", "2", "--kill-step", "5"], timeout=JOB_TIMEOUT, env=ENV)
    assert job.returncode == 0, job_report(job)
    assert "rank 2: exiting at step 5" in job.stdout and "reset: now 2 ranks, resuming at epoch 0 step 5" in job.stdout
    m = re.search(r"test accuracy: ([\d.]+) \(2 ranks at the end", job.stdout)
    assert m and float(m.group(1)) > 0.5, job_report(job)


STUCK = """
import os, time, torch
import ringlet.torch as hvd
if os.environ["RINGLET_ELASTIC_ID"] == "1":
    time.sleep(300)  # never joins: stuck before init
hvd.init()
print("done", hvd.rank(), hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), flush=True)
"""


def test_a_member_that_never_joins_is_stopped_after_the_elastic_timeout():
    # The timeout covers starting Python and importing torch, which takes several seconds on a loaded machine.
    job = run_job(["--elastic", "-np", "2", "--min-np", "1", "--elastic-timeout", "30", "--",
                   sys.executable, "-c", STUCK], timeout=JOB_TIMEOUT, env=ENV)
    assert job.returncode == 0, job_report(job)
    assert "worker 1 did not join generation 0 within 30s; stopping it" in job.stderr, job_report(job)
    assert "generation 1: 1 rank(s) (workers 0)" in job.stderr and "done 0 1 1.0" in job.stdout, job_report(job)
