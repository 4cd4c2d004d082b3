"""ZeroOptimizer stages 1-3 with real processes (shared memory on 2 and 4 ranks, Gloo on 3): the
parameters of plain training on the concatenated batch and of ringlet's DDP (1e-6), an LR scheduler, a
parameter without gradient, a non-elementwise optimizer on whole parameters, uneven shards, a bfloat16
model, the loss scaler's agreed skip, and checkpoint round trips. The cases live in ``zero_worker.py``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["equivalence", "ddp", "variants", "bf16", "scaler", "checkpoint", "stage3"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("shm", 2), ("torch", 3), ("shm", 4)))
def test_zero_optimizer(transport, world, tmp_path):
    ranks = run_worker("zero_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: {ranks[0]['numbers']}")
