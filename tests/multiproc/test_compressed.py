"""Compressed all-reduce with real processes (cases in ``compressed_worker.py``): the core API over every
real transport (Gloo and MPI on 3 ranks, shared memory on 2); the training front ends (stock torch DDP
hooks on Gloo with several buckets, ringlet's DDP, the Horovod optimizer) over the torch transport on 3
ranks."""
from __future__ import annotations

import pytest

from case_jobs import run_worker
from mp_jobs import transport_world_params

JOB_TIMEOUT = 300


def run(tmp_path, world: int, transport: str, mode: str) -> list[dict]:
    return run_worker("compressed_worker.py", transport, world, tmp_path, timeout=JOB_TIMEOUT, args=(mode,))


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", transport_world_params(("torch", 3), ("shm", 2), ("mpi", 3)))
def test_core_compressed_allreduce(transport, world, tmp_path):
    ranks = run(tmp_path, world, transport, "core")
    nums = ranks[0]["numbers"]
    print(f"{transport} x {world}: {len(ranks[0]['passed'])} cases; bytes sent by rank 0 for 4 MiB: "
          f"float32 {nums['wire_plain']}, fp16 {nums['wire_fp16']}")
    assert all(len(s["passed"]) == len(ranks[0]["passed"]) for s in ranks)


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [3])
def test_training_front_ends_with_compression(world, tmp_path):
    ranks = run(tmp_path, world, "torch", "training")
    print(f"world {world}: {ranks[0]['numbers']}")
