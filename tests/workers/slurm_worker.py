"""A task started the way ``srun`` starts one (tests/multiproc/test_slurm_processes.py gives it exactly a
step's variables). Writes ``<out>/task-<SLURM_PROCID>.json``.

    slurm_worker.py OUT train       ringlet.init() from the Slurm variables: layout, all-reduce, a DDP step,
                                    shutdown and init again
    slurm_worker.py OUT failures    the failure scenarios of :data:`SCENARIOS` one after another, each through
                                    the rendezvous with its own port; records each one's error and seconds
"""
from __future__ import annotations

import json
import os
import sys
import time

OUT = sys.argv[1]
TASK = int(os.environ["SLURM_PROCID"])


def write(result: dict) -> None:
    with open(os.path.join(OUT, f"task-{TASK}.json"), "w") as f:
        json.dump(result, f)


def train() -> None:
    import torch
    import torch.distributed as dist

    import ringlet
    import ringlet.torch

    ringlet.init()
    got = {"rank": ringlet.rank(), "size": ringlet.size(), "local_rank": ringlet.local_rank(),
           "local_size": ringlet.local_size(), "cross_rank": ringlet.cross_rank(), "cross_size": ringlet.cross_size(),
           "transport": ringlet.collectives.runtime().transport.name, "torch_group": dist.is_initialized(),
           "horovod_rank": os.environ.get("HOROVOD_RANK"), "hostname": os.environ.get("RINGLET_HOSTNAME")}
    got["sum"] = ringlet.allreduce(torch.full((1000,), float(ringlet.rank() + 1)), op="sum").unique().tolist()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    ddp = ringlet.torch.DistributedDataParallel(model)
    x = torch.full((4, 8), float(ringlet.rank() + 1))
    ddp(x).sum().backward()
    grad = model.weight.grad.clone()
    got["grad_same"] = bool(torch.equal(ringlet.allreduce(grad, op="max"), ringlet.allreduce(grad, op="min")))
    got["grad_mean"] = float(grad[0, 0])  # d(sum)/dw[0,0] averaged over ranks: mean of 4 * (rank + 1)
    ringlet.shutdown()
    ringlet.init()  # a second world over the same rendezvous
    got["again"] = ringlet.allreduce(torch.ones(3), op="sum").tolist()
    ringlet.shutdown()
    write(got)


# name -> (per-task variable changes, RINGLET_SLURM_TIMEOUT, tasks that sit it out)
SCENARIOS = {
    "procid": ({2: {"SLURM_PROCID": "7"}}, 60, ()),
    "duplicate": ({3: {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"}}, 60, ()),
    "disagree": ({3: {"SLURM_STEP_NODELIST": "slurmtest[1-3]", "SLURM_STEP_TASKS_PER_NODE": "2,1,1",
                      "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "2", "SLURM_LOCALID": "0"}}, 60, ()),
    "one_count": ({1: {"SLURM_STEP_NUM_TASKS": "5"}}, 60, ()),
    "count": ({t: {"SLURM_STEP_NUM_TASKS": "5"} for t in range(4)}, 60, ()),
    "nodelist": ({t: {"SLURM_STEP_NODELIST": "slurmtest[1-2"} for t in range(4)}, 60, ()),
    "missing": ({}, 3, (3,)),
    "no_host": ({}, 3, (0,)),
    "secret": ({1: {"RINGLET_JOB_SECRET": "ab" * 32}}, 3, ()),
}


def barrier(name: str, tasks: int = 4) -> None:
    """Every task starts scenario ``name`` at the same time, whatever the previous one cost it."""
    open(os.path.join(OUT, f"at-{name}-{TASK}"), "w").close()
    while not all(os.path.exists(os.path.join(OUT, f"at-{name}-{t}")) for t in range(tasks)):
        time.sleep(0.02)


def failures() -> None:
    from ringlet.slurm import SlurmEnvError
    from ringlet.slurm import rendezvous

    base_port = int(os.environ["RINGLET_SLURM_PORT"])
    got = {}
    for i, (name, (changes, timeout, absent)) in enumerate(SCENARIOS.items()):
        barrier(name)
        if TASK in absent:
            continue
        env = {**os.environ, **changes.get(TASK, {}), "RINGLET_SLURM_PORT": str(base_port + 1 + i),
               "RINGLET_SLURM_TIMEOUT": str(timeout)}
        t0 = time.monotonic()
        try:
            rendezvous.prepare(env=env)
            got[name] = {"error": None}
        except SlurmEnvError as exc:
            got[name] = {"error": str(exc)}
        got[name]["seconds"] = time.monotonic() - t0
    write(got)


if __name__ == "__main__":
    {"train": train, "failures": failures}[sys.argv[2]]()
