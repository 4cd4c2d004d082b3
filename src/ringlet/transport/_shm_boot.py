"""Start-up of the shared-memory transport: the store, the segments, the one-host check, CMA probing.

Every rank creates its segment under a random name, publishes it (with its pid, host and a probe
address) in a ``torch.distributed`` store, maps every peer's segment, checks whether it may read
each peer's memory with ``process_vm_readv``, and waits until all ranks have done so. Then each rank
unlinks its own segment: from there on the memory lives only as long as the mappings, so a crashed
job leaves nothing in ``/dev/shm``. If start-up fails (a peer died, a timeout), every rank unlinks
every segment it knows of, since a dead peer cannot remove its own.
"""
from __future__ import annotations

import ctypes
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

from ..types import CollectiveTimeout, PeerError, RingletError
from . import _shm_ring as R


@dataclass
class Mapped:
    """What start-up hands the transport: every rank's segment (own at ``rank``), pids, liveness."""

    segments: list
    pids: list[int]
    watcher: R.Watcher
    path: str
    probe: object = field(default=None, repr=False)  # kept alive until peers stopped probing it


def store_from_env(env, rank: int, size: int, timeout: float, instance: int):
    """The store torchrun's workers share, under a key prefix unique to this job, attempt and transport.

    torchrun's agent hosts a store on MASTER_ADDR:MASTER_PORT and tells workers to use it
    (``TORCHELASTIC_USE_AGENT_STORE``); other launchers get a store hosted by rank 0 on
    ``RINGLET_SHM_PORT`` (default MASTER_PORT + 1, so a Gloo group on MASTER_PORT can coexist).
    """
    from torch.distributed import PrefixStore, TCPStore

    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError("ShmTransport.from_env needs MASTER_ADDR and MASTER_PORT (set by torchrun)")
    wait = timedelta(seconds=timeout)
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    where = int(port) if agent else int(env.get("RINGLET_SHM_PORT") or int(port) + 1)
    try:
        if agent:
            from ..store.torch_store import connect_agent_store

            store = connect_agent_store(addr, where, timeout=timeout, environ=env)
        else:
            store = TCPStore(addr, where, size, rank == 0, timeout=wait, wait_for_workers=False)
    except RuntimeError as exc:
        hint = "" if agent else " (set RINGLET_SHM_PORT to choose another port)"
        raise PeerError(f"rank {rank}: cannot reach the shm start-up store at {addr}:{where}{hint}: {exc}") from exc
    prefix = (f"ringlet/shm/{env.get('TORCHELASTIC_RUN_ID', 'none')}/"
              f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{instance}")
    return PrefixStore(prefix, store)


def start(rank: int, size: int, store, capacity: int, cma: bool, timeout: float) -> Mapped:
    """Create, exchange and map the segments of a world of ``size`` ranks (``size > 1``)."""
    lib = R.libc()
    deadline = time.monotonic() + timeout
    path = f"/dev/shm/ringlet-{secrets.token_hex(8)}-{rank}"
    mapped = Mapped([None] * size, [os.getpid()] * size, R.Watcher(), path)
    known = [path]
    try:
        seg = R.Segment.create(path, R.segment_bytes(size, capacity))
        mapped.segments[rank] = seg
        w = seg.words
        w[R.H_VERSION // 8], w[R.H_SIZE // 8], w[R.H_CAP // 8] = R.VERSION, size, capacity
        w[R.H_PID // 8], w[R.H_CLOSED // 8] = os.getpid(), 0
        if lib.sem_init(seg.addr + R.H_SEM, 1, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed on a shared-memory semaphore")
        w[R.H_MAGIC // 8] = R.MAGIC
        mapped.probe = probe = ctypes.c_uint64(secrets.randbits(63))
        info = {"path": path, "pid": os.getpid(), "start": R.process_start_time(os.getpid()),
                "host": socket.gethostname(), "boot": R.boot_id(), "probe": ctypes.addressof(probe),
                "probe_value": probe.value}
        store.set(f"info/{rank}", json.dumps(info))
        infos = [info if r == rank else json.loads(_get(store, f"info/{r}", deadline)) for r in range(size)]
        known = [i["path"] for i in infos]
        _check_one_host(rank, infos)
        for r, i in enumerate(infos):
            if r != rank:
                mapped.segments[r] = _attach(rank, r, i["path"], size)
                mapped.pids[r] = i["pid"]
                mapped.watcher.watch(r, i["pid"], i["start"])
                if cma:
                    val = ctypes.c_uint64(0)
                    err = lib.read_remote(i["pid"], ctypes.addressof(val), i["probe"], 8)
                    seg.mm[R.H_CMA_OK + r] = int(err == 0 and val.value == i["probe_value"])

        def check() -> None:
            dead = mapped.watcher.dead()
            if dead:
                raise PeerError(f"rank {rank}: rank {min(dead)} died while the shm transport was starting")

        _barrier(store, "attached", size, deadline, check)
    except BaseException as exc:
        for p in known:
            R.unlink_quietly(p)
        release(mapped)
        if isinstance(exc, RuntimeError) and not isinstance(exc, RingletError):
            raise PeerError(f"rank {rank}: shm start-up failed talking to the store: {exc}") from exc
        raise
    R.unlink_quietly(path)
    return mapped


def release(mapped: Mapped) -> None:
    mapped.watcher.close()
    for i, s in enumerate(mapped.segments):
        if s is not None:
            s.close()
        mapped.segments[i] = None
    mapped.probe = None


def _attach(me: int, r: int, path: str, size: int) -> R.Segment:
    try:
        seg = R.Segment.attach(path)
    except FileNotFoundError:
        raise ValueError(f"rank {me}: cannot open rank {r}'s shared-memory segment {path}: all ranks of the "
                         f"shm transport must run on one host and share /dev/shm") from None
    if (seg.words[R.H_MAGIC // 8] != R.MAGIC or seg.words[R.H_SIZE // 8] != size
            or seg.words[R.H_VERSION // 8] != R.VERSION):
        seg.close()
        raise RingletError(f"rank {me}: rank {r}'s segment {path} has an unexpected layout")
    return seg


def _check_one_host(rank: int, infos: list[dict]) -> None:
    mine = infos[rank]
    others = [(r, i["host"]) for r, i in enumerate(infos) if (i["host"], i["boot"]) != (mine["host"], mine["boot"])]
    if others:
        listing = ", ".join(f"rank {r} on {h}" for r, h in others[:8])
        raise ValueError(f"The shm transport needs all ranks on one host; rank {rank} runs on {mine['host']} "
                         f"but {listing}. Use the torch or mpi transport across hosts.")


def _get(store, key: str, deadline: float) -> bytes:
    pause = 0.0005
    while not store.check([key]):
        if time.monotonic() >= deadline:
            raise CollectiveTimeout(f"shm start-up: timed out waiting for {key!r} in the store")
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return store.get(key)


def _barrier(store, name: str, size: int, deadline: float, check) -> None:
    if store.add(name, 1) == size:
        store.set(f"{name}/done", b"1")
    pause = 0.0005
    while not store.check([f"{name}/done"]):
        check()
        if time.monotonic() >= deadline:
            raise CollectiveTimeout(f"shm start-up: timed out in barrier {name!r}")
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
