"""Priority scheduling and the overlap of the next forward in ringlet's DDP with real processes (Gloo on 3
ranks, shared memory on 2): the synchronous DDP's parameters for SGD with momentum and Adam, pieces
front layers first, accumulation, eval forwards, buffers, the timeline's forward overlap, and the refusal
under the coordinator. The cases live in ``priority_worker.py``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["sgd_momentum", "adam", "front_first", "no_sync_and_eval", "buffers", "timeline", "coordinated"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2)))
def test_priority_scheduling(transport, world, tmp_path):
    ranks = run_worker("priority_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: {ranks[0]['numbers']}")
