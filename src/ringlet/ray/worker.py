"""One worker of a :class:`~ringlet.ray.RayExecutor`: a Ray actor that holds one rank's environment.

The class is plain Python; the executor turns it into an actor with the resources it asks for. Every
method runs in the actor's process (sequentially: one call at a time, as Ray runs a plain actor).
"""
from __future__ import annotations

import os
import socket


class RingletWorker:
    """A rank's process. ``execute(fn)`` calls ``fn(self)``; ``run(fn, args, kwargs)`` calls ``fn(*args,
    **kwargs)``. Between :meth:`RayExecutor.start` and the first call the executor sets the rank's
    environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... see docs/ray.md) with :meth:`update_env`, so
    that ``ringlet.init()`` / ``hvd.init()`` in ``fn`` joins the job."""

    def __init__(self) -> None:
        self.rank: int | None = None

    def describe(self) -> dict:
        """Where this actor runs: its node's address and id, its host name, pid, and the GPUs Ray gave it."""
        import ray

        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname(), "pid": os.getpid(), "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def update_env(self, env: dict[str, str]) -> None:
        """Add ``env`` to this process's environment (the rank's variables, the user's extra ones)."""
        os.environ.update({str(k): str(v) for k, v in env.items()})
        if "RANK" in env:
            self.rank = int(env["RANK"])

    def env_vars(self) -> dict[str, str]:
        """This process's environment."""
        return dict(os.environ)

    def execute(self, fn):
        """``fn(self)``."""
        return fn(self)

    def run(self, fn, args=None, kwargs=None):
        """``fn(*args, **kwargs)``."""
        return fn(*(args or ()), **(kwargs or {}))
