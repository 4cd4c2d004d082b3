"""``srun python train.py`` without Slurm: four local processes get exactly the variables a step of 4 tasks
on 2 nodes (2 each) gives its tasks, and ``ringlet.init()`` forms the world from them alone (rendezvous on
127.0.0.1 through RINGLET_SLURM_ADDR). One job trains; one runs every failure mode, each of which must
end with a clear error on every task, and those that need no timeout well before it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from mp_jobs import kill_tree, worker

pytestmark = pytest.mark.multiproc

TASKS, PER_NODE = 4, 2
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                 "RINGLET_TRANSPORT", "RINGLET_HOSTNAME", "RINGLET_RUN_HOSTS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                 "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS", "RINGLET_ELASTIC")


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that are free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


def srun_env(task: int, port: int) -> dict:
    """What ``srun -N 2 -n 4`` (job 4242, step 0) exports to task ``task``, plus the job's secret."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    env.update({
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_PROCID": str(task), "SLURM_NTASKS": str(TASKS), "SLURM_NPROCS": str(TASKS),
        "SLURM_STEP_NUM_TASKS": str(TASKS), "SLURM_LOCALID": str(task % PER_NODE),
        "SLURM_NODEID": str(task // PER_NODE), "SLURM_JOB_NODELIST": "slurmtest[1-2]",
        "SLURM_STEP_NODELIST": "slurmtest[1-2]", "SLURM_NODELIST": "slurmtest[1-2]", "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": f"{PER_NODE}(x2)",
        "SLURM_STEP_TASKS_PER_NODE": f"{PER_NODE}(x2)", "SLURMD_NODENAME": f"slurmtest{task // PER_NODE + 1}",
        "RINGLET_SLURM_ADDR": "127.0.0.1", "RINGLET_SLURM_PORT": str(port),
        "RINGLET_JOB_SECRET": "5a" * 32, "RINGLET_HOSTNAME": "the-submitting-host", "OMP_NUM_THREADS": "1",
    })
    return env


def run_tasks(tmp_path, mode: str, limit: float = 180.0) -> dict[int, dict]:
    port = free_ports(16)
    procs = [subprocess.Popen([sys.executable, worker("slurm_worker.py"), str(tmp_path), mode],
                              env=srun_env(t, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for t in range(TASKS)]
    deadline = time.monotonic() + limit
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_tree(q)
            pytest.fail(f"the tasks of {mode} did not finish in {limit}s")
    for t, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"task {t} failed:\n{out[-6000:]}"
    return {t: json.loads((tmp_path / f"task-{t}.json").read_text()) for t in range(TASKS)}


def test_srun_environment_trains(tmp_path):
    got = run_tasks(tmp_path, "train")
    for t, r in got.items():
        assert (r["rank"], r["size"], r["local_rank"], r["local_size"]) == (t, TASKS, t % PER_NODE, PER_NODE)
        assert (r["cross_rank"], r["cross_size"]) == (t // PER_NODE, 2)
        assert r["hostname"] == f"slurmtest{t // PER_NODE + 1}"  # the node, not the submitting shell's name
        assert (r["transport"], r["torch_group"], r["horovod_rank"]) == ("torch", True, str(t))
        assert r["sum"] == [10.0]
        assert r["grad_same"] and r["grad_mean"] == pytest.approx(4 * 2.5)
        assert r["again"] == [4.0, 4.0, 4.0]


def test_srun_environment_failures(tmp_path):
    got = run_tasks(tmp_path, "failures")
    expect = {  # scenario -> {task: what its error says} (None: every task that took part)
        "procid": {2: "SLURM_PROCID=7 is outside the step's 4 tasks", None: "another task stopped the rendezvous: "
                   "task 7: SLURM_PROCID=7 is outside"},
        "duplicate": {None: "two tasks have SLURM_PROCID=1"},
        "disagree": {3: "but this task is in 'step 4242.0: 4 tasks on slurmtest1,slurmtest2,slurmtest3",
                     None: "another task stopped the rendezvous: task 3 is in"},
        "one_count": {1: "task count mismatch: the step has 5 tasks", None: "another task stopped the rendezvous: "
                      "task 1: task count mismatch"},
        "count": {None: "task count mismatch: the step has 5 tasks"},
        "nodelist": {None: "SLURM_STEP_NODELIST: host list 'slurmtest[1-2': '[' is never closed"},
        "missing": {None: "1 of the step's 4 tasks (ranks 3) did not reach the rendezvous at 127.0.0.1:"},
        "no_host": {None: "the rendezvous host 127.0.0.1:"},
        "secret": {1: "did not accept this task's RINGLET_JOB_SECRET", None: "(ranks 1) did not reach the rendezvous"},
    }
    for name, says in expect.items():
        for t in range(TASKS):
            if (name, t) in (("missing", 3), ("no_host", 0)):
                assert name not in got[t]
                continue
            r = got[t][name]
            assert r["error"] is not None, f"{name}: task {t} formed a world"
            assert r["error"].startswith(f"ringlet.init under Slurm (task ")
            assert says.get(t, says[None]) in r["error"], f"{name}, task {t}: {r['error']}"
            if name in ("missing", "no_host", "secret"):
                assert "within 3s" in r["error"] or t == 1
            else:  # a 60 s timeout that nobody waits for: the reason travels at once
                assert r["seconds"] < 30, f"{name}: task {t} took {r['seconds']:.1f}s"
    assert "did not answer within 3s" in got[1]["no_host"]["error"]
