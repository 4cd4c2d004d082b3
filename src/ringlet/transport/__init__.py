"""Transports move bytes. ``create`` picks one by name or from how the process was launched."""
from __future__ import annotations

import os
import sys

from .base import COMPLETED, Capabilities, Handle, HostInfo, Transport, WireCount, WireCounter

NAMES = ("torch", "mpi", "shm", "inproc")


def detect() -> str:
    """The transport implied by the environment: torchrun/ringlet run → torch, mpiexec → mpi; a process
    whose torch.distributed default group already exists (made by the script or by a framework such as
    Ray Train, with any init method) → torch, which adopts that group, never a world of one."""
    env = os.environ
    if env.get("RINGLET_TRANSPORT"):
        return env["RINGLET_TRANSPORT"].strip().lower()
    if "WORLD_SIZE" in env and "RANK" in env and "MASTER_ADDR" in env:
        return "torch"
    if any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")):
        return "mpi"
    dist = sys.modules.get("torch.distributed")  # not imported: no default group can exist
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "torch"
    return "single"


def create(name: str | None = None, *, join=None) -> Transport:
    """Instantiate the transport ``name`` (``torch``, ``mpi``, ``shm``) for this process. ``join``: how
    the torch transport's default group finds its ranks instead of env:// (see
    :func:`ringlet.transport.torchdist.init_default_group`)."""
    name = (name or detect()).strip().lower()
    if name == "single":
        from .inproc import InprocWorld

        return InprocWorld(1).transport(0)
    if name == "torch":
        from .torchdist import TorchTransport

        return TorchTransport.from_env(join=join)
    if name == "mpi":
        from .mpi import MPITransport

        return MPITransport.from_env()
    if name == "shm":
        from .shm import ShmTransport

        return ShmTransport.from_env()
    if name == "inproc":
        raise ValueError("The inproc transport runs ranks as threads; build it with InprocWorld(size).")
    raise ValueError(f"Unknown transport {name!r}; choose one of {', '.join(NAMES)}.")


__all__ = ["COMPLETED", "Capabilities", "Handle", "HostInfo", "Transport", "WireCount", "WireCounter", "create",
           "detect", "NAMES"]
