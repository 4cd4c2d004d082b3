"""Slurm's environment read without Slurm: host lists, task counts, the port formula, which launcher wins,
and every way a step's variables can be wrong (each a clear error naming the variable)."""
from __future__ import annotations

import re

import pytest

from ringlet.slurm import NodeListError, SlurmEnvError, expand_counts, expand_nodelist, in_step, read_step
from ringlet.slurm.step import TaskEnvError, rendezvous_port


@pytest.mark.parametrize("text, names", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a[1-2].cluster.org,b", ["a1.cluster.org", "a2.cluster.org", "b"]),
    ("login, node7", ["login", "node7"]),
    ("[1-2]x", ["1x", "2x"]),
    ("c[0]", ["c0"]),
    ("localhost", ["localhost"]),
    ("gpu-[1,3-4]-ib", ["gpu-1-ib", "gpu-3-ib", "gpu-4-ib"]),
])
def test_nodelist_expands(text, names):
    assert expand_nodelist(text) == names


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("   ", "empty"), ("node[1-3", "never closed"), ("node1-3]", "without '['"),
    ("n[[1]]", "nested"), ("n[3-1]", "backwards"), ("n[a-b]", "not a number"), ("n[1-]", "not a number"),
    ("n[]", "empty brackets"), ("a,,b", "empty entry"), ("a,", "empty entry"), ("n[1-99999999]", "more than"),
    ("n[1,,2]", "not a number"),
])
def test_nodelist_errors(text, says):
    with pytest.raises(NodeListError, match=re.escape(says)):
        expand_nodelist(text)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("3,2,1", [3, 2, 1]),
])
def test_counts_expand(text, counts):
    assert expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "2(3)", "x2", "0", "2(x0)", "1,,2", "-1"])
def test_counts_errors(text):
    with pytest.raises(NodeListError):
        expand_counts(text)


def test_port_formula():
    assert rendezvous_port(0, 0) == 12000
    assert rendezvous_port(1234, 0) == 12000 + (1234 * 32) % 20000
    ports = {rendezvous_port(j, s) for j in range(100, 600) for s in range(4)}
    assert len(ports) == 500 * 4  # steps of a job and consecutive jobs never share a port
    assert all(12000 <= p < 32000 for p in ports)


