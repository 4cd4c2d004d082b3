"""Synchronising less often with real processes (Gloo on 3 ranks, shared memory on 2): post-local SGD
and DiLoCo leave bitwise identical parameters on every rank after every synchronisation, k = 1 and
H = 1 (outer lr 1, momentum 0) equal parameter averaging after every step, DiLoCo's outer Nesterov step
matches a simulation, bad arguments raise ``ValueError``. The cases live in ``local_sgd_worker.py``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["bad_arguments", "local_sgd_k1", "local_sgd_schedule", "diloco_h1", "diloco_nesterov", "coordinated"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2)))
def test_local_sgd_and_diloco(transport, world, tmp_path):
    ranks = run_worker("local_sgd_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: {ranks[0]['numbers']}")
