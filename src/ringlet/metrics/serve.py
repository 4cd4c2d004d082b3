"""A rank's metrics endpoint: started by ``ringlet.init`` when the environment asks for one.

* ``RINGLET_METRICS_PORT=P``: the rank serves ``/metrics`` on port ``P`` + its local rank (its index among
  the ranks of its host), on ``RINGLET_METRICS_ADDR`` (default ``0.0.0.0``). ``ringlet run --metrics-port P
  --metrics-per-rank`` sets it; so can a job started by torchrun or mpiexec.
* ``RINGLET_METRICS_DIR=D`` (set by ``ringlet run --metrics-port P``'s agent on each host): the rank serves
  on 127.0.0.1 at a port the OS picks and writes it to ``D/rank-<R>.port``; the agent's endpoint
  (:mod:`.host`) merges its ranks' metrics.

The endpoint lives as long as the process (a daemon thread); a later ``ringlet.init`` session is served by
the same endpoint, its counters continuing. A port that cannot be bound raises ``OSError`` naming it.
"""
from __future__ import annotations

import os
import tempfile
from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server

from .collector import RankCollector

__all__ = ["PORT_ENV", "ADDR_ENV", "DIR_ENV", "RankEndpoint", "start", "port_from_env", "endpoint"]

PORT_ENV = "RINGLET_METRICS_PORT"
ADDR_ENV = "RINGLET_METRICS_ADDR"
DIR_ENV = "RINGLET_METRICS_DIR"

_ENDPOINT: "RankEndpoint | None" = None


def port_from_env(environ=os.environ) -> int | None:
    """``RINGLET_METRICS_PORT`` as a port (None when unset); ``ValueError`` when it is not one."""
    raw = environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{PORT_ENV}={raw!r}: expected a TCP port number") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{PORT_ENV}={raw!r}: expected a TCP port number (1-65535)")
    return port


class RankEndpoint:
    """An HTTP endpoint serving one :class:`RankCollector` on ``addr``:``port`` (0: the OS picks; see
    :attr:`port`)."""

    def __init__(self, get_runtime: Callable[[], object], port: int, addr: str = "0.0.0.0", clock=None) -> None:
        self.collector = RankCollector(get_runtime, clock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"ringlet metrics: cannot serve on {addr}:{port}: {exc.strerror or exc}") from exc
        self.addr = addr
        self.port = self._server.server_port
        self.port_file: str | None = None

    def advertise(self, folder: str, rank: int) -> str:
        """Write this endpoint's port to ``folder/rank-<rank>.port`` (atomically; the previous file of
        this endpoint, under another rank, is removed); return the path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank-{rank}.port")
        fd, tmp = tempfile.mkstemp(prefix=".rank-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{self.port}\n")
        os.replace(tmp, path)
        if self.port_file is not None and self.port_file != path and os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.port_file = path
        return path

    def close(self) -> None:
        """Stop serving and withdraw the port file."""
        self._server.shutdown()
        self._server.server_close()
        if self.port_file is not None and os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.port_file = None


def start(rt, get_runtime: Callable[[], object], environ=os.environ) -> "RankEndpoint | None":
    """The process's endpoint for runtime ``rt`` as the environment asks (see the module doc), or None
    when it asks for none. Started once per process; later calls re-advertise under ``rt``'s rank.
    ``ValueError`` for a bad variable, or when the flight recorder the metrics come from is off."""
    global _ENDPOINT
    port, folder = port_from_env(environ), environ.get(DIR_ENV, "").strip()
    if port is None and not folder:
        return None
    if port is not None and folder:
        raise ValueError(f"{PORT_ENV} (a port per rank) and {DIR_ENV} (the host's agent serves) are both set: "
                         "choose one")
    if not rt.recorder.enabled:
        raise ValueError(f"{PORT_ENV}/{DIR_ENV}: the metrics are folded from the flight recorder, which "
                         "RINGLET_FLIGHT_RECORDER=0 turns off; leave it on (the default) to serve metrics")
    if _ENDPOINT is None:
        if port is not None:
            _ENDPOINT = RankEndpoint(get_runtime, port + rt.local_rank(), environ.get(ADDR_ENV, "0.0.0.0"))
        else:
            _ENDPOINT = RankEndpoint(get_runtime, 0, "127.0.0.1")
    if folder:
        _ENDPOINT.advertise(folder, rt.rank)
    return _ENDPOINT


def endpoint() -> "RankEndpoint | None":
    """The process's endpoint, if one was started."""
    return _ENDPOINT
