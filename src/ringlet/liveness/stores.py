"""Which store the monitor talks to: the launcher's agent store, when the job has one."""
from __future__ import annotations

import datetime
import os

from .options import LivenessOptions


def _address(env) -> tuple[str | None, str | None, bool]:
    """(address, port, whether it is a torch elastic agent's store) of the store to talk to."""
    from ..elastic import protocol as P

    if env.get(P.ENV_FLAG, "").strip() not in ("", "0"):  # ringlet run --elastic: the driver's store
        return env.get(P.ENV_ADDR), env.get(P.ENV_PORT), False
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "") != "True":
        return None, None, False
    return env.get("MASTER_ADDR"), env.get("MASTER_PORT"), True


def session_of(counter: int) -> int:
    """The session number of this ``ringlet.init``: the elastic generation under ``ringlet run
    --elastic`` (members that joined at different times agree on it), else the count of earlier inits."""
    from ..elastic import rendezvous

    if rendezvous.enabled() and rendezvous.current() is not None:
        return rendezvous.current().generation
    return counter


def connector(opts: LivenessOptions, environ=None):
    """A function that opens a new client of the job's agent store (torchrun and ``ringlet run`` host
    one and tell their workers with ``TORCHELASTIC_USE_AGENT_STORE``; ``ringlet run --elastic``'s
    driver hosts one too), or None when there is none. The
    client's timeout is the peer timeout, so a store that stops answering is noticed in time."""
    env = os.environ if environ is None else environ
    addr, port, agent = _address(env)
    if not addr or not port:
        return None
    timeout = datetime.timedelta(seconds=max(opts.peer_timeout, 2.0))

    def connect():
        from ..store.torch_store import connect as open_store, connect_agent_store

        # the elastic driver's store is always ringlet's; an agent store may be torchrun's (no handshake)
        opener = connect_agent_store if agent else open_store
        return opener(addr, int(port), timeout=timeout.total_seconds(), connect_timeout=timeout.total_seconds(),
                      environ=env)

    return connect