def step_env(rank=0, size=4, nodes="n[1-2]", counts="2(x2)", **extra):
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size),
           "SLURM_LOCALID": str(rank % 2), "SLURM_NODEID": str(rank // 2), "SLURM_STEP_NODELIST": nodes,
           "SLURM_STEP_TASKS_PER_NODE": counts}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def test_read_step_layout():
    s = read_step(step_env(rank=3))
    assert (s.rank, s.size, s.local_rank, s.local_size, s.node, s.addr) == (3, 4, 1, 2, "n2", "n1")
    assert (s.cross_rank, s.cross_size, s.port, s.timeout) == (1, 2, rendezvous_port(77, 3), 60.0)
    uneven = read_step(step_env(rank=4, size=5, nodes="a,b", counts="3,2", SLURM_LOCALID="1", SLURM_NODEID="1"))
    assert (uneven.local_size, uneven.cross_rank, uneven.cross_size) == (2, 1, 2)
    over = read_step(step_env(RINGLET_SLURM_ADDR="127.0.0.1", RINGLET_SLURM_PORT="4242", RINGLET_SLURM_TIMEOUT="3"))
    assert (over.addr, over.port, over.timeout) == ("127.0.0.1", 4242, 3.0)
    old_names = {"SLURM_JOBID": "5", "SLURM_STEPID": "0", "SLURM_PROCID": "1", "SLURM_NPROCS": "2", "SLURM_LOCALID": "0",
                 "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "x[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert read_step(old_names).node == "x2"


@pytest.mark.parametrize("env, wins", [
    (step_env(), True),
    (step_env(size=1, counts="1,0"), False),                         # one task: nothing to form
    (step_env(SLURM_STEP_ID=None), False),                           # a batch script inside sbatch -n 4
    (step_env(SLURM_STEP_ID="4294967294"), False),                   # the batch step's id
    (step_env(SLURM_STEP_ID="4294967290"), False),                   # the interactive step
    (step_env(RANK="0", WORLD_SIZE="4"), False),                     # torchrun / ringlet run inside srun
    (step_env(TORCHELASTIC_RUN_ID="x"), False),
    (step_env(OMPI_COMM_WORLD_SIZE="4"), False),                     # mpiexec
    (step_env(PMI_RANK="0"), False),                                 # srun --mpi=pmi2
    (step_env(PMIX_RANK="0"), False),                                # srun --mpi=pmix
    (step_env(RINGLET_ELASTIC="1"), False),
    (step_env(MASTER_ADDR="elsewhere"), True),                       # a stray MASTER_ADDR is no launcher
    (step_env(SLURM_NTASKS="four"), True),                           # malformed: read_step says why
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NTASKS": "4"}, False),  # salloc shell
    ({}, False),
])
def test_detection_precedence(env, wins):
    assert in_step(env) is wins


@pytest.mark.parametrize("change, says, task_only", [
    ({"SLURM_NTASKS": "5"}, "task count mismatch: the step has 5 tasks", False),
    ({"SLURM_STEP_NODELIST": "n[1-2"}, "SLURM_STEP_NODELIST: host list 'n\\[1-2': '\\[' is never closed", False),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "gives 3 nodes but SLURM_STEP_NODELIST='n\\[1-2\\]' has 2", False),
    ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE: task count list", False),
    ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3", False),
    ({"SLURM_PROCID": None}, "without SLURM_PROCID", False),
    ({"SLURM_STEP_NODELIST": None}, "without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST", False),
    ({"SLURM_NTASKS": "four"}, "SLURM_NTASKS='four' is not an integer", False),
    ({"RINGLET_SLURM_PORT": "70000"}, "RINGLET_SLURM_PORT='70000' is not a TCP port", False),
    ({"RINGLET_SLURM_TIMEOUT": "0"}, "must be positive", False),
    ({"RINGLET_SLURM_TIMEOUT": "soon"}, "not a number of seconds", False),
    ({"SLURM_PROCID": "9"}, "SLURM_PROCID=9 is outside the step's 4 tasks", True),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is outside the step's 2 nodes", True),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is outside the 2 tasks of node n1", True),
    ({"SLURM_NODEID": "1"}, "task 0 runs on node n2, not on the first node n1", True),
])
def test_read_step_errors(change, says, task_only):
    env = step_env(rank=0)
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(SlurmEnvError, match=says) as got:
        read_step(env)
    assert isinstance(got.value, TaskEnvError) is task_only


def test_prepare_needs_the_secret(monkeypatch):
    from ringlet.slurm import rendezvous

    env = step_env()
    with pytest.raises(SlurmEnvError, match="RINGLET_JOB_SECRET is not set.*export RINGLET_JOB_SECRET"):
        rendezvous.prepare(env=env)
    env["RINGLET_JOB_SECRET"] = "abcd"
    with pytest.raises(SlurmEnvError, match="at least 16 are needed"):
        rendezvous.prepare(env=env)
    assert rendezvous.prepare(env=step_env(RANK="0", WORLD_SIZE="4")) is None   # torchrun's world wins
    assert rendezvous.prepare("mpi", env=env) is None                           # MPI forms its own
    assert "RANK" not in env


ALLOC = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_TASKS_PER_NODE": "2(x3)"}


@pytest.mark.parametrize("env, np, hosts", [
    (ALLOC, None, [("c1", 2), ("c2", 2), ("c3", 2)]),
    (ALLOC, 4, [("c1", 2), ("c2", 1), ("c3", 1)]),
    (ALLOC, 2, [("c1", 1), ("c2", 1)]),
    ({**ALLOC, "SLURM_TASKS_PER_NODE": ""}, None, [("c1", 1), ("c2", 1), ("c3", 1)]),
    ({**ALLOC, "SLURM_STEP_ID": "4294967294"}, None, [("c1", 2), ("c2", 2), ("c3", 2)]),  # the batch step
    ({**ALLOC, "SLURM_STEP_ID": "0"}, None, None),                                       # inside srun: not ours
    ({**ALLOC, "SLURM_JOB_NODELIST": "c1", "SLURM_TASKS_PER_NODE": "4"}, None, None),    # one node: ringlet run alone
    ({"SLURM_JOB_ID": "9"}, None, None),
    ({}, 3, None),
])
def test_allocation_hosts(env, np, hosts):
    from ringlet.slurm.allocation import allocation_hosts

    assert allocation_hosts(np, env) == hosts


def test_allocation_errors_and_placement(monkeypatch):
    from ringlet.launch import api
    from ringlet.launch.config import LaunchError
    from ringlet.slurm.allocation import allocation_hosts, srun_rsh

    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE='2\\(x2\\)' gives 2 nodes but SLURM_JOB_NODELIST has 3"):
        allocation_hosts(None, {**ALLOC, "SLURM_TASKS_PER_NODE": "2(x2)"})
    for k, v in ALLOC.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    assert api._placement(None, None, None, None, None, False) == ([("c1", 2), ("c2", 2), ("c3", 2)], srun_rsh())
    assert api._placement(3, None, "ssh -tt", None, None, False) == ([("c1", 1), ("c2", 1), ("c3", 1)], "ssh -tt")
    assert api._placement(None, "h:2", None, None, None, False) == ("h:2", "ssh")       # --hosts wins
    assert api._placement(None, None, None, "mpi", None, False) == (None, "ssh")       # mpiexec has its own
    monkeypatch.setenv("SLURM_JOB_NODELIST", "c[1-")
    with pytest.raises(LaunchError, match="Slurm allocation 9: host list"):
        api._placement(None, None, None, None, None, False)
