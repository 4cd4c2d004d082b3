"""The ``env://`` rendezvous of processes that no agent started, bounded and checked.

Some launchers give every process ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and
nothing else: a Kubeflow ``PyTorchJob`` whose pods run the script directly (one process per pod), a
JobSet or Job whose command exports them, a hand-written script. torch's own ``env://`` rendezvous waits
30 minutes for a rank that never comes and then fails on rank 0 only; the others fail later with a
store key in the message. :func:`env_rendezvous` instead:

1. checks the four variables (integers, ``0 <= RANK < WORLD_SIZE``, a port) and raises ``ValueError``
   naming the bad one;
2. opens torch's ``TCPStore`` on ``MASTER_ADDR:MASTER_PORT`` (rank 0 hosts it) within ``timeout``,
   else raises :class:`~ringlet.types.PeerError` naming the address, on every rank that cannot reach it;
3. counts every rank in and waits until all ``WORLD_SIZE`` have arrived. A rank that finds its ``RANK``
   taken, or whose wait runs out, posts why; every rank then raises
   :class:`~ringlet.types.RingletError` with that reason (the missing ranks named), within ``timeout``
   plus a second, never a silent wait. Rank 0, which hosts the store, stays up to two seconds more so
   that the others read the reason before it goes.

Keys live under ``ringlet/env/<generation>/`` so that ``shutdown(); init()`` in the same processes
starts a fresh count (rank 0's store is reused: ``multi_tenant``).
"""
from __future__ import annotations

import datetime
import time

from ..types import PeerError, RingletError

POLL = 0.05       # seconds between looks at the count
LINGER = 2.0      # seconds rank 0 keeps the store up after a failure, for the others to read why
SHOWN = 16        # missing ranks named in a message


def read_env(env) -> tuple[int, int, str, int]:
    """(rank, world size, master address, master port) from ``env``; ``ValueError`` naming what is wrong."""
    def number(name: str) -> int:
        text = str(env.get(name, "")).strip()
        if not text:
            raise ValueError(f"ringlet.init: {name} is not set (the env:// rendezvous needs RANK, WORLD_SIZE, "
                             "MASTER_ADDR and MASTER_PORT).")
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"ringlet.init: {name}={text!r} is not an integer.") from None

    rank, world, port = number("RANK"), number("WORLD_SIZE"), number("MASTER_PORT")
    addr = str(env.get("MASTER_ADDR", "")).strip()
    if not addr:
        raise ValueError("ringlet.init: MASTER_ADDR is not set (the env:// rendezvous needs it).")
    if world < 1:
        raise ValueError(f"ringlet.init: WORLD_SIZE={world} must be at least 1.")
    if not 0 <= rank < world:
        raise ValueError(f"ringlet.init: RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world}).")
    if not 0 < port < 65536:
        raise ValueError(f"ringlet.init: MASTER_PORT={port} is not a TCP port.")
    return rank, world, addr, port


def env_rendezvous(timeout: float, generation: int, env):
    """(store, rank, world size) of the variables in ``env``, every rank present (module docstring)."""
    rank, world, addr, port = read_env(env)
    store = _open(addr, port, rank, world, timeout)
    _arrive(store, rank, world, timeout, f"ringlet/env/{generation}/", f"{addr}:{port}")
    return store, rank, world


def _open(addr: str, port: int, rank: int, world: int, timeout: float):
    from torch.distributed import TCPStore

    try:
        return TCPStore(addr, port, world, rank == 0, timeout=datetime.timedelta(seconds=timeout),
                        wait_for_workers=False, multi_tenant=True)
    except Exception as exc:  # noqa: BLE001 - torch raises DistNetworkError/RuntimeError; named below
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if rank == 0:
            raise PeerError(f"rank 0: cannot host the env:// rendezvous on port {port} (MASTER_PORT): {first}",
                            rank=0) from exc
        raise PeerError(f"rank {rank}: no env:// rendezvous at {addr}:{port} (MASTER_ADDR:MASTER_PORT) within "
                        f"{timeout:.0f}s; rank 0 hosts it: is the process with RANK=0 running, and do MASTER_ADDR "
                        f"and MASTER_PORT name it? ({first})", rank=0) from exc


def _arrive(store, rank: int, world: int, timeout: float, prefix: str, where: str) -> None:
    """Step 3 of the module docstring."""
    if store.add(f"{prefix}rank/{rank}", 1) > 1:
        _post(store, prefix, f"two processes have RANK={rank}: each needs its own RANK below WORLD_SIZE={world}")
    store.add(prefix + "arrived", 1)
    deadline = time.monotonic() + timeout
    try:
        while True:
            arrived = store.add(prefix + "arrived", 0)  # read before the error: a duplicate posts it first
            if store.check([prefix + "error"]):
                break
            if arrived >= world:
                return
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if not store.check([f"{prefix}rank/{r}"])]
                _post(store, prefix, _missing_reason(arrived, world, missing, timeout))
                break
            time.sleep(POLL)
        reason = _leave(store, rank, prefix)
    except Exception as exc:  # noqa: BLE001 - the store (rank 0) went away while this rank waited
        raise PeerError(f"rank {rank}: the env:// rendezvous at {where} (hosted by rank 0) stopped answering "
                        f"before all {world} ranks arrived: {exc}", rank=0) from exc
    raise RingletError(f"rank {rank}: the env:// rendezvous at {where} failed: {reason}")


def _missing_reason(arrived: int, world: int, missing: list[int], timeout: float) -> str:
    named = ", ".join(map(str, missing[:SHOWN])) + (", ..." if len(missing) > SHOWN else "")
    return (f"{arrived} of WORLD_SIZE={world} ranks arrived within {timeout:.0f}s (RINGLET_TIMEOUT); missing "
            f"RANK {named}. WORLD_SIZE must count the processes that start (under a PyTorchJob whose pods run "
            f"the script without torchrun, the pods; see docs/kubernetes.md)")


def _post(store, prefix: str, reason: str) -> None:
    """Make ``reason`` the rendezvous' failure unless another rank posted one first."""
    store.compare_set(prefix + "error", "", reason)


def _leave(store, rank: int, prefix: str) -> str:
    """The posted failure, counted as read; rank 0 (the store's host) first waits up to :data:`LINGER`
    seconds for every rank that arrived to read it."""
    reason = store.get(prefix + "error").decode()
    store.add(prefix + "told", 1)
    if rank == 0:
        end = time.monotonic() + LINGER
        while store.add(prefix + "told", 0) < store.add(prefix + "arrived", 0) and time.monotonic() < end:
            time.sleep(POLL)
    return reason
