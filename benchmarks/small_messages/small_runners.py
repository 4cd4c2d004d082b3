"""Callables that time pieces of ringlet's small-message all-reduce, for small_messages.py and
small_profile.py (benchmarks only).

``small``: the public path, ``ringlet.allreduce_(t)`` (on shm's world group the mailbox round with the
check in band); ``small-raw``: the rounds alone with a record built once (the engine's own cost), on
the transport's one small-message path (``mailbox`` or ``p2p``: recursive doubling with the records in
band)."""
from __future__ import annotations

import torch

import ringlet
from ringlet.engine import small
from ringlet.engine.channel import Channel
from ringlet.engine.meta import Kind, Meta
from ringlet.types import reduction


def carrier(rt, nbytes: int) -> str | None:
    """The transport's small-message path for this size (or None)."""
    probe = Channel(rt.transport, rt.world, rt.world.rank_of(rt.rank), 0)
    return small.carrier(probe) if small.takes(probe, nbytes) else None


def runner(name: str, rt, t: torch.Tensor):
    if not name.startswith("small-raw"):
        return lambda: ringlet.allreduce_(t)
    flat, meta, red = t.view(-1), Meta.of("", Kind.ALLREDUCE, t, op=1), reduction("sum")
    return lambda: small.allreduce_(rt.channel(rt.world), flat, red, meta)
