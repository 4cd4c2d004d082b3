"""The environment ``ringlet run`` gives its ranks: transport, host list, threads, malloc tuning."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import RunConfig
from .hosts import hosts_spec

# glibc malloc thresholds for the ranks (see allocator_env).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
_USER_ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                        "MALLOC_ARENA_MAX", "MALLOC_CONF", "TCMALLOC_RELEASE_RATE")


def allocator_env(environ) -> dict:
    """The glibc malloc settings ``ringlet run`` gives its ranks, given the launcher's ``environ``.

    A training step frees and allocates the same large tensors (activations, gradients, workspaces)
    every step. glibc serves blocks above its mmap threshold with fresh mappings and gives the top of
    its heap back to the OS above its trim threshold; both thresholds start at 128 KiB and grow only as
    large blocks come and go, so whether a rank keeps its memory depends on the order of its first
    allocations. Fixed thresholds (32 MiB, glibc's largest mmap threshold; 128 MiB) keep the memory in
    the process, as CPU training launchers do when they swap in jemalloc or tcmalloc (the measurements
    are in the README). Nothing is set when the user chose an allocator or malloc settings (any of
    ``_USER_ALLOCATOR_VARS``, malloc tunables in ``GLIBC_TUNABLES``, a malloc library in
    ``LD_PRELOAD``), when ``RINGLET_MALLOC_TUNING=0``, or off Linux.
    """
    if not sys.platform.startswith("linux") or environ.get("RINGLET_MALLOC_TUNING", "1") == "0":
        return {}
    if any(k in environ for k in _USER_ALLOCATOR_VARS) or "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return {}
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc
        return {}
    return dict(MALLOC_ENV)


BOOT_DIR = str(Path(__file__).with_name("boot"))  # its sitecustomize: env:// on the authenticated store


def worker_env(cfg: RunConfig, hosts) -> dict:
    """Variables added to every rank's environment (beside the launcher's own, which ranks inherit)."""
    # the agent store the ranks find is ringlet's authenticated one, not torchrun's (store/torch_store.py)
    env = {"RINGLET_TRANSPORT": cfg.transport, "RINGLET_AGENT_STORE": "ringlet"}
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *path])
    if hosts is not None:
        env["RINGLET_RUN_HOSTS"] = hosts_spec(hosts)
    # Each rank is one process among several on few cores: one intra-op thread, as torchrun does.
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    env.update(allocator_env(os.environ))
    env.update(cfg.extra_env)
    return env
