"""Dynamic adjustment in ringlet's DDP with real processes (Gloo on 3 ranks, shared memory on 2) and real
timings: the rounds run, every rank makes the same switches at the same steps, holds the same parameters
and constants, and marks each switch on its timeline. The cases live in ``adaptive_worker.py``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["agreement", "off"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2)))
def test_adjustment_agrees_across_ranks(transport, world, tmp_path):
    ranks = run_worker("adaptive_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    assert all(s["numbers"]["switches"] == ranks[0]["numbers"]["switches"] for s in ranks)
    print(f"{transport} x {world}: {len(ranks[0]['numbers']['switches'])} switches: {ranks[0]['numbers']['switches'][:4]}")
