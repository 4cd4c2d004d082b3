"""The job's store: ringlet's authenticated store, hosted by node 0's launcher, listening only where
the hosts reach it.

``ringlet run`` gives torch's elastic agent its own rendezvous backend, :data:`BACKEND`: a static
rendezvous (node rank = host entry index) whose node 0 hosts a :class:`ringlet.store.StoreServer` on
``bind_addr`` (a rendezvous config entry): 127.0.0.1 for a single-host job, the address the hosts reach
node 0 at for a multi-host one (see :func:`ringlet.launch.hosts.store_bind_address`). Every agent and
every rank connects with the job's secret (``RINGLET_JOB_SECRET``); other connections are refused and
logged once with their address.
"""
from __future__ import annotations

import datetime

from torch.distributed import PrefixStore
from torch.distributed.elastic.rendezvous import (RendezvousHandler, RendezvousInfo, RendezvousParameters,
                                                  RendezvousStoreInfo, rendezvous_handler_registry)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from ..security.secret import job_secret
from ..store import StoreServer
from ..store.torch_store import connect

BACKEND = "ringlet-static"
_registered = False
# (address, port) of the job's store once this process's rendezvous has made or found it.
endpoint: tuple[str, int] | None = None
# The store this process hosts (node 0), kept here so that it outlives torch's agent: after a failure
# the launcher holds it a moment longer, for the survivors to read why (see launch.agent).
hosted: StoreServer | None = None


def serve_store(addr: str, port: int = 0) -> StoreServer:
    """The job's store listening on ``addr:port`` only (``addr`` ``""``: every interface; ``port`` 0:
    the OS picks, see ``.port``), for clients that hold this process's job secret."""
    secret = job_secret()
    if secret is None:
        raise RuntimeError("The job's store needs the job's secret (RINGLET_JOB_SECRET); ringlet run sets it.")
    return StoreServer(addr, port, secret)


class BoundStaticRendezvous(RendezvousHandler):
    """A static rendezvous over the job's authenticated store; node 0 hosts it on ``bind_addr`` (port 0:
    the OS picks one, and the workers learn it from the rendezvous)."""

    def __init__(self, master_addr: str, master_port: int, rank: int, world_size: int, run_id: str,
                 timeout: int, bind_addr: str):
        self.master_addr, self.master_port = master_addr, master_port
        self.rank, self.world_size, self.run_id = rank, world_size, run_id
        self.timeout = datetime.timedelta(seconds=timeout)
        self.bind_addr = bind_addr
        self._store = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        global endpoint, hosted
        if self._store is None:
            if self.rank == 0:
                hosted = serve_store(self.bind_addr, self.master_port)
                self.master_port = hosted.port
            self._store = connect(self.master_addr, self.master_port, timeout=self.timeout.total_seconds(),
                                  connect_timeout=self.timeout.total_seconds())
        endpoint = (self.master_addr, int(self.master_port))
        return RendezvousInfo(PrefixStore(self.run_id, self._store), self.rank, self.world_size,
                              RendezvousStoreInfo(self.master_addr, self.master_port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


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
