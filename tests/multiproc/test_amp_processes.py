"""Mixed precision with real processes (Gloo on 3 ranks, shared memory on 2): ringlet's GradScaler
agrees on overflows across ranks, MasterWeights keeps float32 masters of a bfloat16/float16 model,
autocast trains under ringlet's DDP, and a checkpoint continues identically. The cases live in
``amp_worker.py``; this test launches the job and fails with every failing case of every rank."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["inf_on_one_rank", "master_weights", "autocast_bf16", "checkpoint", "coordinated"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2)))
def test_mixed_precision(transport, world, tmp_path):
    ranks = run_worker("amp_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: {ranks[0]['numbers']}")
