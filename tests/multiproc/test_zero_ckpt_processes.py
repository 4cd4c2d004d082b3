"""ZeRO checkpoints with real processes (``ringlet run``, Gloo): saved by N ranks, loaded by M ranks in a
second job, training continues bit for bit as without the interruption (the reference sharder), and
within 1e-6 with ``ZeroOptimizer`` from 4 to 2 and 2 to 3 ranks across stages; a rank killed with SIGKILL during
an asynchronous save leaves the previous checkpoint loadable. Worker: ``zero_ckpt_worker.py``."""
from __future__ import annotations

import sys

import pytest
import torch
from case_jobs import run_worker
from mp_jobs import job_report, run_job, worker

from zero_ckpt_models import make, sharded

from ringlet.torch.training.zero import checkpoint as zckpt


def assert_consolidated_equal(a, b) -> None:
    x, y = zckpt.consolidate(a), zckpt.consolidate(b)
    for part in ("model", "master"):
        assert list(x[part]) == list(y[part])
        for k in x[part]:
            assert torch.equal(x[part][k], y[part][k]), (part, k)
    assert x["optimizer"]["param_groups"] == y["optimizer"]["param_groups"]
    for name, state in x["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(y["optimizer"]["state"][name][k])), (name, k)
    assert x["extra"] == y["extra"] == {"step": 8}


@pytest.mark.multiproc
# Shrinking here; growing (and shrinking again) with the real ZeroOptimizer in the next test.
@pytest.mark.parametrize("n,m", [(3, 2)])
def test_save_n_load_m_continues_identically(n, m, tmp_path):
    folder = tmp_path / "ckpts"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ranks = run_worker("zero_ckpt_worker.py", "torch", n, tmp_path / "a", args=("first", str(folder)))
    print(f"{n} ranks: {ranks[0]['numbers']}")
    run_worker("zero_ckpt_worker.py", "torch", m, tmp_path / "b", args=("resume", str(folder)))
    assert zckpt.consolidate(folder / "step-5")["meta"]["world"] == n
    assert zckpt.consolidate(folder / "resumed-8")["meta"]["world"] == m
    assert_consolidated_equal(folder / "ref-8", folder / "resumed-8")


@pytest.mark.multiproc
@pytest.mark.parametrize("n,s0,m,s1", [(4, 2, 2, 1), (2, 1, 3, 3)])
def test_zero_optimizer_resumes_on_another_world_and_stage(n, s0, m, s1, tmp_path):
    folder = tmp_path / "ckpts"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run_worker("zero_ckpt_worker.py", "torch", n, tmp_path / "a", args=("real_first", str(folder), str(s0)))
    run_worker("zero_ckpt_worker.py", "torch", m, tmp_path / "b", args=("real_resume", str(folder), str(s1)))
    ref, got = zckpt.consolidate(folder / "ref-8"), zckpt.consolidate(folder / "resumed-8")
    assert (ref["meta"]["world"], got["meta"]["world"]) == (n, m)
    assert list(ref["model"]) == list(got["model"])
    for k in ref["model"]:
        assert torch.allclose(ref["model"][k], got["model"][k], rtol=0, atol=1e-6), k
    for name, state in ref["optimizer"]["state"].items():
        for k, v in state.items():
            mine = torch.as_tensor(got["optimizer"]["state"][name][k]).double()
            assert torch.allclose(torch.as_tensor(v).double(), mine, rtol=0, atol=1e-6), (name, k)


@pytest.mark.multiproc
def test_rank_killed_during_async_save_keeps_previous_checkpoint(tmp_path):
    folder = tmp_path / "ckpts"
    job = run_job(["-np", "2", "--transport", "torch", "--", sys.executable, worker("zero_ckpt_worker.py"),
                   str(tmp_path / "out"), "kill", str(folder)], timeout=180, env={"RINGLET_TIMEOUT": "30"})
    assert job.returncode != 0, job_report(job)
    assert zckpt.is_complete(folder / "good"), job_report(job)
    assert not zckpt.is_complete(folder / "bad")
    assert list((folder / "bad").glob(".rank-00001-*.tmp")), "rank 1 was not killed while writing its data file"
    assert not list((folder / "bad").glob("rank-00001*"))
    assert zckpt.latest(folder) == folder / "good"
    net, zero = sharded(1, 0, seed=3, steps=0)
    assert zckpt.load(folder / "good", zero, net) == {"step": 3}
    expected, _ = make()
    for k, v in expected.state_dict().items():
        assert torch.equal(net.state_dict()[k], v), k
