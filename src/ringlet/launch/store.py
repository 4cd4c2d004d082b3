"""The job's TCPStore, listening only where the hosts reach it.

torch's ``TCPStore`` server listens on every interface whatever host name it is given; it listens on
a chosen address only when handed a socket already bound there (``master_listen_fd``). Node 0's
elastic agent hosts the job's store, so ``ringlet run`` gives the agent its own rendezvous backend,
:data:`BACKEND`: torch's static TCP rendezvous, except that node 0 binds the store's socket to
``bind_addr`` (a rendezvous config entry) first. A single-host job binds 127.0.0.1, a job over
several hosts the address they reach node 0 at (see :func:`ringlet.launch.hosts.store_bind_address`).
"""
from __future__ import annotations

import datetime
import socket

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

BACKEND = "ringlet-static"
_registered = False
# (address, port) of the job's store once this process's rendezvous has made or found it.
endpoint: tuple[str, int] | None = None
# The store this process hosts (node 0), kept here so that it outlives torch's agent: after a failure
# the launcher holds it a moment longer, for the survivors to read why (see launch.agent).
hosted = None


def listening_socket(addr: str, port: int) -> socket.socket:
    """A TCP socket bound to ``addr:port`` (``port`` 0: one the OS picks) and listening."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def serve_store(addr: str, port: int = 0, *, world_size: int | None = None, wait_for_workers: bool = False,
                timeout: float = 60.0, multi_tenant: bool = False):
    """A ``TCPStore`` server listening on ``addr:port`` only (``addr`` ``""``: every interface); its port
    is ``store.port``."""
    sock = listening_socket(addr, port)
    port = sock.getsockname()[1]
    # The store owns the descriptor from now on (detach: Python must not close it under the server).
    fd = sock.detach()
    return dist.TCPStore(addr or "127.0.0.1", port, world_size, True, datetime.timedelta(seconds=timeout),
                         wait_for_workers=wait_for_workers, multi_tenant=multi_tenant, master_listen_fd=fd)


class BoundStaticRendezvous(StaticTCPRendezvous):
    """torch's static rendezvous whose node 0 hosts the store on ``bind_addr`` only (port 0: the OS
    picks one, and the workers learn it from the rendezvous)."""

    def __init__(self, master_addr: str, master_port: int, rank: int, world_size: int, run_id: str,
                 timeout: int, bind_addr: str):
        super().__init__(master_addr, master_port, rank, world_size, run_id, timeout)
        self.bind_addr = bind_addr

    def get_backend(self) -> str:
        return BACKEND

    def next_rendezvous(self):
        if self._store is None and self.rank == 0:
            self._store = serve_store(self.bind_addr, self.master_port, world_size=self.world_size,
                                      wait_for_workers=True, timeout=self.timeout.total_seconds(), multi_tenant=True)
            self.master_port = self._store.port
        info = super().next_rendezvous()
        global endpoint, hosted
        if self.rank == 0:
            hosted = self._store
        endpoint = (self.master_addr, int(self.master_port))
        return info


def create_handler(params: RendezvousParameters) -> BoundStaticRendezvous:
    """The handler for ``params``: endpoint ``addr:port`` (the address every node connects to), config
    ``rank`` (this node), ``timeout`` (seconds) and ``bind_addr`` (where node 0 listens)."""
    for key in ("rank", "bind_addr"):
        if key not in params.config:
            raise ValueError(f"The {BACKEND} rendezvous needs {key!r} in its configuration.")
    addr, port = parse_rendezvous_endpoint(params.endpoint.strip(), -1)
    if port == -1:
        raise ValueError(f"No port in the rendezvous endpoint {params.endpoint!r}.")
    return BoundStaticRendezvous(addr, port, int(params.config["rank"]), params.max_nodes, params.run_id,
                                 int(params.config.get("timeout", 600)), str(params.config["bind_addr"]))


def register() -> None:
    """Make :data:`BACKEND` known to torch's rendezvous registry (once per process)."""
    global _registered
    if not _registered:
        rendezvous_handler_registry.register(BACKEND, create_handler)
        _registered = True
