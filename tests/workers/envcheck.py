"""Per-rank check of the launcher's environment, shared by the multiproc workers."""
from __future__ import annotations

import os
import socket

import torch

import ringlet


def env_checks(r: int, p: int) -> list[str]:
    problems = []
    env = os.environ
    rt = ringlet.collectives.runtime()
    expect = {
        "RANK": r, "SIZE": p, "LOCAL_RANK": ringlet.local_rank(), "LOCAL_SIZE": ringlet.local_size(),
        "CROSS_RANK": ringlet.cross_rank(), "CROSS_SIZE": ringlet.cross_size(),
    }
    for prefix in ("RINGLET", "HOROVOD"):
        for k, want in expect.items():
            got = env.get(f"{prefix}_{k}")
            if got != str(want):
                problems.append(f"{prefix}_{k}={got!r}, runtime says {want}")
    if env.get("RINGLET_TRANSPORT") != rt.transport.name:
        problems.append(f"RINGLET_TRANSPORT={env.get('RINGLET_TRANSPORT')!r} but the transport is {rt.transport.name}")
    # ringlet run fixes glibc's malloc thresholds unless the job chose its own allocator settings.
    from ringlet.launch.env import MALLOC_ENV, allocator_env

    if allocator_env({k: v for k, v in env.items() if k not in MALLOC_ENV}):
        for k, want in MALLOC_ENV.items():
            if env.get(k) != want:
                problems.append(f"{k}={env.get(k)!r}, ringlet run sets {want!r}")
    host = env.get("HOROVOD_HOSTNAME")
    want_host = env.get("RINGLET_HOSTNAME") or socket.gethostname()
    if host != want_host or rt.hostnames[r] != host:
        problems.append(f"HOROVOD_HOSTNAME={host!r}, expected {want_host!r} (runtime: {rt.hostnames[r]!r})")
    # Every rank saw a different HOROVOD_RANK: together they are 0..p-1.
    ranks = ringlet.allgather(torch.tensor([int(env.get("HOROVOD_RANK", -1))])).tolist()
    if sorted(ranks) != list(range(p)):
        problems.append(f"HOROVOD_RANK over all ranks: {ranks}")
    return problems
