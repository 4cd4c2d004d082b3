"""ZeRO's reducers with real processes (4 ranks, Gloo and shared memory): the compressed reduce-scatter
(lossless exact, lossy bounded, error feedback over steps) and hierarchical sharding on a 2 x 2 host
layout (exact, replicas bitwise identical, compressed across hosts, unequal hosts refused). The cases
live in ``zero_reduce_worker.py``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker

CASES = ["compressed_lossless", "compressed_lossy", "hierarchical", "hierarchical_compressed", "unequal_hosts", "coordinated"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport", ["torch", "shm"])
def test_zero_reducers(transport, tmp_path):
    ranks = run_worker("zero_reduce_worker.py", transport, 4, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x 4: {ranks[0]['numbers']}")
