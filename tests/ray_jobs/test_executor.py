"""RayExecutor on a local Ray instance: the job its workers form, Horovod's example function, failures."""
from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import ray_fns
from conftest import NO_RAY, ROOT

import ringlet
from ringlet.ray import RayExecutor

pytest.importorskip("ray", reason=NO_RAY)
EPOCHS = 3


@functools.cache
def ringlet_run_accuracy(script: str) -> float:
    """The test accuracy of ``ringlet run -np 2`` of an example (the reference every Ray run must match)."""
    out = subprocess.run([sys.executable, "-m", "ringlet.cli.main", "run", "-np", "2", "--", sys.executable,
                          str(ROOT / "examples" / script), "--epochs", str(EPOCHS)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return float(re.search(r"test accuracy: ([0-9.]+)", out.stdout).group(1))


@pytest.fixture(scope="module")
def executor(ray_cluster):
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2, cpus_per_worker=1)
    ex.start(extra_env_vars={"RINGLET_TEST_EXTRA": "yes"})
    yield ex
    ex.shutdown()


def test_workers_form_one_job(executor):
    assert executor.execute(lambda w: w.rank) == [0, 1]
    assert executor.execute_single(lambda w: w.rank) == 0
    facts = executor.run(ray_fns.world_facts)
    for rank, f in enumerate(facts):
        assert (f["rank"], f["size"], f["sum"], f["hvd"]) == (rank, 2, 3.0, (rank, 2))
        assert (f["local_rank"], f["local_size"]) == (rank, 2)  # one node: both ranks on it
        assert f["transport"] == "torch" and f["secret"] and f["monitor"] and f["extra"] == "yes"
    import ray

    assert [f["rank"] for f in ray.get(executor.run_remote(ray_fns.world_facts))] == [0, 1]


def test_horovod_function_matches_ringlet_run(executor):
    from ray_digits import train_hvd

    accuracies = executor.run(train_hvd, kwargs={"epochs": EPOCHS})
    assert accuracies[0] == accuracies[1]
    assert round(accuracies[0], 4) == ringlet_run_accuracy("train_digits_hvd.py")  # it prints 4 digits


@pytest.mark.parametrize("rank", [1, 0])
def test_killed_actor_gives_peer_error_naming_it(ray_cluster, rank):
    with RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2) as ex:
        ex.start()
        with pytest.raises(ringlet.PeerError) as info:
            ex.run(ray_fns.fail_on, args=(rank, "kill"))
        assert info.value.rank == rank, info.value
        assert f"rank {rank}" in str(info.value)
        with pytest.raises(RuntimeError, match="shutdown"):
            ex.run(ray_fns.world_facts)


def test_raising_rank_is_the_error_and_the_others_stop(ray_cluster):
    with RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2) as ex:
        ex.start()
        with pytest.raises(ValueError, match="rank 1 gives up") as info:
            ex.run(ray_fns.fail_on, args=(1, "raise"))
        assert not any("had not stopped" in n for n in getattr(info.value, "__notes__", []))


def test_bad_requests_are_refused(ray_cluster):
    with pytest.raises(ValueError, match="no GPUs"):
        RayExecutor(num_workers=2, use_gpu=True).start()
    with pytest.raises(ValueError, match="needs 64 CPUs"):
        RayExecutor(num_workers=2, cpus_per_worker=32).start()
    with pytest.raises(NotImplementedError, match="min_workers"):
        RayExecutor(num_workers=2, min_workers=1)
    with pytest.raises(ValueError, match="ssh"):
        RayExecutor.create_settings(ssh_identity_file="~/.ssh/id")
