"""Functions the Ray tests run on the executor's workers (importable there: on the workers' PYTHONPATH)."""
from __future__ import annotations

import os
import signal
import time

import torch


def world_facts():
    """Each rank's view after ``ringlet.init()``: rank, size, local rank and size, the sum of rank+1, the
    transport, whether the job has a secret; the Horovod facade agrees on rank and size."""
    import ringlet
    import ringlet.torch as hvd

    hvd.init()
    total = ringlet.allreduce(torch.tensor([float(ringlet.rank() + 1)]), op="sum").item()
    facts = {"rank": ringlet.rank(), "size": ringlet.size(), "local_rank": ringlet.local_rank(),
             "local_size": ringlet.local_size(), "sum": total, "hvd": (hvd.rank(), hvd.size()),
             "transport": ringlet.collectives.runtime().transport.name,
             "secret": bool(os.environ.get("RINGLET_JOB_SECRET")), "monitor": ringlet.collectives.runtime().monitor
             is not None, "extra": os.environ.get("RINGLET_TEST_EXTRA")}
    hvd.shutdown()
    return facts


def fail_on(rank: int, how: str, steps: int = 2000):
    """All-reduce in a loop; ``rank`` ends its process with SIGKILL (``how="kill"``) or raises
    ``ValueError`` (``"raise"``) after a few steps. The others stop with ringlet's ``PeerError``."""
    import ringlet

    ringlet.init()
    t = torch.ones(1024)
    for step in range(steps):
        if ringlet.rank() == rank and step == 5:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"rank {rank} gives up at step {step}")
        ringlet.allreduce(t)
        time.sleep(0.01)
    return "finished"
