"""A rank's place in a job (Horovod's definitions of local and cross ranks) and the variables that
describe it: what the launcher's per-rank shim (:mod:`ringlet.launch.shim`) exports and what an elastic
worker (:mod:`ringlet.elastic.rendezvous`) exports again when its place changes.

Standard library only and free of package-relative imports: the shim runs as a script, before torch,
and loads this file by its path.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    from_hosts: bool = False  # hostname comes from an explicit --hosts entry


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """``"h1:4,h2:2"`` → ``[("h1", 4), ("h2", 2)]``; a bare name has one slot."""
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        if not name:
            raise ValueError(f"Bad host entry {item!r}: expected NAME:SLOTS.")
        try:
            n = int(slots)
        except ValueError:
            raise ValueError(f"Bad host entry {item!r}: slots must be an integer.") from None
        if n < 1:
            raise ValueError(f"Bad host entry {item!r}: slots must be at least 1.")
        out.append((name, n))
    if not out:
        raise ValueError(f"No hosts in {spec!r}.")
    return out


def layout_from_hosts(rank: int, size: int, hosts: list[tuple[str, int]]) -> Layout:
    """Rank layout when ranks fill ``hosts`` in order (block placement, as elastic and Hydra do)."""
    total = sum(n for _, n in hosts)
    if total != size:
        raise ValueError(f"The host list has {total} slots but the job has {size} ranks.")
    start = 0
    for h, (name, n) in enumerate(hosts):
        if rank < start + n:
            lr = rank - start
            cross_rank = sum(1 for _, m in hosts[:h] if m > lr)
            cross_size = sum(1 for _, m in hosts if m > lr)
            return Layout(rank, size, lr, n, cross_rank, cross_size, name, True)
        start += n
    raise ValueError(f"Rank {rank} is outside the host list ({total} slots).")


def _int(env, *names: str) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            return int(v)
    return None


def derive_layout(env=None) -> Layout:
    """The layout of this process from its launcher's environment (see the module docstring)."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:  # torchrun / elastic
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK") or 0
        local_size = _int(env, "LOCAL_WORLD_SIZE") or size
        cross_rank = _int(env, "GROUP_RANK")
        cross_size = _int(env, "GROUP_WORLD_SIZE")
        if cross_rank is None or cross_size is None:
            cross_rank, cross_size = rank // local_size, max(1, size // local_size)
    elif _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") is not None:  # mpiexec
        rank = _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
        size = _int(env, "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
        if size is None:
            raise RuntimeError("Cannot find the MPI world size in the environment (PMI_SIZE/OMPI_COMM_WORLD_SIZE).")
        local_rank = _int(env, "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = _int(env, "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            local_rank, local_size = rank, size
        # Homogeneous block placement; --hosts gives the exact layout below.
        cross_rank, cross_size = rank // local_size, max(1, size // local_size)
        host = env.get("PMI_HOSTNAME") or host
    else:
        rank, size, local_rank, local_size, cross_rank, cross_size = 0, 1, 0, 1, 0, 1
    hosts = env.get("RINGLET_RUN_HOSTS")
    if hosts:
        return layout_from_hosts(rank, size, parse_hosts(hosts))
    return Layout(rank, size, local_rank, local_size, cross_rank, cross_size, host)


def layout_env(lay: Layout, env=None) -> dict[str, str]:
    """The variables the shim exports for ``lay`` (Horovod compatibility included)."""
    env = os.environ if env is None else env
    out = {}
    for prefix in ("RINGLET", "HOROVOD"):
        out[f"{prefix}_RANK"] = str(lay.rank)
        out[f"{prefix}_SIZE"] = str(lay.size)
        out[f"{prefix}_LOCAL_RANK"] = str(lay.local_rank)
        out[f"{prefix}_LOCAL_SIZE"] = str(lay.local_size)
        out[f"{prefix}_CROSS_RANK"] = str(lay.cross_rank)
        out[f"{prefix}_CROSS_SIZE"] = str(lay.cross_size)
    out["HOROVOD_HOSTNAME"] = lay.hostname
    if lay.from_hosts and not env.get("RINGLET_HOSTNAME"):
        # ringlet groups ranks into hosts by this name: --hosts entries are hosts even on one machine.
        out["RINGLET_HOSTNAME"] = lay.hostname
    return out
