"""How quickly silence becomes a verdict."""
from __future__ import annotations

import os
from dataclasses import dataclass


def _env_float(environ, name: str, default: float) -> float:
    v = environ.get(name)
    return float(v) if v not in (None, "") else default


@dataclass(frozen=True)
class LivenessOptions:
    """``peer_timeout``: seconds without a heartbeat before a rank is declared silent
    (``RINGLET_PEER_TIMEOUT``, default 20; 0 turns the monitor off). ``interval``: seconds between
    heartbeats (``RINGLET_HEARTBEAT_INTERVAL``, default 1). ``watch``: how many ranks after its own each
    rank watches (every silent rank is watched by the live ones before it). ``grace``: seconds a
    transport error waits for the verdict that names its cause (a death record from the launcher)."""

    peer_timeout: float = 20.0
    interval: float = 1.0
    watch: int = 16
    grace: float = 3.0

    def __post_init__(self):
        if self.peer_timeout < 0 or self.interval <= 0 or self.watch < 1 or self.grace < 0:
            raise ValueError(f"Bad liveness options {self}: timeouts must be >= 0, interval > 0, watch >= 1.")
        if self.peer_timeout and self.peer_timeout < 2 * self.interval:
            raise ValueError(f"RINGLET_PEER_TIMEOUT ({self.peer_timeout}s) must be at least two heartbeat "
                             f"intervals ({self.interval}s).")

    @property
    def enabled(self) -> bool:
        return self.peer_timeout > 0

    @classmethod
    def from_env(cls, environ=None) -> "LivenessOptions":
        env = os.environ if environ is None else environ
        return cls(peer_timeout=_env_float(env, "RINGLET_PEER_TIMEOUT", 20.0),
                   interval=_env_float(env, "RINGLET_HEARTBEAT_INTERVAL", 1.0))
