"""One rank of the metrics job: a small DDP model trained step after step, plus a few all-gathers and
broadcasts, until the file STOP exists (or 90 s pass), so that a test scrapes the job's metrics while it
runs.

    ringlet run -np 2 --metrics-port P -- python tests/workers/metrics_worker.py STOP

Rank 0 sets a straggler score for every rank (``ringlet.metrics.set_straggler_score``); each rank prints
``steps N`` at the end.
"""
from __future__ import annotations

import os
import sys
import time

import torch

import ringlet
import ringlet.metrics
from ringlet.torch.training.ddp import DistributedDataParallel


def main(stop: str) -> None:
    rt = ringlet.init()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 4)), bucket_cap_mb=0.004)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rt.rank == 0:
        for r in range(rt.size):
            ringlet.metrics.set_straggler_score(r, rt.hostnames[r], 1.0 + r)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    steps, deadline = 0, time.monotonic() + 90
    while time.monotonic() < deadline:
        if steps % 10 == 0 and os.path.exists(stop):  # every rank sees it within the same 10 steps:
            flag = torch.tensor([1.0])                   # agree on when to stop
        else:
            flag = torch.tensor([0.0])
        if steps % 10 == 0 and ringlet.allreduce(flag, op="max").item() > 0:
            break
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ringlet.allgather(torch.full((2,), float(rt.rank)))
        ringlet.broadcast(torch.zeros(8), root_rank=0)
        steps += 1
        time.sleep(0.01)
    ringlet.barrier()
    print(f"steps {steps}", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
