"""``ringlet.torch.Pipeline`` and point-to-point with real processes: one job of 4 ranks per transport (Gloo
through torch, shared memory), each running every case of ``pipeline_worker.py``: 2 stages × 2 replicas
and 4 stages × 1, GPipe and 1F1B, against the single-process model; fp16 compression and ZeRO-1 across
the replicas; a point-to-point round trip beside a queued all-reduce. The 2 × 1 and 4 × 2 layouts run in
worlds of 2 and 8 with ``make test-slow``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker
from mp_jobs import transport_world_params

CASES = ["p2p_beside_allreduce", "equiv_2x2_gpipe", "equiv_2x2_1f1b", "equiv_4x1_gpipe", "equiv_4x1_1f1b",
         "fp16_2x2", "zero1_2x2"]


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 4), ("shm", 4)))
def test_pipeline_cases(transport, world, tmp_path):
    ranks = run_worker("pipeline_worker.py", transport, world, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
    print(f"{transport} x {world}: measured bubbles {ranks[0]['numbers']}")


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 8])
def test_pipeline_layouts_in_worlds_of_2_and_8(world, tmp_path):
    stages = {2: 2, 8: 4}[world]
    want = ["p2p_beside_allreduce"] + [f"equiv_{stages}x{world // stages}_{s}" for s in ("gpipe", "1f1b")]
    for s in run_worker("pipeline_worker.py", "torch", world, tmp_path):
        assert s["passed"] == want, s
