"""What the elastic driver and its workers say to each other through the driver's TCPStore.

A *generation* is one fixed membership: an ordered list of worker ids (index = rank). The driver
publishes ``gen/<g>`` (the record) and then ``gen`` (its number); workers only ever move forward.

Keys (all small strings):

``gen``                    number of the current generation
``gen/<g>``                JSON record ``{"generation", "workers", "hosts"}`` of generation ``g``
``gen/<g>/arrived``        counter: members of ``g`` that reached its barrier
``gen/<g>/arrived/<id>``   marker per member (the driver names the ones that never arrive)
``req/<id>``               a worker asks for a generation newer than the value (``-1``: never joined)
``updates/<g>``            set while workers wait to join after ``g``: members raise
                           ``HostsUpdatedInterrupt`` at their next ``state.commit()``
``abort``                  the job is stopping (reason as value): waiting workers give up at once
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..layout import Layout

GEN = "gen"
ABORT = "abort"

# Environment the driver gives every worker.
ENV_FLAG = "RINGLET_ELASTIC"
ENV_ADDR = "RINGLET_ELASTIC_ADDR"
ENV_PORT = "RINGLET_ELASTIC_PORT"
ENV_ID = "RINGLET_ELASTIC_ID"
ENV_TIMEOUT = "RINGLET_ELASTIC_TIMEOUT"


def gen_key(g: int) -> str:
    return f"gen/{g}"


def arrived_key(g: int) -> str:
    return f"gen/{g}/arrived"


def arrived_marker(g: int, wid: str) -> str:
    return f"gen/{g}/arrived/{wid}"


def request_key(wid: str) -> str:
    return f"req/{wid}"


def updates_key(g: int) -> str:
    return f"updates/{g}"


@dataclass(frozen=True)
class Record:
    """One generation: ``workers[i]`` has rank ``i``; ``hosts[i]`` is its host name."""

    generation: int
    workers: tuple[str, ...]
    hosts: tuple[str, ...]

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "workers": list(self.workers),
                           "hosts": list(self.hosts)}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        d = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
        return cls(int(d["generation"]), tuple(d["workers"]), tuple(d["hosts"]))


@dataclass(frozen=True)
class Assignment(Layout):
    """A worker's place (:class:`~ringlet.layout.Layout`: Horovod's definitions of local and cross
    ranks) in one generation."""

    generation: int = 0


def assignment(rec: Record, wid: str) -> Assignment:
    """``wid``'s ranks in ``rec``: local ranks count members of the same host in rank order; the cross
    rank counts the hosts before this one (first-appearance order) that have a member with the same
    local rank. ``ValueError`` when ``wid`` is not a member."""
    if wid not in rec.workers:
        raise ValueError(f"worker {wid} is not a member of generation {rec.generation}")
    rank = rec.workers.index(wid)
    host = rec.hosts[rank]
    local = [r for r, h in enumerate(rec.hosts) if h == host]
    lr = local.index(rank)
    host_order: list[str] = []
    for h in rec.hosts:
        if h not in host_order:
            host_order.append(h)
    with_lr = [h for h in host_order if sum(1 for x in rec.hosts if x == h) > lr]
    return Assignment(rank, len(rec.workers), lr, len(local), with_lr.index(host), len(with_lr), host,
                      generation=rec.generation)
