"""The job store as a ``torch.distributed.Store``, and the store of the job this process is in."""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from ..security.secret import job_secret
from .client import StoreClient, StoreTimeout


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


_alive: list = []


class RingletStore(dist.Store):
    """A :class:`~.client.StoreClient` behind torch's ``Store`` interface, so that process groups,
    ``PrefixStore`` and torch's elastic agent run on the authenticated job store. Timeouts raise
    ``torch.distributed.DistStoreError``, as torch's own stores do."""

    def __init__(self, client: StoreClient):
        super().__init__()
        self.client = client
        # torch keeps only the C++ half of a Python store; the Python half (which holds the methods)
        # must stay alive as long as any process group may call it.
        _alive.append(self)

    def _do(self, fn, *args):
        try:
            return fn(*args)
        except StoreTimeout as exc:
            raise dist.DistStoreError(str(exc)) from exc

    def set(self, key, value):
        self._do(self.client.set, key, value)

    def get(self, key):
        return self._do(self.client.get, key)

    def add(self, key, value):
        return self._do(self.client.add, key, value)

    def append(self, key, value):
        self._do(self.client.append, key, value)

    def compare_set(self, key, expected, desired):
        return self._do(self.client.compare_set, key, expected, desired)

    def check(self, keys):
        return self._do(self.client.check, keys)

    def wait(self, keys, timeout=None):
        self._do(self.client.wait, keys, _seconds(timeout))

    def delete_key(self, key):
        return self._do(self.client.delete_key, key)

    def num_keys(self):
        return self._do(self.client.num_keys)

    def multi_get(self, keys):
        return self._do(self.client.multi_get, keys)

    def multi_set(self, keys, values):
        self._do(self.client.multi_set, keys, values)

    def set_timeout(self, timeout):
        self.client.timeout = _seconds(timeout)

    def clone(self):
        return RingletStore(self.client.clone())

    def has_extended_api(self):
        return False


def connect(addr: str, port: int, *, timeout: float = 300.0, connect_timeout: float = 60.0, environ=None):
    """A client of the store at ``addr:port`` as a torch ``Store``: ringlet's authenticated store when
    the job has a secret (``ringlet run``), else torch's ``TCPStore`` (torchrun and other launchers)."""
    secret = job_secret(environ)
    if secret is None:
        return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout))
    return RingletStore(StoreClient(addr, int(port), secret, timeout=timeout, connect_timeout=connect_timeout))


AGENT_STORE_ENV = "RINGLET_AGENT_STORE"  # "ringlet": the agent store is ringlet's (``ringlet run`` sets it)


def agent_store_authenticated(environ=None) -> bool:
    """Whether the store ``TORCHELASTIC_USE_AGENT_STORE`` announces is ringlet's authenticated one.

    It is when the job has a secret, unless torch's elastic agent started this process for another
    launcher than ``ringlet run``: torchrun's agent (which names every worker's role in ``ROLE_NAME``;
    ``ringlet run`` adds :data:`AGENT_STORE_ENV`) hosts torch's ``TCPStore``, which speaks no handshake,
    even when ``RINGLET_JOB_SECRET`` is set for the Gloo pairs (a Kubernetes Secret under torchrun,
    docs/kubernetes.md). Stores that ringlet hosts for processes no agent started (``srun``, Ray actors)
    are ringlet's."""
    env = os.environ if environ is None else environ
    if job_secret(env) is None:
        return False
    return env.get(AGENT_STORE_ENV, "") == "ringlet" or "ROLE_NAME" not in env


def connect_agent_store(addr: str, port: int, *, timeout: float = 300.0, connect_timeout: float = 60.0,
                        environ=None):
    """A client of the launcher's agent store at ``addr:port``: ringlet's or torch's, as
    :func:`agent_store_authenticated` decides."""
    if agent_store_authenticated(environ):
        return connect(addr, port, timeout=timeout, connect_timeout=connect_timeout, environ=environ)
    return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout))


def job_store(timeout: float = 300.0, environ=None):
    """A new client of the store of the launcher this process runs under (``MASTER_ADDR``/
    ``MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE``), or None when there is none."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "") != "True":
        return None
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        return None
    return connect_agent_store(addr, int(port), timeout=timeout, environ=env)
