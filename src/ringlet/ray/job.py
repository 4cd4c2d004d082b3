"""The job the executor's workers form: their ranks, their environment, and the store they meet at.

The driver (the process that owns the :class:`~ringlet.ray.RayExecutor`) hosts the job's store: ringlet's
authenticated :class:`~ringlet.store.StoreServer`, on the address Ray knows the driver's node by, for
clients that hold the job's secret. The workers' rendezvous, their Gloo pairs' challenge and their
liveness heartbeats go through it, as under ``ringlet run``. Hosting it in the driver keeps it alive when
any worker dies, so that the survivors can read who did.
"""
from __future__ import annotations

import time
import uuid

from ..layout import layout_env, layout_from_hosts
from ..liveness import keys as K
from ..liveness.verdict import Verdict
from ..security.secret import SECRET_ENV, new_secret
from ..store import StoreServer


def rank_order(infos: list[dict]) -> tuple[list[int], list[tuple[str, int]]]:
    """The actors (indices into ``infos``, each an actor's :meth:`RingletWorker.describe`) in rank order,
    and the hosts as ``(node address, ranks there)``: ranks of one node are consecutive, nodes in the
    order their first actor was made, so that rank 0 is the first actor."""
    nodes: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        nodes.setdefault(info["node_id"], []).append(i)
    order = [i for group in nodes.values() for i in group]
    labels: dict[str, str] = {}
    for node_id, group in nodes.items():
        ip = infos[group[0]]["ip"]
        # Two Ray nodes behind one address (several raylets on a machine) still count as two hosts.
        labels[node_id] = ip if ip not in labels.values() else f"{ip}#{len(labels)}"
    return order, [(labels[n], len(g)) for n, g in nodes.items()]


class JobStore:
    """The job's store, served by this process on ``address`` (port chosen by the OS), and the job's
    identity: its secret and its run id (the prefix of its liveness records)."""

    def __init__(self, address: str):
        self.secret = new_secret()
        self.run_id = f"ray-{uuid.uuid4().hex[:12]}"
        self.server = StoreServer(address, 0, bytes.fromhex(self.secret))
        self.address, self.port = address, self.server.port

    def env(self, rank: int, hosts: list[tuple[str, int]]) -> dict[str, str]:
        """The environment of ``rank``: torchrun's variables (the store as ``MASTER_ADDR:MASTER_PORT``,
        an agent store as torchrun's agent gives), ringlet's and Horovod's layout variables, the secret."""
        size = sum(n for _, n in hosts)
        lay = layout_from_hosts(rank, size, hosts)
        env = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(lay.local_rank),
               "LOCAL_WORLD_SIZE": str(lay.local_size), "GROUP_RANK": str(lay.cross_rank),
               "GROUP_WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": self.address, "MASTER_PORT": str(self.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": self.run_id,
               "TORCHELASTIC_RESTART_COUNT": "0", "RINGLET_TRANSPORT": "torch",
               "RINGLET_RUN_HOSTS": ",".join(f"{h}:{n}" for h, n in hosts), SECRET_ENV: self.secret}
        env.update(layout_env(lay, {}))
        return env

    def record_failure(self, rank: int, host: str, reason: str) -> None:
        """Publish ``rank``'s failure as a death record (as ``ringlet run``'s node agents do): every
        survivor's liveness monitor reads it within a heartbeat and stops its collectives with a
        ``PeerError`` naming the rank."""
        from ..store.torch_store import connect

        store = connect(self.address, self.port, timeout=10.0, connect_timeout=10.0,
                        environ={SECRET_ENV: self.secret})
        job = f"{K.ROOT}/{self.run_id}/0"
        store.set(K.of_rank(job, K.DEAD, rank), Verdict(rank, host, reason, time.time(), "dead").encode())
        store.append(K.dead_list(job), f"{rank},")

    def close(self) -> None:
        self.server.close()
